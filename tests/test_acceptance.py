"""Acceptance per draft position: the estimator on hand-made rounds and on a draft that is i.i.d. by construction, the
offline rounds against a ring run's, the per-position prediction against the i.i.d. one on held-out prompts, and the
study's options (agents.modes.speculative.positional, testbed.studies.acceptance)."""

from __future__ import annotations

from fractions import Fraction

import pytest

import testbed
from agents.modes.speculative import positional
from agents.modes.speculative.positional import PositionalAcceptance, positional_acceptance
from agents.modes.speculative.runner import PositionRandom
from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.studies.base import make_scenario

pytestmark = pytest.mark.exact


def test_the_vector_counts_only_the_rounds_that_reached_a_position():
    # (K, accepted): position i is reached when K > i and drafts 0..i-1 were accepted
    acceptance = positional_acceptance([(4, 0), (4, 2), (4, 4), (2, 2)])
    assert acceptance.reached == (4, 3, 2, 1) and acceptance.accepted == (3, 3, 1, 1)
    assert acceptance.vector == (0.75, 1.0, 0.5, 1.0)
    assert acceptance.survival == (0.75, 0.75, 0.375, 0.375)
    assert positional.predict_gamma(acceptance.vector, 2) == pytest.approx(2.5)
    assert positional.predict_gamma(acceptance.vector, 6) == pytest.approx(1 + 0.75 + 0.75 + 0.375 + 0.375
                                                                          + 0.375 * 0.999 + 0.375 * 0.999 ** 2)
    pooled = acceptance + positional_acceptance([(1, 0)])
    assert pooled.reached == (5, 3, 2, 1) and pooled.accepted == (3, 3, 1, 1)
    assert PositionalAcceptance.from_json(acceptance.to_json()) == acceptance


def test_a_flat_vector_predicts_the_iid_gamma_and_k_star():
    assert positional.predict_gamma([0.7] * 3, 8) == pytest.approx(physics.gamma(0.7, 8))
    assert positional.best_k([0.7] * 8, 0.005, 0.033, 0.28, 16) == physics.best_k(0.7, 0.005, 0.033, 0.28, 16)


def test_two_states_weigh_each_vector_by_how_often_rounds_start_in_it():
    assert positional.two_state_gamma([0.6, 0.7], [0.6, 0.7], 3) == pytest.approx(positional.predict_gamma([0.6, 0.7], 3))
    # K = 1: a round after a residual accepts with 0.5, after the target's token with 0.8; the chain starts after the
    # target's token in 0.5 / (1 - 0.8 + 0.5) of rounds
    share = 0.5 / 0.7
    assert positional.two_state_gamma([0.5], [0.8], 1) == pytest.approx(1 + share * 0.8 + (1 - share) * 0.5)
    assert positional.two_state_gamma([0.5], [1.0], 1) == pytest.approx(2.0)  # once all accepted, always


def exact_sequences(k: int, weights: dict[bool, tuple[int, ...]]) -> list[list[tuple[int, int]]]:
    """Two-round sequences whose counts are exactly a two-state chain's at K: weights[full] are the integer weights
    (one common total) of accepting m = 0..K after a residual (False) or after the target's token (True, also the
    prefill's). The first round follows the prefill; every first outcome is followed by every outcome of the state it
    leads to, each as often as the product of their weights."""
    sequences = []
    for first, w_first in enumerate(weights[True]):
        for second, w_second in enumerate(weights[first == k]):
            sequences += [[(k, first), (k, second)]] * (w_first * w_second)
    return sequences


def test_the_conditional_form_predicts_a_two_state_chain_exactly():
    """After a residual the chain accepts drafts 0, 1 with 1/2, 1/2; after the target's token with 3/4, 1/2 (K = 2:
    accept 0, 1, 2 with 4/8, 2/8, 2/8 and 2/8, 3/8, 3/8). Exactly: f_R = 1/4, f_T = 3/8 (all accepted), a round starts
    after the target's token in f_R / (1 - f_T + f_R) = 2/7 of rounds, and Gamma = 5/7 x 7/4 + 2/7 x 17/8 = 13/7."""
    sequences = exact_sequences(2, {False: (4, 2, 2), True: (2, 3, 3)})
    chain = positional.StartAcceptance.of(sequences, cap=0)
    assert chain.vector((0, False)) == (0.5, 0.5) and chain.vector((0, True)) == (0.75, 0.5)
    after_residual, after_target = (Fraction(1, 2), Fraction(1, 2)), (Fraction(3, 4), Fraction(1, 2))
    f_r, f_t = after_residual[0] * after_residual[1], after_target[0] * after_target[1]
    share = f_r / (1 - f_t + f_r)
    exact = (1 - share) * (1 + after_residual[0] + f_r) + share * (1 + after_target[0] + f_t)
    assert exact == Fraction(13, 7)
    assert chain.gamma(2) == pytest.approx(float(exact), abs=1e-12)
    assert chain.stationary(2)[(0, True)] == pytest.approx(2 / 7, abs=1e-12)
    assert chain.gamma(2) == pytest.approx(positional.two_state_gamma((0.5, 0.5), (0.75, 0.5), 2), abs=1e-12)
    # one vector pools the starts as these short sequences mix them (half their rounds follow the prefill), not as a
    # long run at K = 2 does
    assert positional.predict_gamma(positional_acceptance(r for q in sequences for r in q).vector, 2) != \
        pytest.approx(float(exact), abs=1e-3)


def test_the_conditional_form_is_the_plain_one_when_the_start_does_not_matter():
    """Every start accepts with the same vector (a calibrated i.i.d. draft's, exactly): whatever the cap, the chain's
    mix weighs one reward and Gamma(K) is predict_gamma's at every K."""
    sequences = exact_sequences(2, {False: (4, 1, 3), True: (4, 1, 3)})  # a = (1/2, 3/4) after either start
    vector = positional_acceptance(r for q in sequences for r in q).vector
    assert vector == (0.5, 0.75)
    for cap in (0, 1, 3):
        chain = positional.StartAcceptance.of(sequences, cap)
        for k in range(1, 6):
            assert chain.gamma(k) == pytest.approx(positional.predict_gamma(vector, k), abs=1e-12), (cap, k)
    assert chain.best_k(0.005, 0.033, 0.28, 16) == positional.best_k(vector, 0.005, 0.033, 0.28, 16)


def test_the_start_chain_s_distribution_is_stationary():
    """Three start states (cap 1): pi_K from the elimination satisfies pi P = pi, the transitions being each state's
    outcomes (accept m < K: to (min(m, 1), False); all K: to (1, True))."""
    vectors = {(0, False): (0.55, 0.7, 0.8), (1, False): (0.6, 0.75, 0.8), (1, True): (0.8, 0.85, 0.9)}
    pi = positional.stationary_starts(vectors, 3, 1)
    assert sum(pi.values()) == pytest.approx(1.0) and min(pi.values()) > 0
    after = dict.fromkeys(vectors, 0.0)
    for state, share in pi.items():
        for m, p in enumerate(positional.outcomes(vectors[state], 3)):
            after[positional.start_after(3, m, 1)] += share * p
    assert after == pytest.approx(pi, abs=1e-12)
    assert positional.states_at(3, 1) == sorted(vectors)
    assert positional.outcomes((0.5, 0.5), 2) == [0.5, 0.25, 0.25]


def test_bad_rounds_and_counts_are_refused():
    with pytest.raises(ValueError, match="cannot accept 5"):
        positional_acceptance([(4, 5)])
    with pytest.raises(ValueError, match="accepted <= reached"):
        PositionalAcceptance((2, 1), (3, 1))


@pytest.fixture(scope="module")
def geo_ring():
    from agents.process.shared import draft_name, shared_model

    scenario = make_scenario("geo-ring", overrides=["decode.mode=speculative", "decode.k=4", "decode.min_rounds=0"])
    target = shared_model(scenario.model)
    return scenario, target, {kind: shared_model(draft_name(kind, target)) for kind in ("trained", "calibrated")}


def speculation(geo_ring, draft: str, alpha: float = 0.8):
    from testbed.studies.acceptance.measure import Speculation

    scenario, target, drafts = geo_ring
    return Speculation(target, drafts[draft], draft, alpha, scenario.decode.temperature)


def runs_on(spec, windows: list[int], k: int, tokens: int, seed: int = 0):
    """Each window's rounds at K, as the study takes them."""
    from testbed.studies.acceptance.measure import PROMPT_TOKENS, SEED_STRIDE, PromptRounds, one_thread, text_ids

    text = text_ids(spec.target.vocabulary)
    with one_thread():
        return [PromptRounds(w, k, spec.continue_prompt(list(text[w * PROMPT_TOKENS:(w + 1) * PROMPT_TOKENS]), k, tokens,
                                                        PositionRandom(seed * SEED_STRIDE + w))) for w in windows]


def test_the_offline_rounds_are_the_ring_s(geo_ring):
    """The study's rounds are a speculating ring's: the same prompt and seed give the same tokens on the virtual ring."""
    from agents.zoo.prompts import prompt_ids
    from testbed.studies.acceptance.measure import one_thread

    scenario, target, _drafts = geo_ring
    ring = testbed.run(scenario, "virtual", dilation=1.0)
    with one_thread():
        rounds = speculation(geo_ring, "trained").continue_prompt(prompt_ids(scenario.decode, target), 4,
                                                                  scenario.decode.tokens - 1,
                                                                  PositionRandom(scenario.decode.seed))
    assert ring.token_ids[1:] == tuple(token for r in rounds for token in r.ids)
    assert (ring.spec.rounds, ring.spec.accepted) == (len(rounds), sum(r.accepted for r in rounds))


def test_a_calibrated_draft_s_vector_is_flat_at_its_alpha(geo_ring):
    """The calibrated draft accepts each position with probability alpha whatever came before: every a_i is 0.8 within
    sampling error (the share of rounds that accepted 0..i, S_i, would fall as 0.8^(i+1))."""
    from testbed.studies.acceptance.measure import alpha_hat_of, counts_of

    runs = runs_on(speculation(geo_ring, "calibrated", 0.8), [3, 50, 97, 140, 201], 4, 40)
    counts = counts_of(runs)
    assert len(counts.vector) == 4 and min(counts.reached) >= 25
    for a, se in zip(counts.vector, counts.standard_errors):
        assert abs(a - 0.8) < 3 * max(se, 0.02), (counts.vector, counts.standard_errors)
    assert alpha_hat_of(runs) == pytest.approx(0.8, abs=1e-6)  # sum min(p, q) is dialled exactly


def test_the_per_position_prediction_beats_the_iid_one_on_held_out_prompts(geo_ring):
    """The trained pair: Gamma at K = 8 on held-out prompts is closer to 1 + sum S_i of the calibration prompts'
    vector than to Gamma(alpha_hat, 8) with alpha_hat from the same rounds (its a_i rise with i, and a round accepts
    more after the target's own token than after a residual). Eight prompts a set: the prompts differ so much that
    with fewer the held-out Gamma is as often nearer one as the other (docs/studies/acceptance.md)."""
    from testbed.studies.acceptance.measure import (alpha_hat_of, conditional, counts_of, measured_gamma,
                                                    prompt_sets, text_ids)

    spec = speculation(geo_ring, "trained")
    calibration, held_out = prompt_sets(8, 0, len(text_ids(spec.target.vocabulary)))
    assert not set(calibration) & set(held_out)
    calibrated = runs_on(spec, calibration, 8, 48)
    vector = counts_of(calibrated).vector
    assert vector[-1] > vector[0] + 0.1  # not i.i.d.
    by_start = conditional(calibrated, 1)
    assert by_start.pooled(True).vector[0] > by_start.pooled(False).vector[0]
    measured = measured_gamma(runs_on(spec, held_out, 8, 48))
    per_position = positional.predict_gamma(vector, 8)
    iid = physics.gamma(alpha_hat_of(calibrated), 8)
    assert abs(per_position - measured) < abs(iid - measured), (measured, per_position, iid)


@pytest.mark.parametrize(("options", "key"), [({"draft": "medusa"}, "--draft"), ({"alpha": 1.5}, "--alpha"),
                                              ({"k_cal": 0}, "--k-cal"), ({"prompts": 500}, "--prompts"),
                                              ({"tokens": 400}, "--tokens"), ({"prompts": "most"}, "--prompts"),
                                              ({"cap": -1}, "--cap")])
def test_a_bad_option_is_a_config_error_naming_it(options, key):
    with pytest.raises(ConfigError, match=f"^{key}: expected"):
        testbed.study("acceptance", **options)


def test_the_study_prints_its_table_and_writes_its_json(tmp_path, capsys):
    from testbed import cli
    from testbed.studies.acceptance.figures import parse_acceptance
    from testbed.studies.acceptance.result import AcceptanceResult

    path = tmp_path / "acceptance.json"
    assert cli.main(["acceptance", "--prompts", "2", "--tokens", "12", "--k-cal", "3", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "conditional Γ" in out and "per-position Γ" in out and "iid Γ(α̂, K)" in out and "wall time" in out
    result = AcceptanceResult.from_json(path.read_text())
    assert [r.k for r in result.acceptance_rows] == [1, 2, 3] and len(result.positions) == 3
    assert parse_acceptance(result.to_dict(), str(path)).result == result
    assert cli.main(["acceptance", "--draft", "medusa"]) == 2
    assert "--draft: expected one of trained, calibrated, got 'medusa'" in capsys.readouterr().out
