"""Speculation's typed facts: a round's (LapRecord.facts of its "spec" laps) and the run's (its RunSummary part)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


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


@dataclass(frozen=True)
class SpecRates(JsonRecord):
    """Measured and predicted figures of a set of speculation rounds (a whole run, or those at one K)."""

    rounds: int
    gamma_measured: float
    gamma_predicted: float  # Gamma(alpha_hat, K), averaged over the rounds' K
    draft_s: float  # per round
    draft_per_token_s: float
    verify_compute_s: float
    round_s: float
    measured_tok_s: float
    predicted_tok_s: float  # Gamma_measured / (K c_d + C + T_ring)
    predicted_tok_s_from_alpha: float  # Gamma(alpha_hat, K) / (K c_d + C + T_ring)


@dataclass(frozen=True, kw_only=True)  # keyword-only: a missing field is an error, never a silent default
class PerKRow(SpecRates):
    k: int
    formula_tok_s: float  # Gamma(alpha_hat, K) / (K c_d + C + T_ring) with the run's c_d and C


@dataclass(frozen=True, kw_only=True)
class SpecSummary(SpecRates):
    k: float  # the K of every round, or their mean when K varied (auto, sweep)
    k_last: int
    k_auto: bool
    draft: str
    drafted: int
    accepted: int
    alpha: float  # estimated: mean of sum_x min(p, q) over drafted positions
    alpha_dialled: float | None  # the calibrated draft's setting
    acceptance_per_position: tuple[float, ...]
    k_star: int  # argmax of Gamma(alpha_hat, K) / (K c_d + C + T_ring) over 1..max(k_max, largest K run)
    k_star_tok_s: float
    # the same from the measured survival curve (acceptance_per_position), which holds for correlated rejections
    k_star_survival: int | None = None
    k_star_survival_tok_s: float | None = None
    plain_predicted_tok_s: float  # 1 / (C + T_ring) with C = verify_compute_s
    per_k: tuple[PerKRow, ...] | None = None  # a K sweep
    k_star_measured: int | None = None
    k_star_predicted: int | None = None
