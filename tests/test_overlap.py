"""Overlapped speculation (agents.modes.overlap): its closed form, its losslessness, and its rate on virtual rings.

The closed form (physics.overlap_run_s) is checked against the max-plus recursion it solves; the expected rate
(physics.overlap_rate) against the sum over run lengths it stands for. On the virtual backend a run's time is the
closed form over its realized run lengths to EXACT, and its tokens are synchronous speculation's at the same K and
seed (the draws are keyed by position), so the speculative mode's exactness (tests/test_spec.py) carries over.
"""

import pytest

from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.launch.runlog import RunLog
from testbed.scenario.config import builtin_names, load_scenario
from tests.ringutil import EXACT, ring_scenario, run

GEO_MS = [130.0, 40.0, 110.0]  # the geo ring: T_ring 280 ms, C 33 ms
GREEDY_PROMPT = "    def __repr__(self):\n        return "


def recursion_run_s(n: int, k: int, draft_s: float, lap_s: float, window: int) -> float:
    """The run as the runner plays it: the draft may start round j once round j - 1 - W has its verdict; round j
    leaves once drafted and round j - W has its verdict."""
    step, sent, drafted = (k + 1) * draft_s, [], []
    for j in range(n):
        ready = k * draft_s if j == 0 else max(drafted[j - 1], sent[j - 1 - window] + lap_s if j > window else 0.0) + step
        drafted.append(ready)
        sent.append(max(ready, sent[j - window] + lap_s if j >= window else 0.0))
    return sent[-1] + lap_s


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("lap_ms", [20.0, 90.0, 313.0])
def test_a_runs_closed_form_is_the_recursion_it_solves(window, lap_ms):
    for n in range(1, 30):
        for k, draft_ms in ((1, 2.0), (4, 5.0), (7, 9.0)):
            assert physics.overlap_run_s(n, k, draft_ms / 1e3, lap_ms / 1e3, window) == pytest.approx(
                recursion_run_s(n, k, draft_ms / 1e3, lap_ms / 1e3, window), rel=1e-12)


@pytest.mark.parametrize("hit", [0.0, 0.2, 0.6, 0.95])
@pytest.mark.parametrize("window", [1, 4, 16])
def test_the_expected_rate_is_the_sum_over_run_lengths(hit, window):
    k, draft_s, compute_s, t_ring_s, gamma_k = 5, 0.005, 0.033, 0.28, 3.4
    lengths = range(1, 3000)
    mean_run_s = sum((1 - hit) * hit ** (n - 1) * physics.overlap_run_s(n, k, draft_s, compute_s + t_ring_s, window)
                     for n in lengths)
    expected = gamma_k / (1 - hit) / mean_run_s  # E[tokens of a run] = Gamma E[N] (Wald)
    assert physics.overlap_rate(gamma_k, hit, k, draft_s, compute_s, t_ring_s, window) == pytest.approx(expected,
                                                                                                      rel=1e-9)
    sync = gamma_k / physics.spec_round_s(k, draft_s, compute_s, t_ring_s)
    assert physics.overlap_rate(gamma_k, hit, k, draft_s, compute_s, t_ring_s, window) >= sync * (1 - 1e-12)
    assert physics.overlap_rate(gamma_k, hit, k, draft_s, compute_s, t_ring_s, window) <= physics.overlap_bound(
        gamma_k, hit, k, draft_s, compute_s, t_ring_s) * (1 + 1e-12)
    if hit == 0.0:
        assert physics.overlap_rate(gamma_k, hit, k, draft_s, compute_s, t_ring_s, window) == pytest.approx(sync)


def geo_scenario(mode: str, tokens: int = 160, **decode):
    settings = dict(k=5, draft="calibrated", alpha=0.8, draft_ms=5.0, temperature=0.7)
    return ring_scenario(GEO_MS, compute_ms=11.0, tokens=tokens, mode=mode, **(settings | decode))


def geo(mode: str, tokens: int = 160, **decode):
    return run(geo_scenario(mode, tokens, **decode))


@pytest.fixture(scope="module")
def geo_runs():
    return geo("speculative"), geo("overlap", window=4)


def test_on_the_geo_ring_the_rate_is_the_closed_form_of_its_runs(geo_runs):
    _, s = geo_runs
    o = s.overlap
    assert o.k == 5 and o.window == 4 and o.queue_free and o.runs > 10 and 0 < o.hits < o.rounds
    assert s.measured_tok_s == pytest.approx(s.predicted_tok_s, rel=EXACT)
    assert o.measured_tok_s == pytest.approx(o.predicted_tok_s, rel=EXACT)
    assert o.alpha == pytest.approx(0.8, abs=1e-6)  # the calibrated draft's dialled acceptance
    assert o.lap_s == pytest.approx(0.033 + 0.28, rel=EXACT)
    assert o.discarded > 0  # a miss drops the rounds drafted on after it


def test_overlap_gives_synchronous_speculations_tokens_faster(geo_runs):
    sync, s = geo_runs
    n = min(len(sync.token_ids), len(s.token_ids))
    assert n >= 160 and s.token_ids[:n] == sync.token_ids[:n]  # sampled at temperature 0.7: the same draws
    o = s.overlap
    # the run's own r_spec at its K is what synchronous speculation measures on the same ring
    assert o.sync_predicted_tok_s == pytest.approx(sync.measured_tok_s, rel=1e-3)  # their Gammas: the same rounds
    assert o.gamma_measured == pytest.approx(sync.spec.gamma_measured, rel=0.02)
    assert o.gain_measured > 1.2
    assert o.gain_measured == pytest.approx(s.measured_tok_s / o.sync_predicted_tok_s)


@pytest.mark.parametrize("window", [1, 16])
def test_the_closed_form_holds_window_bound_and_draft_bound(window):
    s = geo("overlap", tokens=80, window=window)
    o = s.overlap
    assert o.measured_tok_s == pytest.approx(o.predicted_tok_s, rel=EXACT)
    # W = 1: every hit round waits for the verdict before it (L > (K + 1) c_d); W = 16: 16 x 30 ms > L, draft-bound
    assert (window * physics.overlap_step_s(5, 0.005) >= o.lap_s) == (window == 16)


def test_greedy_overlap_is_plain_greedy_decode():
    plain = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=48, prompt=GREEDY_PROMPT))
    s = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=48, mode="overlap", k=4, window=2,
                          prompt=GREEDY_PROMPT))
    assert s.overlap.draft == "trained" and s.overlap.rounds > 5 and s.overlap.hits > 0
    assert len(set(plain.token_ids)) >= 10
    assert s.token_ids[:48] == plain.token_ids


def test_a_full_context_restarts_where_synchronous_speculation_does():
    """Past the context window (256 positions) both start a new sequence at the same token; overlap's runs end there."""
    sync = geo("speculative", tokens=300, alpha=0.9, k=4)
    s = geo("overlap", tokens=300, alpha=0.9, k=4, window=3)
    n = min(len(sync.token_ids), len(s.token_ids))
    assert n >= 300 and s.token_ids[:n] == sync.token_ids[:n]
    assert s.overlap.measured_tok_s == pytest.approx(s.overlap.predicted_tok_s, rel=EXACT)


@pytest.mark.parametrize("decode, key", [({"k": 4, "k_sweep": [2, 4]}, "decode.k_sweep"), ({"window": 0}, "decode.window"),
                                         ({"window": 65}, "decode.window")])
def test_bad_overlap_settings_name_the_key(decode, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ring_scenario(GEO_MS, mode="overlap", **decode)


@pytest.mark.parametrize("name", builtin_names())
def test_greedy_overlap_is_plain_greedy_on_every_shipped_scenario(name):
    """Tokens do not depend on timing: every shipped scenario's model and prompt, greedy (edge-cloud's draft back on
    the entry: overlap drafts there)."""
    common = ["decode.temperature=0", "decode.tokens=24", "decode.min_rounds=0", 'spec.placement="colocated"']
    plain = run(load_scenario(name, ["decode.mode=plain", *common]))
    s = run(load_scenario(name, ["decode.mode=overlap", "decode.k=4", "decode.window=2", *common]))
    assert s.overlap.rounds > 1 and s.overlap.hits > 0
    assert s.token_ids[:24] == plain.token_ids[:24]
    # the closed form holds where no round waits behind another at a stage: (K + 1) c_d >= a stage's work
    assert s.overlap.queue_free or name not in ("geo-ring", "table2-global", "edge-cloud")  # c_d 5-10 ms
    if s.overlap.queue_free:
        assert s.overlap.measured_tok_s == pytest.approx(s.overlap.predicted_tok_s, rel=EXACT)


def test_auto_k_picks_each_runs_k_from_what_it_measured_and_holds_the_closed_form():
    """K = "auto": a run's K maximizes overlap_rate from the measured survival curve and guess rate. The calibrated
    draft is i.i.d. at alpha 0.8, so the picks gather at the i.i.d. form's K*, below synchronous speculation's, and
    the rate is the best fixed K's (the curve is flat there: K 3-5 are within 1%)."""
    log = RunLog(geo_scenario("overlap", tokens=300, k="auto", window=4))
    s = run(log.scenario, runlog=log)
    o = s.overlap
    assert o.k_auto and o.measured_tok_s == pytest.approx(o.predicted_tok_s, rel=EXACT)
    ks = sorted(lap.facts.k for lap in log.laps if lap.kind == "overlap")
    k_iid, best = physics.best_k_overlap([], 0.8, o.guess_rate, 0.005, 0.313, 4, 24)
    k_sync, _ = physics.best_k(0.8, 0.005, 0.033, 0.28, 24)
    assert k_iid < k_sync and abs(ks[len(ks) // 2] - k_iid) <= 1, (ks, k_iid)
    assert s.measured_tok_s > 0.97 * best
