"""Speculation at a distance (seeds 002/003): edge drafts, cloud verification, and capacity, on real rings.

Closed forms in physics.dsd_round_s / pipelined_crossover_rtt_s / capacity_multiplier; the runs use the built-in
edge-cloud scenario (t_v = 20 ms a round of K = 4, t_d = 10 ms a draft token, greedy).
"""

import numpy as np
import pytest

from agents.process import wire
from agents.modes.dsd.summary import round_bytes
from testbed import api
from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.core.records import Stamp
from testbed.studies.dsd.measure import DsdRow, autoregressive_request, colocated_request, crossover
from tests.ringutil import run

K, T_D, T_V = 4, 0.010, 0.020
STAMP = Stamp(0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_round_closed_forms():
    assert physics.dsd_round_s("colocated", K, T_D, T_V) == pytest.approx(0.060)
    assert physics.dsd_round_s("edge", K, T_D, T_V, 0.100) == pytest.approx(0.160)
    # pipelined at RTT 100: a hit hides all K + 1 draft steps in the 120 ms wait; a miss drafts K afresh
    assert physics.dsd_round_s("pipelined", K, T_D, T_V, 0.100, 0.5) == pytest.approx(0.5 * 0.120 + 0.5 * 0.160)
    # a miss at a 35 ms wait finishes the draft step in flight (4 steps = 40 ms): 5 ms more
    assert physics.dsd_round_s("pipelined", K, T_D, T_V, 0.015, 0.0) == pytest.approx(0.040 + 0.035 + 0.005)
    assert physics.capacity_multiplier(K, T_D, T_V) == pytest.approx(3.0)


def test_the_in_flight_step_is_averaged_over_the_measured_waits():
    """On the knife edge (a 40 ms wait is four whole 10 ms steps) the sawtooth jumps from 0 to a whole step: waits
    measured on either side of it give the mean of the two, not the sawtooth at their configured mean."""
    rest = physics.in_flight_rest_s
    assert rest(0.040, T_D, K + 1) == pytest.approx(0.0, abs=1e-12)
    assert rest(0.0401, T_D, K + 1) == pytest.approx(0.0099)
    assert rest(0.060, T_D, K + 1) == 0.0  # past the K + 1 steps: nothing in flight
    assert rest(0.035, 0.0, K + 1) == 0.0  # no drafting, nothing in flight
    sawtooth = physics.dsd_round_s("pipelined", K, T_D, T_V, 0.020, 0.0)
    measured = physics.dsd_round_s("pipelined", K, T_D, T_V, 0.020, 0.0, (0.0399, 0.0401))
    assert sawtooth == pytest.approx(0.080)
    assert measured == pytest.approx(0.080 + 0.005)
    assert physics.dsd_round_s("pipelined", K, T_D, T_V, 0.020, 0.0, (0.040,)) == pytest.approx(sawtooth)


def test_the_pipelined_crossover_is_where_the_rounds_meet():
    p = 0.9
    rtt = physics.pipelined_crossover_rtt_s(K, T_D, T_V, p)
    colocated = physics.dsd_round_s("colocated", K, T_D, T_V)
    assert physics.dsd_round_s("pipelined", K, T_D, T_V, rtt, p) >= colocated
    assert physics.dsd_round_s("pipelined", K, T_D, T_V, rtt - 1e-4, p) < colocated
    # past the drafting window ((K + 1) t_d = 50 ms of wait) a miss wastes nothing: RTT* = p K t_d there
    assert rtt == pytest.approx(p * K * T_D, abs=2e-4)
    assert physics.pipelined_crossover_rtt_s(K, T_D, T_V, 0.1) < 1e-3  # rarely right: never worth it


def test_an_edge_placement_adds_clients_and_their_links():
    sc = api.scenario("edge-cloud", overrides=["spec.clients=3", "spec.rtt_ms=40"])
    assert sc.decode.mode == "dsd" and sc.n_stages == 1 and sc.n_agents == 4
    edge = [(link.src, link.dst, link.delay_ms) for link in sc.links]
    assert edge == [(1, 0, 20.0), (0, 1, 20.0), (2, 0, 20.0), (0, 2, 20.0), (3, 0, 20.0), (0, 3, 20.0)]
    colocated = api.scenario("edge-cloud", overrides=["spec.placement=colocated"])
    assert colocated.decode.mode == "speculative" and colocated.n_agents == 1


@pytest.mark.parametrize("overrides, key", [
    (["decode.mode=plain"], "spec.placement"),
    (["decode.k=\"auto\""], "decode.k"),
    (["spec.clients=0"], "spec.clients"),
    (["spec.pipelined=3"], "spec.pipelined"),
    (["spec.placement=cloud"], "spec.placement"),
])
def test_bad_edge_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        api.scenario("edge-cloud", overrides=overrides)
    assert info.value.key == key


def test_a_round_moves_the_bytes_the_closed_form_counts():
    up, down = round_bytes(K, 256)
    probs = wire.Frame(wire.Kind.PROBS, tensor=np.zeros((K, 256), np.float32), stamps=(STAMP,))
    draft = wire.Frame(wire.Kind.DRAFT, tensor=np.zeros(K + 1, np.int32), stamps=(STAMP,))
    verdict = wire.Frame(wire.Kind.VERDICT, tensor=np.zeros(2, np.int32), stamps=(STAMP,))
    assert up == len(wire.encode(probs)) + len(wire.encode(draft)) and down == len(wire.encode(verdict))


def test_the_crossover_is_interpolated_between_grid_points():
    rows = [DsdRow(rtt, 100.0, 0, 100.0 + gap, 0, 100.0 + gap, 0, 0, 0, None, 0, 0, 0)
            for rtt, gap in ((5, -20.0), (10, -10.0), (20, 10.0), (40, 30.0))]
    assert crossover(rows) == pytest.approx(15.0)


DILATION = 2.0


def test_at_100_ms_colocated_sd_beats_synchronous_dsd_as_predicted():
    tokens = ["decode.tokens=16"]
    colocated = run(api.scenario("edge-cloud", overrides=tokens + ["spec.placement=colocated"]), dilation=DILATION)
    plain = run(api.scenario("edge-cloud", overrides=tokens + ["spec.placement=colocated", "decode.mode=plain"]),
                dilation=DILATION)
    sync = run(api.scenario("edge-cloud", overrides=tokens), dilation=DILATION)
    d = sync.dsd
    assert sync.token_ids[:16] == colocated.token_ids[:16] == plain.token_ids[:16]  # the exact rule, greedy
    # the issue asked 5% (real time measured ~+2% at D = 2); on the virtual clock each holds to 1e-6
    assert d.request_ms == pytest.approx(d.predicted_request_ms, rel=1e-6)
    measured, predicted = colocated_request(colocated, 0.100)
    assert measured == pytest.approx(predicted, rel=1e-6)
    assert measured * 1e3 < d.request_ms and predicted * 1e3 < d.predicted_request_ms
    ar, ar_predicted = autoregressive_request(plain, 0.100)
    assert ar == pytest.approx(ar_predicted, rel=1e-6)
    assert d.alpha_hat is not None and 0.5 < d.alpha_hat <= 1.0


def test_pipelined_dsd_crosses_colocated_sd_where_predicted():
    """A calibrated draft at alpha 0.9 (greedy: the guess is right whenever all K are) hits ~0.66 of rounds; with
    t_v = 50 ms >= (K + 1) t_d a verdict never lands mid-step, so pipelining beats co-location below
    RTT* = p K t_d ~ 26 ms; the grid 10, 20, 40, 80 ms brackets it."""
    base = ["decode.tokens=24", "decode.draft=calibrated", "decode.alpha=0.9", "stages.0.compute_ms=50"]
    colocated = run(api.scenario("edge-cloud", overrides=base + ["spec.placement=colocated"]))
    rows, hits, sync_td, sync_tv = [], [], [], []
    for rtt in (10.0, 20.0, 40.0, 80.0):
        d = run(api.scenario("edge-cloud", overrides=base + [f"spec.rtt_ms={rtt}", "spec.pipelined=true"])).dsd
        c_ms = colocated_request(colocated, rtt / 1e3)[0] * 1e3
        rows.append(DsdRow(rtt, c_ms, 0, 0, 0, d.request_ms, d.predicted_request_ms, 0, 0, d.alpha_hat,
                           d.draft_ms_per_token, d.verify_ms, d.hit_rate))
        hits.append(d.hit_rate)
        sync_td.append(d.draft_ms_per_token / 1e3)
        sync_tv.append(d.verify_ms / 1e3)
    predicted = physics.pipelined_crossover_rtt_s(K, float(np.mean(sync_td)), float(np.mean(sync_tv)),
                                                  float(np.mean(hits))) * 1e3
    measured = crossover(rows)
    assert 10.0 < predicted < 40.0, predicted
    assert measured is not None
    grid = [10.0, 20.0, 40.0, 80.0]
    steps = abs(np.searchsorted(grid, measured) - np.searchsorted(grid, predicted))
    assert steps <= 1, (measured, predicted)


def test_offloading_the_draft_multiplies_the_server_capacity():
    """Six edge clients at RTT 10 ms keep the server verifying all the time: Gamma / t_v against the co-located
    server's Gamma / (K t_d + t_v), a factor 1 + K t_d / t_v = 3."""
    colocated = run(api.scenario("edge-cloud", overrides=["spec.placement=colocated"]), dilation=DILATION)
    dsd = run(api.scenario("edge-cloud", overrides=["spec.clients=6", "spec.rtt_ms=10"]), dilation=DILATION).dsd
    assert dsd.server_busy > 0.8
    measured = dsd.aggregate_tok_s / colocated.spec.measured_tok_s
    predicted = physics.capacity_multiplier(K, dsd.draft_ms_per_token / 1e3, dsd.verify_ms / 1e3)
    assert measured == pytest.approx(predicted, rel=1e-6)


def test_the_window_where_dsd_beats_autoregressive_decoding():
    # Gamma 3.25, t_ar 40 ms: (40 + RTT + 20) / 3.25 < 40 below RTT 70 ms; a 15 ms target closes the window
    assert physics.dsd_beats_ar_below_rtt_s(3.25, 0.040, K, T_D, T_V) == pytest.approx(0.070)
    assert physics.dsd_beats_ar_below_rtt_s(3.25, 0.015, K, T_D, T_V) < 0


def test_a_bad_rtt_list_exits_2():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "testbed", "dsd", "edge-cloud", "--rtts", "5,x"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--rtts" in result.stdout
