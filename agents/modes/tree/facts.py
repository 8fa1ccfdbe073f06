"""A tree speculation round's facts (LapRecord.facts of its "tree" laps)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts


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
