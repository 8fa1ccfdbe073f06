"""Helpers for tests that run real rings: small time-scaled scenarios and the overhead budget."""

from __future__ import annotations

import trio

from testbed.config import Scenario, scenario_from_dict

# Testbed overhead budget, from `python -m testbed bench` on these 2-core machines (userspace relay:
# per-hop overhead p50 ~0.1-0.2 ms; the entry node's own framing per lap ~0.1 ms). The budget leaves
# room for a noisy shared box; tolerances below are derived from it, never guessed per test.
HOP_OVERHEAD_BUDGET_MS = 0.25
LAP_RESIDUAL_BUDGET_MS = 0.25
RUN_TIMEOUT_S = 240


def ring_scenario(hops_ms: list[float], *, compute_ms: float = 10.0, tokens: int = 40, **decode) -> Scenario:
    n = len(hops_ms)
    raw = {"name": f"ring-{'-'.join(f'{h:g}' for h in hops_ms)}",
           "stages": [{"name": f"s{i}", "compute_ms": compute_ms} for i in range(n)],
           "network": {"hops_ms": hops_ms}, "decode": {"tokens": tokens, **decode}}
    return scenario_from_dict(raw, "<test>")


def rate_tolerance(n_hops: int, lap_s: float) -> float:
    """Relative tolerance of measured vs 1/(C + T_ring): the overhead budget over the lap it rides on."""
    return (n_hops * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / (lap_s * 1e3)


def run(scenario: Scenario, shaper: str = "userspace") -> dict:
    from testbed.launcher import run_scenario

    async def main() -> dict:
        with trio.fail_after(RUN_TIMEOUT_S):
            return await run_scenario(scenario, shaper, log=lambda m: None)

    return trio.run(main)
