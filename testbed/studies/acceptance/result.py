"""The acceptance study's result: the positional vector of the calibration set, and per K the tokens a round yields
on the held-out set, measured, next to the conditional (by start state), the one-vector per-position and the i.i.d.
predictions."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.records import JsonRecord


@dataclass(frozen=True)
class PositionRow(JsonRecord):
    """Draft position i of the calibration rounds (K drawn from 1..K_cal each round)."""

    i: int
    reached: int  # rounds that drafted position i with drafts 0..i-1 accepted
    acceptance: float  # a_i = P(accept draft i | drafts 0..i-1 accepted)
    se: float  # a_i's binomial standard error
    survival: float  # S_i = prod_{j<=i} a_j
    iid_survival: float  # alpha_hat^(i+1): S_i as the i.i.d. model has it
    # a_i of the rounds that start after a residual token (the round before rejected), and after a token drawn from
    # the target's p (the round before accepted all K, or the prefill); None: no such round reached position i
    after_residual: float | None = None
    reached_after_residual: int = 0
    after_target: float | None = None
    reached_after_target: int = 0


@dataclass(frozen=True)
class AcceptanceRow(JsonRecord):
    """One K: tokens a round on the held-out prompts, measured, and as each model predicts it from the calibration.
    Each error's standard error combines the prediction's and the measurement's (independent prompt sets)."""

    k: int
    rounds: int  # held-out rounds at this K
    measured_gamma: float  # tokens / rounds
    measured_se: float  # jackknife over the held-out prompts
    conditional_gamma: float  # positional.StartAcceptance.gamma: a vector per start state, the start chain's mix at K
    conditional_se: float  # jackknife over the calibration prompts
    conditional_error_pct: float  # (predicted / measured - 1) x 100
    conditional_error_se: float  # in points of the error
    positional_gamma: float  # 1 + sum_{i<K} S_i of the calibration rounds' one vector
    positional_se: float
    positional_error_pct: float
    positional_error_se: float
    iid_gamma: float  # Gamma(alpha_hat, K), alpha_hat of the calibration rounds
    iid_se: float
    iid_error_pct: float
    iid_error_se: float


@dataclass(frozen=True)
class AcceptanceResult(JsonRecord):
    scenario: str
    draft: str  # "trained" or "calibrated"
    alpha: float | None  # the calibrated draft's dialled acceptance (None: the trained draft)
    temperature: float
    model: str
    k_cal: int  # calibration rounds draw their K from 1..k_cal afresh each round; held-out Gamma at K = 1..k_cal
    cap: int  # the start states' cap on the accepted count of the round before (positional.StartAcceptance)
    prompts: int  # prompts a set (calibration, held out)
    prompt_tokens: int
    tokens: int  # tokens each prompt is continued for, at every K
    seed: int
    calibration_windows: tuple[int, ...]  # window w: tokens [w P, (w + 1) P) of the shipped prompt text (disjoint)
    held_out_windows: tuple[int, ...]
    calibration_rounds: int
    alpha_hat: float  # mean sum_x min(p, q) over the calibration's drafted positions
    reached: tuple[int, ...]  # the vector's counts (agents.modes.speculative.positional.PositionalAcceptance)
    accepted: tuple[int, ...]
    positions: tuple[PositionRow, ...]
    acceptance_rows: tuple[AcceptanceRow, ...]  # the report part's key
    draft_ms: float  # c_d, C and T_ring of the K* below (the scenario's; c_d its real pass time if it sets none)
    compute_ms: float
    t_ring_ms: float
    k_star_conditional: int  # argmax over 1..K_cal of the rate with the conditional Gamma
    k_star_conditional_tok_s: float
    k_star_positional: int  # ... with the one-vector per-position Gamma
    k_star_positional_tok_s: float
    k_star_iid: int  # ... with Gamma(alpha_hat, K)
    k_star_iid_tok_s: float
    k_star_measured: int  # ... with the held-out measured Gamma
    k_star_measured_tok_s: float
    wall_s: float  # the study's own run time on this box
