"""Helpers for tests that run rings: small time-scaled scenarios, the exact tolerance and the overhead budget.

`run` runs on the virtual backend unless told otherwise (the exact tier: simulated time, measured = predicted to
EXACT); a fidelity test passes shaper="userspace" and holds real time to the overhead budget below.
"""

from __future__ import annotations

import trio

from testbed.scenario.config import Scenario, scenario_from_dict

EXACT = 1e-6  # the exact tier's tolerance: measured against predicted on the virtual backend (netem.virtual)

# The fidelity tier's budgets (real time on the relay or netem), from `python -m testbed bench` and these tests on
# the 2-core VMs this project runs on. A process woken after sleeping through a lap pays 0.4-0.7 ms here before it runs (raw
# blocking sockets too: a 612-byte message 30 ms after the last one takes ~0.4-0.7 ms one-way, 17 us
# when 0.5 ms after it). Measured: userspace per-hop overhead p50 0.75-1.2 ms (up to 1.8 ms on a zero-delay
# link, where the relay's own wake-up is not hidden behind the delay), the entry node's framing
# and bookkeeping (lap residual) 1.0-1.6 ms per lap. The budget adds headroom for a shared, noisy box;
# every tolerance below is derived from it, never guessed per test.
REAL_HOP_OVERHEAD_BUDGET_MS = 2.0
REAL_LAP_RESIDUAL_BUDGET_MS = 2.0
# The exact tier's budgets (the virtual backend): simulated time has no overhead, so what a tolerance derived
# from these allows is the float rounding of simulated times, 1 ns per hop and per lap (~1e-8 of a lap).
HOP_OVERHEAD_BUDGET_MS = 1e-6
LAP_RESIDUAL_BUDGET_MS = 1e-6
RUN_TIMEOUT_S = 240


def ring_scenario(hops_ms: list[float], *, compute_ms: float = 10.0, tokens: int = 40, **decode) -> Scenario:
    n = len(hops_ms)
    raw = {"name": f"ring-{'-'.join(f'{h:g}' for h in hops_ms)}",
           "stages": [{"name": f"s{i}", "compute_ms": compute_ms} for i in range(n)],
           "network": {"hops_ms": hops_ms}, "decode": {"tokens": tokens, **decode}}
    return scenario_from_dict(raw, "<test>")


def rate_tolerance(n_hops: int, lap_s: float, dilation: float = 1.0, *, real: bool = False) -> float:
    """Relative tolerance of measured vs 1/(C + T_ring): the overhead budget over the lap it rides on (the exact
    tier's, or with real=True the fidelity tier's).

    Under time dilation D the overhead is the box's, the lap the scenario's: the budget shrinks by D.
    """
    hop, lap = (REAL_HOP_OVERHEAD_BUDGET_MS, REAL_LAP_RESIDUAL_BUDGET_MS) if real else (HOP_OVERHEAD_BUDGET_MS,
                                                                                      LAP_RESIDUAL_BUDGET_MS)
    return (n_hops * hop + lap) / (lap_s * 1e3 * dilation)


def run(scenario: Scenario, shaper: str = "virtual", dilation: float = 1.0, runlog=None):
    """One run's summary; `runlog` (a testbed.launch.runlog.RunLog) keeps its laps for the caller."""
    from testbed.launch.launcher import run_scenario

    async def main():
        with trio.fail_after(RUN_TIMEOUT_S):
            return await run_scenario(scenario, shaper, log=lambda m: None, dilation=dilation, runlog=runlog)

    return trio.run(main)
