"""Fidelity tier: the relay in real time holds each hop to its configured delay, and the check catches a 2% slip.

The budget is measured in the same run, not guessed: three hops of the same delay pay the same floor (the
relay's hold plus the path), so each hop's fastest lap is held to the median of the three hops' fastest laps,
within HOP_SPREAD_BUDGET_MS; and the ring's shared overhead (the hops' median p50 less the delay) to the fidelity
budget (tests/ringutil). A planted regression (one link's relay adds 2% to its delay, the scenario still saying
50 ms) must fail the same check: the test runs both and asserts that the check passes on the first and fails on
the second, naming the hop.

Why the fastest lap and not the median: a wake-up late on a shared 2-core box only ever adds to a hop, and on a
busy box it adds to most laps of whichever hop's receiver loses the race for a core. CI once measured hop 2->0's
median 0.93 ms above the others' (50.26 ms) with nothing wrong with the relay; here, with two CPU hogs on the
two cores, the hops' medians spread by 1.1 ms and their fastest laps by 0.05 ms (50.157-50.202 ms). A relay that
holds a frame 1 ms too long moves every lap of its hop, the fastest included.
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import trio

from netem.userspace import UserspaceShaper
from testbed.core.summary import RunSummary
from testbed.launch.launcher import Launcher, new_run_id
from testbed.launch.runlog import RunLog
from tests.ringutil import REAL_HOP_OVERHEAD_BUDGET_MS, ring_scenario

pytestmark = pytest.mark.fidelity

HOP_MS = 50.0
PLANTED = 1.02  # the regression: one link 2% slower than configured (1 ms of 50)
HOP_SPREAD_BUDGET_MS = 0.5  # hops of one run, one delay: their fastest laps agree within this (seen: <= 0.05 ms)
TOKENS = 24


def fastest_laps_ms(log: RunLog) -> list[float]:
    """Each hop's fastest decode lap, ms."""
    laps = [lap.hop_latencies_s() for lap in log.laps if lap.kind == "decode"]
    return [min(hops) * 1e3 for hops in zip(*laps)]


def hop_failures(summary: RunSummary, fastest_ms: list[float]) -> list[str]:
    """What is wrong with the run's hops: a hop's fastest lap off the ring's median of them by more than the
    spread budget, or a shared overhead beyond the fidelity budget."""
    floor = statistics.median(fastest_ms)
    out = [f"hop {hop.hop}: fastest lap {ms:.3f} ms, the ring's median fastest {floor:.3f} ms"
           for hop, ms in zip(summary.per_hop, fastest_ms) if abs(ms - floor) > HOP_SPREAD_BUDGET_MS]
    shared = statistics.median(hop.measured_ms_p50 for hop in summary.per_hop)
    if not 0 <= shared - HOP_MS <= REAL_HOP_OVERHEAD_BUDGET_MS:
        out.append(f"the hops' shared overhead {shared - HOP_MS:.3f} ms is outside 0..{REAL_HOP_OVERHEAD_BUDGET_MS} ms")
    return out


def run_relay(scenario, planted: float = 1.0) -> tuple[RunSummary, list[float]]:
    """The run's summary and each hop's fastest lap (ms), with link 0->1's delay scaled by `planted`."""
    links = [dataclasses.replace(link, delay_ms=link.delay_ms * planted) if (link.src, link.dst) == (0, 1) else link
             for link in scenario.links]
    shaper = UserspaceShaper(links, scenario.n_agents, new_run_id())
    log = RunLog(scenario)
    launcher = Launcher(scenario, shaper, log, log=lambda m: None)

    async def main() -> RunSummary:
        with trio.fail_after(120):
            return await launcher.run()

    summary = trio.run(main)
    return summary, fastest_laps_ms(log)


def test_the_relay_holds_every_hop_and_the_check_catches_a_planted_two_percent():
    scenario = ring_scenario([HOP_MS] * 3, compute_ms=5.0, tokens=TOKENS)
    (clean, clean_fastest), (planted, planted_fastest) = run_relay(scenario), run_relay(scenario, PLANTED)
    assert hop_failures(clean, clean_fastest) == [], (clean_fastest, clean.per_hop)
    failures = hop_failures(planted, planted_fastest)
    assert any(line.startswith("hop 0->1") for line in failures), (failures, planted_fastest, planted.per_hop)
