"""A tensor-parallel token's facts (LapRecord.facts of its "decode" laps)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts


@dataclass(frozen=True)
class TpToken(LapFacts):
    """A token of tensor-parallel decoding (agents.modes.tp): compute per segment, the head, and the all-reduces' wait."""

    segment_s: float
    head_s: float
    comm_s: float
    collectives: int
    messages: int
    ranks: int
