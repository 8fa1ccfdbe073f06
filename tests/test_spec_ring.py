"""Regression: speculative decoding on real (time-scaled) rings amortizes the wall as the formula says.

Predicted r_spec = Gamma_measured / (K c_d + C + T_ring), with c_d and C measured and T_ring configured;
the tolerance is the overhead budget over the round (tests/ringutil.py). With the calibrated draft at
temperature 0 each draft is accepted with probability exactly alpha, so Gamma is checked against
Gamma(alpha, K) itself (within 5%, from ~400 rounds).
"""

import itertools

import pytest

from tests.ringutil import rate_tolerance, ring_scenario, run
from testbed.core import physics


LONG_RING_MS = [20.0, 20.0, 20.0]
STAGE_MS = 3.0
DRAFT_MS = 5.0  # the paper's c_d; above the calibrated draft's real per-token cost (a full target step, 1.5-4 ms)
ALPHA, K = 0.8, 4
GREEDY_PROMPT = "    def __repr__(self):\n        return "  # greedy from here: 18 distinct bytes in 48, code


def test_greedy_speculation_is_token_for_token_plain_greedy():
    plain = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=48, prompt=GREEDY_PROMPT))
    spec = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=48, mode="speculative", k=4, prompt=GREEDY_PROMPT))
    assert spec.spec.draft == "trained" and spec.spec.rounds > 5
    # Only a non-degenerate output makes the equality below mean something (one repeated byte matches trivially).
    ids = plain.token_ids
    assert len(set(ids)) >= 10 and max(len(list(run_)) for _, run_ in itertools.groupby(ids)) <= 16, ids
    assert spec.token_ids[:48] == plain.token_ids
    assert spec.spec.alpha > 0.3  # the trained draft agrees with the target most of the time


@pytest.fixture(scope="module")
def long_ring():
    plain = run(ring_scenario(LONG_RING_MS, compute_ms=STAGE_MS, tokens=40))
    spec = run(ring_scenario(LONG_RING_MS, compute_ms=STAGE_MS, tokens=1350, mode="speculative", k=K,
                             draft="calibrated", alpha=ALPHA, draft_ms=DRAFT_MS))
    return plain, spec


def test_measured_r_spec_matches_the_formula(long_ring):
    _, s = long_ring
    spec = s.spec
    assert spec.rounds >= 350 and spec.k == K
    round_s = spec.draft_s + spec.verify_compute_s + s.t_ring_s
    predicted = spec.gamma_measured / round_s
    tolerance = rate_tolerance(s.stages, round_s)
    assert s.measured_tok_s == pytest.approx(predicted, rel=tolerance)
    assert spec.draft_per_token_s == pytest.approx(DRAFT_MS / 1e3, rel=1e-6)  # emulated c_d held


def test_calibrated_draft_gamma_matches_gamma_of_alpha(long_ring):
    _, s = long_ring
    spec = s.spec
    assert spec.alpha == pytest.approx(ALPHA, abs=1e-6)  # sum min(p, q) is exactly the dialled alpha
    assert spec.gamma_measured == pytest.approx(physics.gamma(ALPHA, K), rel=0.05)
    # accepted-per-position decays like alpha^(i+1)
    for i, rate in enumerate(spec.acceptance_per_position):
        assert rate == pytest.approx(ALPHA ** (i + 1), abs=0.06)


def test_speculation_beats_plain_by_the_predicted_factor(long_ring):
    plain, spec = long_ring
    measured = spec.measured_tok_s / plain.measured_tok_s
    predicted = spec.predicted_tok_s / plain.predicted_tok_s
    tolerance = (rate_tolerance(3, 1 / plain.predicted_tok_s)
                 + rate_tolerance(3, spec.spec.round_s))
    assert measured > 2.0
    assert measured == pytest.approx(predicted, rel=tolerance)


def test_k_sweep_peaks_where_the_formula_says():
    # alpha 0.5 with (C + T_ring) / c_d = 20: K* = 3; K = 1 costs 12% and K = 6 costs 6%
    ks = list(range(1, 7))
    scenario = ring_scenario([20.0, 25.0, 26.0], compute_ms=3.0, tokens=1, mode="speculative",
                             draft="calibrated", alpha=0.5, draft_ms=4.0, k_sweep=ks, rounds_per_k=50, k_max=6)
    spec = run(scenario).spec
    assert [row.k for row in spec.per_k] == ks
    assert abs(spec.k_star_measured - spec.k_star_predicted) <= 1, spec.per_k
    # independent of anything measured: the closed form at the configured alpha, c_d, C and T_ring
    k_star, _ = physics.best_k(0.5, 0.004, scenario.emulated_compute_s, scenario.t_ring_s, 6)
    assert k_star == 3
    assert abs(spec.k_star_measured - k_star) <= 1, spec.per_k


def test_min_rounds_runs_that_many_rounds_however_few_tokens_they_take():
    """decode.min_rounds (the geo ring's 40: K = "auto" and the rate settle): the rounds run past decode.tokens,
    and the rate still meets the formula over all of them."""
    s = run(ring_scenario(LONG_RING_MS, compute_ms=STAGE_MS, tokens=4, mode="speculative", k="auto",
                          draft="calibrated", alpha=ALPHA, draft_ms=DRAFT_MS, min_rounds=25))
    assert s.spec.rounds == 25 and s.tokens > 25  # each round gives >= 1 token; 4 tokens alone end in <= 4
    round_s = s.spec.draft_s + s.spec.verify_compute_s + s.t_ring_s
    assert s.measured_tok_s == pytest.approx(s.spec.gamma_measured / round_s, rel=rate_tolerance(s.stages, round_s))
    assert run(ring_scenario(LONG_RING_MS, compute_ms=STAGE_MS, tokens=4, mode="speculative", k=2, draft="calibrated",
                             alpha=ALPHA, draft_ms=DRAFT_MS)).spec.rounds <= 4
