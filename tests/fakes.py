"""Synthetic lap records with known timings, as an entry agent would report them (no model, no sockets)."""

from __future__ import annotations

from typing import Final

from agents.modes.speculative.facts import SpecRound
from testbed.core.records import HeadTiming, LapRecord, Stamp
from testbed.scenario.config import scenario_from_dict

STAGES: Final = ["hong-kong", "dublin", "new-york"]
HOPS: Final = ["0->1", "1->2", "2->0"]
HOP_DELAYS_S: Final = (0.004, 0.005, 0.006)
STAGE_COMPUTE_S: Final = 0.010 / 3
HOP_OVERHEAD_S: Final = 0.0002
SPEC_K: Final = 4
SPEC_ACCEPTED: Final = 2
SPEC_DRAFT_S: Final = 0.004


def fake_scenario(mode: str):
    return scenario_from_dict({"name": f"fed-{mode}", "decode": {"mode": mode},
                               "stages": [{"name": name, "compute_ms": STAGE_COMPUTE_S * 1e3} for name in STAGES],
                               "network": {"hops_ms": [d * 1e3 for d in HOP_DELAYS_S]}}, "<test>")


def fake_lap(lap: int, start: float, *, spec: bool) -> LapRecord:
    """A lap as an entry agent would report it: each stage computes STAGE_COMPUTE_S, each hop takes its delay."""
    t, stamps = start + (SPEC_DRAFT_S if spec else 0.0), []
    for i, delay in enumerate(HOP_DELAYS_S):
        recv = t
        t += STAGE_COMPUTE_S if i else 0.0
        stamps.append(Stamp(i, recv, recv, recv + 0.0003, t, t, 560))
        t += delay + HOP_OVERHEAD_S
    end = t + STAGE_COMPUTE_S
    head = HeadTiming(t, t + 0.0003, end)
    if spec:
        return LapRecord(lap, "spec", "speculative", SPEC_K + 1, SPEC_ACCEPTED + 1, start, end, tuple(stamps), t, head,
                         facts=SpecRound(SPEC_K, SPEC_ACCEPTED, SPEC_DRAFT_S, SPEC_DRAFT_S, 2.4, "trained"))
    return LapRecord(lap, "decode", "plain", 1, 1, start, end, tuple(stamps), t, head, ids=(65,))


