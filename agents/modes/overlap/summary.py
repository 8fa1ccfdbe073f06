"""summarize(laps, scenario) -> OverlapSummary: overlapped speculation's rate against its closed form.

The prediction takes the run's realized run lengths (the rounds between two misses, each run at one K) and its
measured c_d and C (at each K) with the configured T_ring: time = sum over the runs of physics.overlap_run_s(N, K,
c_d, C + T_ring, W). Beside it the i.i.d. form physics.overlap_rate with the measured Gamma and hit rate at each K, its
bound as W grows, and synchronous speculation's r_spec at the same K (its rounds are these rounds: the same tokens,
drafted one after another).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agents.modes.overlap.facts import OverlapRound, OverlapSummary
from agents.modes.overlap.settings import OverlapSettings
from agents.modes.speculative.settings import ALPHA_CAP, ALPHA_PRIOR, SpecSettings
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.scenario.config import Scenario


def summarize(laps: Sequence[LapRecord], sc: Scenario) -> OverlapSummary | None:
    rounds = [lap for lap in laps if lap.kind == "overlap" and isinstance(lap.facts, OverlapRound)]
    if not rounds:
        return None
    facts = [lap.facts for lap in rounds]
    window, t_ring, n = facts[-1].window, sc.t_ring_s, len(rounds)
    draft = sum(f.draft_s for f in facts) / sum(f.passes for f in facts)  # c_d as held, per pass
    by_k = {k: [lap for lap in rounds if lap.facts.k == k] for k in sorted({f.k for f in facts})}
    compute_at = {k: float(np.mean([lap.compute_s for lap in laps_k])) for k, laps_k in by_k.items()}
    runs: dict[int, list[int]] = {}
    for f in facts:
        runs.setdefault(f.run, []).append(f.k)
    predicted_s = sum(physics.overlap_run_s(len(ks), ks[0], draft, compute_at[ks[0]] + t_ring, window)
                      for ks in runs.values())
    tokens = sum(lap.tokens for lap in rounds)
    measured = tokens / sum(lap.duration_s for lap in rounds)
    hits = sum(f.hit for f in facts)
    all_accepted = sum(f.accepted == f.k for f in facts)
    sync_s = expected_s = bound_s = 0.0  # each K's rounds at the i.i.d. forms' time per token
    queue_free = True
    for k, laps_k in by_k.items():
        gamma_k = sum(lap.tokens for lap in laps_k) / len(laps_k)
        hit_k = sum(lap.facts.hit for lap in laps_k) / len(laps_k)
        args = (k, draft, compute_at[k], t_ring)
        sync_s += len(laps_k) * physics.spec_round_s(*args)
        expected_s += len(laps_k) * gamma_k / physics.overlap_rate(gamma_k, hit_k, *args, window)
        bound_s += len(laps_k) * gamma_k / physics.overlap_bound(gamma_k, hit_k, *args)
        stage_work = np.mean([lap.stage_compute_s() for lap in laps_k], axis=0)
        queue_free &= bool(max(stage_work) <= physics.overlap_step_s(k, draft) + 1e-12)
    drafted_at = [sum(f.k > i for f in facts) for i in range(max(by_k))]
    sync, expected = tokens / sync_s, tokens / expected_s
    compute = float(np.mean([lap.compute_s for lap in rounds]))
    return OverlapSummary(
        k=facts[-1].k if len(by_k) == 1 else round(float(np.mean([f.k for f in facts])), 2), k_last=facts[-1].k,
        k_auto=sc.decode.settings(SpecSettings).k == "auto", window=window, draft=sc.decode.draft, rounds=n,
        runs=len(runs), hits=hits, hit_rate=hits / n, all_accepted_rate=all_accepted / n,
        guess_rate=hits / all_accepted if all_accepted else None, gamma_measured=tokens / n,
        alpha=sum(f.overlap_sum for f in facts) / sum(f.k for f in facts),
        acceptance_per_position=tuple(sum(f.k > i and f.accepted > i for f in facts) / d
                                      for i, d in enumerate(drafted_at)),
        draft_per_token_s=draft, verify_compute_s=compute, t_ring_s=t_ring,
        lap_s=float(np.mean([f.lap_s for f in facts])), queue_free=queue_free,
        discarded=sum(f.dropped for f in facts), measured_tok_s=measured, predicted_tok_s=tokens / predicted_s,
        error_pct=(measured * predicted_s / tokens - 1) * 100, expected_tok_s=expected, bound_tok_s=tokens / bound_s,
        sync_predicted_tok_s=sync, gain_measured=measured / sync, gain_predicted=expected / sync,
        plain_predicted_tok_s=physics.wall_rate(compute, t_ring))


def decode_forecast(scenario: Scenario, lap_s: float) -> tuple[float, int]:
    """(decode s, rounds) of a run at D = 1, for auto dilation's budget (testbed.launch.dilation): its tokens at the
    i.i.d. form's rate, alpha the calibrated draft's or speculation's prior, the guess right with chance alpha, K the
    scenario's or the i.i.d. K* (lap_s: a lap at the calibrated compute)."""
    decode, spec = scenario.decode, scenario.decode.settings(SpecSettings)
    alpha = min(decode.alpha if decode.draft == "calibrated" else ALPHA_PRIOR, ALPHA_CAP)
    window = decode.settings(OverlapSettings).window
    draft_s = decode.draft_ms / 1e3
    k = int(spec.k) if spec.k != "auto" else physics.best_k_overlap([], alpha, alpha, draft_s, lap_s, window,
                                                                     spec.k_max)[0]
    gamma_k = physics.gamma(alpha, k)
    rounds = max(spec.min_rounds, math.ceil(decode.tokens / gamma_k))
    rate = physics.overlap_rate(gamma_k, alpha ** (k + 1), k, draft_s, lap_s, 0.0, window)
    return rounds * gamma_k / rate, rounds
