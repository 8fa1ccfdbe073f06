"""The transport "kernel" flow model (testbed.core.tcp): its closed form, its rules, and a run's TTFT on it."""

from __future__ import annotations

import math

import pytest

from netem.plan import INITIAL_WINDOW_SEGMENTS, KERNEL_SYSCTLS, NAMESPACE_SYSCTLS, plan_network
from netem.timing import LinkTiming
from testbed import api
from testbed.core import tcp
from testbed.core.errors import ConfigError
from testbed.core.records import LinkSpec

pytestmark = pytest.mark.exact

IW = tcp.INITIAL_WINDOW_SEGMENTS * tcp.MSS_BYTES  # 14,480 bytes


def flow_transfer_s(n: int, params: tcp.TcpParams, one_way_s: float, piece: int = 256 * 1024) -> float:
    """A bulk write of n bytes at time 0, in the relay's pieces, through a fresh TcpFlow."""
    flow = tcp.TcpFlow(params)
    return max(flow.send(0.0, min(piece, n - off)) for off in range(0, n, piece)) + one_way_s


@pytest.mark.parametrize("n", [1, 1448, IW, IW + 1, 64 * 1024, 4 * 2**20, 32 * 2**20, 256 * 2**20])
@pytest.mark.parametrize("rtt_ms,rate_mbit", [(2, 1000), (40, 100), (100, 10), (280, 1000), (280, 0), (70, 50)])
def test_closed_form_equals_the_flow(n, rtt_ms, rate_mbit):
    rate = rate_mbit * 125_000 if rate_mbit else math.inf
    params = tcp.TcpParams(rtt_ms / 1e3, rate)
    assert flow_transfer_s(n, params, rtt_ms / 2e3) == pytest.approx(
        tcp.cold_transfer_s(n, params, rtt_ms / 2e3), rel=1e-12, abs=1e-12)


def test_slow_start_by_hand():
    """An unlimited link at 100 ms: 14,480 + 28,960 + 57,920 bytes go in rounds 0, 1 and 2, so 101,360 bytes
    arrive two round trips and a one-way delay after the write, and one byte more takes a third round trip."""
    params = tcp.TcpParams(0.1, math.inf)
    assert tcp.cold_transfer_s(7 * IW, params, 0.05) == pytest.approx(0.25)
    assert tcp.cold_transfer_s(7 * IW + 1, params, 0.05) == pytest.approx(0.35)
    assert flow_transfer_s(7 * IW + 1, params, 0.05) == pytest.approx(0.35)


def test_a_full_pipe_streams_at_the_link_rate():
    """10 Mbit/s at 40 ms is a 50,000-byte pipe: round 2's window (57,920) fills it, so after two round trips the
    rest streams at the rate."""
    params = tcp.TcpParams(0.04, 1.25e6)
    n = 10 * 2**20
    assert tcp.cold_transfer_s(n, params, 0.02) == pytest.approx(2 * 0.04 + (n - 3 * IW) / 1.25e6 + 0.02)


def test_the_window_cap_bounds_one_stream():
    params = tcp.TcpParams(0.28, 125e6)  # 1 Gbit/s at 280 ms: a 35 MB pipe, the cap a tenth of it
    assert tcp.window_limited_rate(params) == pytest.approx(tcp.KERNEL_WINDOW_CAP_BYTES / 0.28)
    big, bigger = 256 * 2**20, 512 * 2**20
    slope = (bigger - big) / (tcp.cold_transfer_s(bigger, params, 0.14) - tcp.cold_transfer_s(big, params, 0.14))
    assert slope == pytest.approx(tcp.window_limited_rate(params), rel=0.01)  # a partial round either side


def test_small_frames_do_not_grow_the_window_and_idleness_restarts_slow_start():
    params = tcp.TcpParams(0.1, math.inf)
    flow = tcp.TcpFlow(params)
    for lap in range(5):  # a decode frame a lap, well inside the window: it never grows
        flow.send(lap * 0.05, 600)
    assert flow.window == IW
    flow.send(1.0, 64 * 2**20)  # a bulk transfer grows it ...
    grown = flow.window
    assert grown > 100 * IW
    last, restarts = flow.last_sent, flow.restarts
    flow.send(last + 2.5 * params.rto_s, 600)  # ... and 2.5 RTOs of idleness halve it twice
    assert flow.window == grown / 4 and flow.restarts == restarts + 1
    flow.send(flow.last_sent + 100 * params.rto_s, 600)  # never below the initial window
    assert flow.window == IW


def test_loss_makes_the_sawtooth_of_mathis_rate():
    """A long lossy transfer through the flow keeps near MSS / RTT x sqrt(3/2) / sqrt(p) (the model's loss rule:
    one halving per lost round, one MSS a round after): within 25% for p 0.1-1%, seeded."""
    for p in (0.001, 0.003, 0.01):
        params = tcp.TcpParams(0.05, math.inf, loss=p, window_cap=2**40, seed=7)
        flow = tcp.TcpFlow(params)
        n = 400 * 2**20
        done = max(flow.send(0.0, 2**20) for _ in range(n // 2**20))
        assert flow.losses > 50
        assert n / done == pytest.approx(tcp.mathis_rate(params), rel=0.25), p


def test_parallel_connections_share_the_link():
    link = tcp.Bottleneck()
    params = tcp.TcpParams(0.01, 1e6, initial_window=2**30, window_cap=2**30)
    a, b = tcp.TcpFlow(params, link), tcp.TcpFlow(params, link)
    assert a.send(0.0, 10**6) == pytest.approx(1.0)
    assert b.send(0.0, 10**6) == pytest.approx(2.0)  # queued behind a's bytes on the one link


def test_link_timing_kernel_transport_uses_the_flow():
    link = LinkSpec(0, 1, 50.0, rate_mbit=100.0)
    kernel = LinkTiming.from_spec(link, transport="kernel", return_delay_ms=50.0)
    tuned = LinkTiming.from_spec(link)
    n = 4 * 2**20
    params = tcp.TcpParams(0.1, 12.5e6)
    assert kernel.deadline(0.0, n) == pytest.approx(tcp.cold_transfer_s(n, params, 0.05))
    assert tuned.deadline(0.0, n) == pytest.approx(n / 12.5e6 + 0.05)


def test_the_return_delay_is_the_reverse_links_or_the_links_own():
    ring = [LinkSpec(0, 1, 10.0), LinkSpec(1, 2, 20.0), LinkSpec(2, 0, 30.0), LinkSpec(1, 0, 5.0)]
    assert tcp.return_delay_ms(ring, ring[0]) == 5.0
    assert tcp.return_delay_ms(ring, ring[1]) == 20.0
    assert tcp.link_params(ring, ring[2], 200.0).rtt_s == pytest.approx(0.06)


def test_netem_plan_per_transport():
    links = [LinkSpec(0, 1, 10.0, rate_mbit=100.0), LinkSpec(1, 0, 10.0), LinkSpec(1, 2, 20.0), LinkSpec(2, 0, 30.0)]
    tuned = plan_network(links, 3, "abcde")
    assert tuned.namespaces[0].sysctls == NAMESPACE_SYSCTLS and not tuned.ack_qdiscs
    assert {v.initial_window for v in tuned.veths} == {INITIAL_WINDOW_SEGMENTS}
    kernel = plan_network(links, 3, "abcde", "kernel")
    assert kernel.namespaces[0].sysctls == KERNEL_SYSCTLS
    assert {v.initial_window for v in kernel.veths} == {None}
    # the links without a reverse one (1->2, 2->0) get their ACKs delayed by their own delay; 0->1 has 1->0
    assert sorted((q.link.src, q.link.dst, q.link.delay_ms, q.rate_bytes_s) for q in kernel.ack_qdiscs) == [
        (0, 2, 30.0, 0), (2, 1, 20.0, 0)]


def test_scenario_transport_is_checked():
    assert api.scenario("geo-ring").transport == "tuned"
    assert api.scenario("geo-ring", overrides=['network.transport="kernel"']).transport == "kernel"
    with pytest.raises(ConfigError, match=r"network\.transport.*tuned, kernel.*'reno'"):
        api.scenario("geo-ring", overrides=['network.transport="reno"'])


def test_a_cold_prompt_on_the_virtual_ring_meets_its_closed_form():
    """The 1,024-token 700B-class prompt (32 MiB a hop) at 1 Gbit/s over the geo ring: transport "kernel" pays
    slow start and the window's cap on every hop, and the TTFT equals Eq. 5 with cold_transfer_s per hop."""
    overrides = ['geometry.preset="seed-700b"', "decode.prompt_tokens=1024", "network.rate_mbit=1000"]
    tuned = api.run("geo-ring", shaper="virtual", tokens=2, overrides=overrides).ttft
    kernel = api.run("geo-ring", shaper="virtual", tokens=2, overrides=overrides + ['network.transport="kernel"']).ttft
    assert kernel.measured_s == pytest.approx(kernel.predicted_s, rel=1e-12)
    assert tuned.measured_s == pytest.approx(tuned.predicted_s, rel=1e-12)
    assert kernel.predicted_s > 5 * tuned.predicted_s  # 10.9 s against 1.58 s
    sc = api.scenario("geo-ring", overrides=overrides + ['network.transport="kernel"'])
    cold = tcp.prompt_transfer_s(sc.links, sc.ring, [kernel.bytes_per_hop] * 3, sc.loss_rto_ms)
    assert kernel.predicted_s == pytest.approx(kernel.prefill_compute_s + sc.t_ring_s + sum(cold), rel=1e-12)


def test_slow_start_after_idle_slows_a_big_frame_decode_and_the_prediction_replays_it():
    """32 KiB decode frames on the geo ring at 1 Gbit/s: each lap leaves the 40 ms hop idle past its RTO, so the
    kernel's TCP halves its window every lap down to 10 segments and a frame takes two round trips there. The
    prediction replays every frame through each hop's flow (tcp.HopFlows): measured = predicted, and 20% below
    the tuned transport's rate."""
    overrides = ['geometry.preset="seed-700b"', "network.rate_mbit=1000"]
    tuned = api.run("geo-ring", shaper="virtual", tokens=16, overrides=overrides)
    kernel = api.run("geo-ring", shaper="virtual", tokens=16, overrides=overrides + ['network.transport="kernel"'])
    assert kernel.measured_tok_s == pytest.approx(kernel.predicted_tok_s, rel=1e-9)
    assert kernel.measured_tok_s < 0.85 * tuned.measured_tok_s
    small = api.run("geo-ring", shaper="virtual", tokens=16, overrides=['network.transport="kernel"'])
    assert small.measured_tok_s == pytest.approx(api.run("geo-ring", shaper="virtual", tokens=16).measured_tok_s,
                                                 rel=1e-12)  # 612-byte frames fit the first window: no cost
