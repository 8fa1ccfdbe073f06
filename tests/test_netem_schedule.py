"""A moving network on the kernel backend (issue 15): `tc qdisc change` live, a partition, the lap timeout.

Runs where netem runs (root + sch_netem; in CI inside user-mode-linux). One ring: 0->1 goes from 5 to 40 ms at
3 s, 1->0 is down for 0.5 s at 6 s (netem loss 100%: the kernel's TCP retransmits once it is back), and down for
good at 9 s, which the 3 s lap timeout turns into an error naming the link. UML's agents take ~40 s to start.
"""

import pytest
import trio

from testbed.config import scenario_from_dict
from testbed.core.errors import AgentFailed, leaf_errors
from testbed.launcher import run_scenario
from testbed.runlog import RunLog

pytestmark = [pytest.mark.netem, pytest.mark.slow]


def test_netem_follows_the_schedule_and_a_partition_ends_the_run_naming_the_link():
    sc = scenario_from_dict({
        "stages": [{"name": "a", "compute_ms": 5.0}, {"name": "b", "compute_ms": 5.0}],
        "network": {"hops_ms": [5.0, 5.0], "lap_timeout_s": 3.0, "schedule": [
            {"link": "0->1", "at_s": 3.0, "delay_ms": 40.0},
            {"link": "1->0", "at_s": 6.0, "down_s": 0.5},
            {"link": "1->0", "at_s": 9.0, "down_s": 600.0}]},
        "decode": {"tokens": 100_000, "temperature": 0.0}}, "<test>")
    log = RunLog(sc)

    async def main():
        with trio.fail_after(300):
            return await run_scenario(sc, "netem", runlog=log, log=lambda m: None)

    with pytest.raises(BaseException) as info:
        trio.run(main)
    failures = [e for e in leaf_errors(info.value) if isinstance(e, AgentFailed)]
    assert failures and "link 1->0 is down by the schedule" in str(failures[0]), info.value
    origin = log.schedule_origin
    laps = [lap for lap in log.laps if lap.kind == "decode"]
    before = [lap.hop_latencies_s()[0] for lap in laps if lap.end < origin + 2.8]
    # inside UML a change lands up to ~0.5 s late (a thread, setns and netlink on one slow vCPU)
    after = [lap.hop_latencies_s()[0] for lap in laps if origin + 4.0 < lap.start < origin + 5.8]
    assert before and after and max(before) < 0.020 and min(after) > 0.039  # tc change took: 5 ms, then 40 ms
    held = [lap.duration_s for lap in laps if origin + 5.5 < lap.start < origin + 8.5]
    assert held and max(held) > 0.2  # a lap caught by the partition waited for it and TCP's retransmission
    assert [lap for lap in laps if lap.start > origin + 7.5]  # and the run went on after it
