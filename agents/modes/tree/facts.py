"""Tree speculation's typed facts: a round's (LapRecord.facts of its "tree" laps) and the run's (its RunSummary part)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class TreeRound(LapFacts):
    """A tree speculation round (agents.modes.tree): a tree of `tree_n` drafted nodes, `accepted` on the path kept."""

    tree_n: int
    accepted: int
    draft_s: float
    draft_real_s: float
    draft_steps: int
    depth: int
    policy: str

    def draft_time_s(self) -> float:
        return self.draft_s


@dataclass(frozen=True)
class TreeSummary(JsonRecord):
    """Tree speculation (agents.modes.tree): tokens per lap L(n) and the lap T_lap(n), next to physics.tree_rate."""

    policy: str
    n: float  # nodes drafted per round (mean: a depth cap can leave a tree short)
    rounds: int
    tokens_per_round: float  # L(n): accepted nodes + the one the target adds
    lap_ms: float  # a round: drafting + the verify lap
    draft_ms: float
    compute_ms: float  # the stages' forward passes over the n + 1 nodes, and the head
    ring_ms: float  # measured: every hop, serialization included
    serialization_ms: float  # predicted: each hop's bytes at its rate
    bytes_per_hop: float
    depth_mean: float
    measured_tok_s: float
    predicted_tok_s: float  # tree_rate(L measured, configured links and rates, measured compute + draft)
    error_pct: float

    @property
    def headline(self) -> tuple[float, float, float]:
        return self.measured_tok_s, self.predicted_tok_s, self.error_pct
