"""A speculation round's facts (LapRecord.facts of its "spec" laps)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts


@dataclass(frozen=True)
class SpecRound(LapFacts):
    """A speculation round at the entry (agents.modes.speculative): K drafted in `draft_s` (emulated cost; the
    draft's own forward passes took `draft_real_s`), `accepted` of them kept, and sum_i sum_x min(q_i, p_i)."""

    k: int
    accepted: int
    draft_s: float
    draft_real_s: float
    overlap_sum: float
    draft: str  # the draft model's kind: "trained" or "calibrated"
    alpha_hat: float | None = None  # the K chooser's estimate after this round
    k_auto: bool = False  # K chosen each round (decode.k = "auto", no sweep)

    def draft_time_s(self) -> float:
        return self.draft_s
