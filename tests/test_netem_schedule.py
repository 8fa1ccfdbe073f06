"""A moving network on the kernel backend (issue 15): `tc qdisc change` live, a partition, the lap timeout.

Runs where netem runs (root + sch_netem; in CI inside user-mode-linux). One ring: 0->1 goes from 5 to 40 ms at
3 s, 1->0 is down for 0.5 s at 6 s (netem loss 100%: the kernel's TCP retransmits once it is back), and down for
good at 9 s, which the 3 s lap timeout turns into an error naming the link. UML's agents take ~40 s to start.
"""

import pytest
import trio

from testbed.scenario.config import scenario_from_dict
from testbed.core.errors import AgentFailed, leaf_errors
from testbed.launch.launcher import run_scenario
from testbed.launch.runlog import RunLog

pytestmark = pytest.mark.netem


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
        with trio.fail_after(60):
            return await run_scenario(sc, "netem", runlog=log, log=lambda m: None)

    with pytest.raises(BaseException) as info:
        trio.run(main)
    failures = [e for e in leaf_errors(info.value) if isinstance(e, AgentFailed)]
    assert failures and "link 1->0 is down by the schedule" in str(failures[0]), info.value
    origin = log.schedule_origin
    laps = [lap for lap in log.laps if lap.kind == "decode"]
    # when each change took effect: the kernel took it between the request (sent_s) and its acknowledgement
    # (landed_s); inside UML, whose one vCPU the agents' compute keeps busy, that round trip takes up to a second
    # or two; on a real kernel, milliseconds
    changes = {c.what: c for c in log.schedule_changes}
    delay, down, up = changes["0->1 delay_ms 40"], changes["1->0 down for 0.5 s"], changes["1->0 back up"]
    assert delay.due_s == 3.0 and down.due_s == 6.0 and delay.landed_s - 3.0 < 2.5, log.schedule_changes
    assert up.due_s == round(down.landed_s + 0.5, 6), log.schedule_changes  # down for 0.5 s once down
    before = [lap.hop_latencies_s()[0] for lap in laps if lap.end < origin + 2.9]
    after = [lap.hop_latencies_s()[0] for lap in laps if origin + delay.landed_s + 0.1 < lap.start < origin + 5.8]
    # tc's change took: 5 ms, then 40 ms. netem is never early, so every hop after is >= 40 ms; before it, a hop
    # may be late by a stall of the guest's one vCPU (once 20 ms, with the host's two cores busy): 9 in 10 are not
    assert before and after and sorted(before)[len(before) * 9 // 10] < 0.020 and min(after) > 0.039, (before, after)
    # the partition held from somewhere in [down.sent_s, down.landed_s] to somewhere in [up.sent_s, up.landed_s]
    held = [lap.duration_s for lap in laps if origin + down.sent_s - 0.2 < lap.start < origin + up.landed_s]
    assert held and max(held) > 0.2, (held, log.schedule_changes)  # a lap waited for it and TCP's retransmission
    assert [lap for lap in laps if lap.start > origin + up.landed_s + 0.5]  # and the run went on after it
