"""summarize(laps, scenario) -> OverlapSummary: overlapped speculation's rate against its closed form.

The prediction takes the run's realized run lengths (the rounds between two misses) and its measured c_d and C with
the configured T_ring: time = sum over the runs of physics.overlap_run_s(N, K, c_d, C + T_ring, W). Beside it the
i.i.d. form physics.overlap_rate with the measured Gamma and hit rate, its bound as W grows, and synchronous
speculation's r_spec at the same K (its rounds are these rounds: the same tokens, drafted one after another).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from agents.modes.overlap.facts import OverlapRound, OverlapSummary
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.scenario.config import Scenario


def summarize(laps: Sequence[LapRecord], sc: Scenario) -> OverlapSummary | None:
    rounds = [lap for lap in laps if lap.kind == "overlap" and isinstance(lap.facts, OverlapRound)]
    if not rounds:
        return None
    facts = [lap.facts for lap in rounds]
    k, window = facts[-1].k, facts[-1].window
    n = len(rounds)
    draft = sum(f.draft_s for f in facts) / sum(f.passes for f in facts)  # c_d as held, per pass
    compute = float(np.mean([lap.compute_s for lap in rounds]))
    t_ring = sc.t_ring_s
    lap_s = compute + t_ring
    run_lengths = Counter(f.run for f in facts).values()
    predicted_s = sum(physics.overlap_run_s(length, k, draft, lap_s, window) for length in run_lengths)
    tokens = sum(lap.tokens for lap in rounds)
    measured = tokens / sum(lap.duration_s for lap in rounds)
    predicted = tokens / predicted_s
    gamma_k = tokens / n
    hits = sum(f.hit for f in facts)
    hit = hits / n
    all_accepted = sum(f.accepted == k for f in facts)
    stage_work = np.mean([lap.stage_compute_s() for lap in rounds], axis=0)
    sync = gamma_k / physics.spec_round_s(k, draft, compute, t_ring)
    expected = physics.overlap_rate(gamma_k, hit, k, draft, compute, t_ring, window)
    return OverlapSummary(
        k=k, window=window, draft=sc.decode.draft, rounds=n, runs=len(run_lengths), hits=hits, hit_rate=hit,
        all_accepted_rate=all_accepted / n, guess_rate=hits / all_accepted if all_accepted else None,
        gamma_measured=gamma_k, alpha=sum(f.overlap_sum for f in facts) / (k * n),
        acceptance_per_position=tuple(sum(f.accepted > i for f in facts) / n for i in range(k)),
        draft_per_token_s=draft, verify_compute_s=compute, t_ring_s=t_ring,
        lap_s=float(np.mean([f.lap_s for f in facts])),
        queue_free=bool(max(stage_work) <= physics.overlap_step_s(k, draft) + 1e-12),
        discarded=sum(f.dropped for f in facts), measured_tok_s=measured, predicted_tok_s=predicted,
        error_pct=(measured / predicted - 1) * 100, expected_tok_s=expected,
        bound_tok_s=physics.overlap_bound(gamma_k, hit, k, draft, compute, t_ring), sync_predicted_tok_s=sync,
        gain_measured=measured / sync, gain_predicted=expected / sync,
        plain_predicted_tok_s=physics.wall_rate(compute, t_ring))
