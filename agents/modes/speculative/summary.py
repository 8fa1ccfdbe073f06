"""The launcher's side of speculation: a run's rounds -> SpecSummary (measured next to Gamma and r_spec)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.modes.speculative.facts import PerKRow, SpecRates, SpecRound, SpecSummary
from agents.modes.speculative.metrics import RoundTotals, SpecRounds
from agents.modes.speculative.settings import ALPHA_CAP, SpecSettings
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.scenario.config import Scenario



def rate_figures(rounds: Sequence[LapRecord], t_ring_s: float, alpha: float) -> SpecRates:
    """Measured and predicted figures of a set of rounds (all rounds of a run, or those at one K)."""
    ks = [lap.facts.k for lap in rounds]
    return _rates(len(rounds), float(np.mean([lap.tokens for lap in rounds])),
                  float(np.mean([physics.gamma(min(alpha, 1.0), k) for k in ks])),
                  float(np.mean([lap.facts.draft_s for lap in rounds])), float(np.mean(ks)),
                  float(np.mean([lap.compute_s for lap in rounds])),
                  float(np.mean([lap.duration_s for lap in rounds])),
                  sum(lap.tokens for lap in rounds) / sum(lap.duration_s for lap in rounds), t_ring_s)


def rate_figures_of(totals: RoundTotals, gamma_predicted: float, t_ring_s: float) -> SpecRates:
    """rate_figures from running sums (a run longer than the run log's window)."""
    n = totals.rounds
    return _rates(n, totals.tokens / n, gamma_predicted, totals.draft_s / n, totals.drafted / n,
                  totals.compute_s / n, totals.duration_s / n, totals.tokens / totals.duration_s, t_ring_s)


def _rates(rounds: int, gamma_measured: float, gamma_predicted: float, draft_s: float, mean_k: float, compute: float,
           round_s: float, measured_tok_s: float, t_ring_s: float) -> SpecRates:
    return SpecRates(
        rounds=rounds, gamma_measured=gamma_measured, gamma_predicted=gamma_predicted,
        draft_s=draft_s, draft_per_token_s=draft_s / mean_k, verify_compute_s=compute,
        round_s=round_s, measured_tok_s=measured_tok_s,
        # r_spec = Gamma / (K c_d + C + T_ring): measured Gamma, K c_d and C; configured T_ring
        predicted_tok_s=gamma_measured / (draft_s + compute + t_ring_s),
        # the same with Gamma(alpha_hat, K) in place of the measured Gamma: the formula end to end
        predicted_tok_s_from_alpha=gamma_predicted / (draft_s + compute + t_ring_s),
    )


def summarize(laps: Sequence[LapRecord], scenario: Scenario) -> SpecSummary | None:
    """The JSON summary's `spec` object (DESIGN.md section 4) from the rounds seen so far."""
    rounds = [lap for lap in laps if lap.kind == "spec"]
    if not rounds:
        return None
    ks = [lap.facts.k for lap in rounds]
    alpha = sum(lap.facts.overlap_sum for lap in rounds) / sum(ks)
    accepted_per_pos = [0] * max(ks)
    drafted_per_pos = [0] * max(ks)
    for lap in rounds:
        for i in range(lap.facts.k):
            drafted_per_pos[i] += 1
            accepted_per_pos[i] += int(i < lap.facts.accepted)
    t_ring = scenario.t_ring_s
    by_k = {k: rate_figures([lap for lap in rounds if lap.facts.k == k], t_ring, alpha) for k in sorted(set(ks))}
    return _spec_summary(scenario, rate_figures(rounds, t_ring, alpha), by_k, alpha, rounds[-1].facts,
                         k_mean=float(np.mean(ks)), drafted=sum(ks), accepted=sum(lap.facts.accepted for lap in rounds),
                         drafted_per_pos=drafted_per_pos, accepted_per_pos=accepted_per_pos)


def summarize_totals(log, scenario: Scenario) -> SpecSummary | None:
    """summarize over every round of a run longer than the run log's window (testbed.launch.runlog.RunLog), from its
    running part (metrics.SpecRounds)."""
    spec: SpecRounds = log.parts[SpecRounds.name]
    if not spec.overall.rounds:
        return None
    alpha = spec.overlap_sum / spec.overall.drafted
    t_ring = scenario.t_ring_s

    overall = rate_figures_of(spec.overall, physics.gamma_mean(alpha, {k: t.rounds for k, t in spec.by_k.items()}),
                              t_ring)
    by_k = {k: rate_figures_of(spec.by_k[k], physics.gamma_mean(alpha, {k: 1}), t_ring) for k in sorted(spec.by_k)}
    return _spec_summary(scenario, overall, by_k, alpha, spec.last_round, k_mean=spec.overall.drafted / spec.overall.rounds,
                         drafted=spec.overall.drafted, accepted=spec.accepted_tokens,
                         drafted_per_pos=spec.drafted_per_position, accepted_per_pos=spec.accepted_per_position)


def _spec_summary(scenario: Scenario, overall: SpecRates, by_k: dict[int, SpecRates], alpha: float, last: SpecRound, *,
                  k_mean: float, drafted: int, accepted: int, drafted_per_pos: list[int],
                  accepted_per_pos: list[int]) -> SpecSummary:
    """The SpecSummary of rounds already reduced to their rates (overall and per K, K ascending) and counts."""
    t_ring = scenario.t_ring_s
    k_range = max(scenario.decode.settings(SpecSettings).k_max, max(by_k))
    timings = (overall.draft_per_token_s, overall.verify_compute_s, t_ring)
    k_star, r_star = physics.best_k(min(alpha, ALPHA_CAP), *timings, k_range)
    survival = physics.survival_curve(drafted_per_pos, accepted_per_pos)
    k_star_survival = r_star_survival = None
    if survival:
        tail = min(physics.survival_tail(survival, alpha), ALPHA_CAP)
        k_star_survival, r_star_survival = physics.best_k_survival(survival, tail, *timings, k_range)
    per_k = None
    k_star_measured = k_star_predicted = None
    if len(by_k) > 1 and not last.k_auto:
        rows = []
        for k, rates in by_k.items():
            # the curve predicted from this run's alpha_hat, c_d and C, at this K
            formula = physics.spec_rate(min(alpha, 1.0), k, overall.draft_per_token_s, overall.verify_compute_s,
                                        t_ring)
            rows.append(PerKRow(**rates.to_dict(), k=k, formula_tok_s=formula))
        per_k = tuple(rows)
        k_star_measured = max(rows, key=lambda row: row.measured_tok_s).k
        k_star_predicted = max(rows, key=lambda row: row.formula_tok_s).k
    k_last = last.k
    return SpecSummary(
        **overall.to_dict(),
        k=k_last if len(by_k) == 1 else round(k_mean, 2), k_last=k_last, k_auto=last.k_auto,
        draft=last.draft, drafted=drafted, accepted=accepted, alpha=alpha,
        alpha_dialled=scenario.decode.alpha if last.draft == "calibrated" else None,
        acceptance_per_position=tuple(a / d for a, d in zip(accepted_per_pos, drafted_per_pos)),
        k_star=k_star, k_star_tok_s=r_star, k_star_survival=k_star_survival, k_star_survival_tok_s=r_star_survival,
        plain_predicted_tok_s=physics.wall_rate(overall.verify_compute_s, t_ring),
        per_k=per_k, k_star_measured=k_star_measured, k_star_predicted=k_star_predicted,
    )
