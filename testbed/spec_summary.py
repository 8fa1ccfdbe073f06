"""The launcher's side of speculation: a run's rounds -> SpecSummary (measured next to Gamma and r_spec)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from testbed.config import Scenario
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.core.summary import PerKRow, SpecRates, SpecSummary

ALPHA_CAP = 0.999  # K* of alpha = 1 is unbounded


def rate_figures(rounds: Sequence[LapRecord], t_ring_s: float, alpha: float) -> SpecRates:
    """Measured and predicted figures of a set of rounds (all rounds of a run, or those at one K)."""
    ks = [lap.extra["k"] for lap in rounds]
    gamma_measured = float(np.mean([lap.tokens for lap in rounds]))
    draft_s = float(np.mean([lap.extra["draft_s"] for lap in rounds]))
    compute = float(np.mean([lap.compute_s for lap in rounds]))
    gamma_predicted = float(np.mean([physics.gamma(min(alpha, 1.0), k) for k in ks]))
    return SpecRates(
        rounds=len(rounds), gamma_measured=gamma_measured, gamma_predicted=gamma_predicted,
        draft_s=draft_s, draft_per_token_s=draft_s / float(np.mean(ks)), verify_compute_s=compute,
        round_s=float(np.mean([lap.duration_s for lap in rounds])),
        measured_tok_s=sum(lap.tokens for lap in rounds) / sum(lap.duration_s for lap in rounds),
        # r_spec = Gamma / (K c_d + C + T_ring): measured Gamma, K c_d and C; configured T_ring
        predicted_tok_s=gamma_measured / (draft_s + compute + t_ring_s),
        # the same with Gamma(alpha_hat, K) in place of the measured Gamma: the formula end to end
        predicted_tok_s_from_alpha=gamma_predicted / (draft_s + compute + t_ring_s),
    )


def summarize_spec(laps: Sequence[LapRecord], scenario: Scenario) -> SpecSummary | None:
    """The JSON summary's `spec` object (DESIGN.md section 4) from the rounds seen so far."""
    rounds = [lap for lap in laps if lap.kind == "spec"]
    if not rounds:
        return None
    ks = [lap.extra["k"] for lap in rounds]
    alpha = sum(lap.extra["overlap_sum"] for lap in rounds) / sum(ks)
    accepted_per_pos = [0] * max(ks)
    drafted_per_pos = [0] * max(ks)
    for lap in rounds:
        for i in range(lap.extra["k"]):
            drafted_per_pos[i] += 1
            accepted_per_pos[i] += int(i < lap.extra["accepted"])
    t_ring = scenario.t_ring_s
    overall = rate_figures(rounds, t_ring, alpha)
    k_range = max(scenario.decode.k_max, max(ks))
    timings = (overall.draft_per_token_s, overall.verify_compute_s, t_ring)
    k_star, r_star = physics.best_k(min(alpha, ALPHA_CAP), *timings, k_range)
    survival = physics.survival_curve(drafted_per_pos, accepted_per_pos)
    k_star_survival = r_star_survival = None
    if survival:
        tail = min(physics.survival_tail(survival, alpha), ALPHA_CAP)
        k_star_survival, r_star_survival = physics.best_k_survival(survival, tail, *timings, k_range)
    last = rounds[-1].extra
    per_k = None
    k_star_measured = k_star_predicted = None
    if len(set(ks)) > 1 and not last["k_auto"]:
        rows = []
        for k in sorted(set(ks)):
            at_k = [lap for lap in rounds if lap.extra["k"] == k]
            # the curve predicted from this run's alpha_hat, c_d and C, at this K
            formula = physics.spec_rate(min(alpha, 1.0), k, overall.draft_per_token_s, overall.verify_compute_s,
                                        t_ring)
            rows.append(PerKRow(**rate_figures(at_k, t_ring, alpha).to_dict(), k=k, formula_tok_s=formula))
        per_k = tuple(rows)
        k_star_measured = max(rows, key=lambda row: row.measured_tok_s).k
        k_star_predicted = max(rows, key=lambda row: row.formula_tok_s).k
    return SpecSummary(
        **overall.to_dict(),
        k=ks[-1] if len(set(ks)) == 1 else round(float(np.mean(ks)), 2), k_last=ks[-1], k_auto=bool(last["k_auto"]),
        draft=last["draft"], drafted=sum(ks), accepted=sum(lap.extra["accepted"] for lap in rounds), alpha=alpha,
        alpha_dialled=scenario.decode.alpha if last["draft"] == "calibrated" else None,
        acceptance_per_position=tuple(a / d for a, d in zip(accepted_per_pos, drafted_per_pos)),
        k_star=k_star, k_star_tok_s=r_star, k_star_survival=k_star_survival, k_star_survival_tok_s=r_star_survival,
        plain_predicted_tok_s=physics.wall_rate(overall.verify_compute_s, t_ring),
        per_k=per_k, k_star_measured=k_star_measured, k_star_predicted=k_star_predicted,
    )
