"""The weights study (testbed.studies.weights): its simulation against hand-computed cases, its closed forms
(testbed.core.distribution), and a whole run."""

from __future__ import annotations

import argparse
import math

import pytest
from rich.console import Console

from testbed import api
from testbed.core import distribution, tcp
from testbed.core.errors import ConfigError
from testbed.studies.weights import STUDY, inputs, predict
from testbed.studies.weights import simulate as simulate_module
from testbed.studies.weights.fluid import Connection, max_min_rates
from testbed.studies.weights.measure import run
from testbed.studies.weights.result import WeightsResult
from testbed.studies.weights.simulate import Network, Node, Strategy, simulate

pytestmark = pytest.mark.exact

MBIT = 125_000.0
MIB = 2**20
IW = tcp.INITIAL_WINDOW_SEGMENTS * tcp.MSS_BYTES


def network(downs: list[float], one_way_s: float, *, kernel: bool = False, origin_mbit: float = 1000.0,
            up_mbit: float = 1000.0, shard_bytes: int = 40 * 16 * MIB + 12345, same_shard: bool = False) -> Network:
    """Nodes with these downlinks (Mbit/s), every path `one_way_s` each way."""
    nodes = tuple(Node(f"n{i}", "r", 0 if same_shard else i, shard_bytes, d * MBIT, up_mbit * MBIT)
                  for i, d in enumerate(downs))
    delays = tuple(tuple(one_way_s for _ in range(len(downs) + 1)) for _ in range(len(downs) + 1))
    return Network("o", origin_mbit * MBIT, nodes, delays, kernel, IW, tcp.KERNEL_WINDOW_CAP_BYTES, tcp.RTO_MIN_S)


@pytest.mark.parametrize("streams", [1, 3, 8])
def test_streams_on_a_tuned_link_take_f_over_the_rate_plus_the_delay(streams):
    net = network([100.0], 0.05)
    f = net.nodes[0].shard_bytes
    out = simulate(net, Strategy("s", streams), 16 * MIB)
    assert out.ring_ready_s == pytest.approx(f / (100 * MBIT) + 0.05, rel=1e-12)
    assert out.origin_bytes == pytest.approx(f, rel=1e-12) and out.rounds == 0
    assert predict.predict(net, Strategy("s", streams), 16 * MIB).ring_s == pytest.approx(out.ring_ready_s, rel=1e-12)


def test_parallel_streams_share_the_origin_max_min_fair():
    """Origin 500 Mbit/s; downlinks 100 and 1000: the first takes its 12.5 MB/s, the second the other 50 MB/s until
    it is done, when the first has nothing more to gain (its own downlink holds it)."""
    net = network([100.0, 1000.0], 0.02, origin_mbit=500.0)
    f = net.nodes[0].shard_bytes
    out = simulate(net, Strategy("s", 4), 16 * MIB)
    assert out.ready_s[1] == pytest.approx(f / (50e6) + 0.02, rel=1e-12)
    assert out.ready_s[0] == pytest.approx(f / (12.5e6) + 0.02, rel=1e-12)
    assert distribution.fair_share_finish_s([f, f], [12.5e6, 125e6], 62.5e6) == pytest.approx([f / 12.5e6, f / 50e6])


@pytest.mark.parametrize("rtt_ms,rate_mbit", [(2, 1000), (20, 100), (100, 100), (60, 10)])
def test_one_kernel_stream_is_the_cold_transfer_closed_form(rtt_ms, rate_mbit):
    """Where the window fills the pipe before the transfer ends, the fluid connection is cold_transfer_s exactly."""
    net = network([rate_mbit], rtt_ms / 2e3, kernel=True, origin_mbit=10_000)
    f = net.nodes[0].shard_bytes
    params = tcp.TcpParams(rtt_ms / 1e3, rate_mbit * MBIT)
    assert params.rate_bytes_s * params.rtt_s < tcp.KERNEL_WINDOW_CAP_BYTES  # the pipe fills
    out = simulate(net, Strategy("s", 1), 16 * MIB)
    assert out.ring_ready_s == pytest.approx(tcp.cold_transfer_s(f, params, rtt_ms / 2e3), rel=1e-12)


def test_a_window_limited_stream_at_a_long_rtt_runs_at_cap_over_rtt():
    """280 ms, 1 Gbit/s: slow start doubles IW for m = 8 rounds (IW 2^8 > the cap), then cap / RTT."""
    rtt, cap = 0.28, tcp.KERNEL_WINDOW_CAP_BYTES
    net = network([1000.0], rtt / 2, kernel=True, shard_bytes=2**30)
    m = math.ceil(math.log2(cap / IW))
    sent = IW * (2**m - 1)
    expected = m * rtt + (2**30 - sent) / (cap / rtt) + rtt / 2
    out = simulate(net, Strategy("s", 1), 64 * MIB)
    assert m == 8 and out.ring_ready_s == pytest.approx(expected, rel=1e-12)
    assert tcp.window_limited_rate(tcp.TcpParams(rtt, 1000 * MBIT)) == cap / rtt


def test_parallel_kernel_streams_add_their_windows_up_to_the_link():
    params = tcp.TcpParams(0.2, 1000 * MBIT)
    needed = distribution.streams_for_link(params)
    assert needed == math.ceil(0.95 * 125e6 * 0.2 / tcp.KERNEL_WINDOW_CAP_BYTES) == 9  # the 2.87 MB cap
    assert distribution.one_stream_slowdown(params) == pytest.approx(125e6 * 0.2 / tcp.KERNEL_WINDOW_CAP_BYTES)
    rates = []
    for p in (needed - 1, needed):  # 16 chunks a stream: no stream is left alone at the end
        net = network([1000.0], 0.1, kernel=True, shard_bytes=p * 16 * 64 * MIB)
        rates.append(p * 16 * 64 * MIB / (simulate(net, Strategy("s", p), 64 * MIB).ring_ready_s - 0.1))
    assert rates[0] < 0.95 * 125e6 <= rates[1]


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_swarm_reaches_the_peer_to_peer_bound_from_one_copy(n, kernel):
    """N nodes of one shard, every link 1 Gbit/s: the bound is F / u_s; the swarm is within its forwarding tail
    and stated tolerance of it, and the origin serves one copy. With 64 whole chunks every origin stream carries as
    many, and under "tuned" the prediction is the simulation."""
    net = network([1000.0] * n, 0.01, kernel=kernel, same_shard=True, shard_bytes=64 * 16 * MIB)
    f, strategy, chunk = net.nodes[0].shard_bytes, Strategy("swarm", 4, swarm=True), 16 * MIB
    out, pred = simulate(net, strategy, chunk), predict.predict(net, strategy, chunk)
    bound = distribution.p2p_bound_s([f] * n, f, 125e6, [125e6] * n, [125e6] * n)
    assert bound == pred.bound_s == f / 125e6
    forwarding = 4 * (n - 1) * chunk / 125e6
    assert bound < out.ring_ready_s <= bound + forwarding + pred.tolerance_s
    assert out.origin_bytes == pytest.approx(f, rel=1e-9) and out.peer_bytes == pytest.approx((n - 1) * f, rel=1e-9)
    if not kernel:  # tuned: the prediction (bound, last chunks forwarded, two one-way delays) is the simulation
        assert out.ring_ready_s == pytest.approx(pred.ring_s, rel=1e-9)


def test_a_swarm_of_distinct_shards_is_the_streams_strategy():
    net = network([1000.0, 500.0, 1000.0], 0.03, kernel=True)
    swarm, streams = simulate(net, Strategy("w", 8, swarm=True), 16 * MIB), simulate(net, Strategy("p", 8), 16 * MIB)
    assert swarm.ready_s == streams.ready_s and swarm.peer_bytes == 0


def test_max_min_fair_sharing_with_window_caps():
    """Two bottlenecks of 10 and 4: a flow over both and one over each, the one over the first capped at 1."""
    flows = [Connection(0, 1, (0, 1), 1.0, 0.5), Connection(0, 2, (0,), 1.0, 0.5, 1.0, 1.0),
             Connection(0, 3, (1,), 1.0, 0.5)]
    for c in flows:
        c.chunk, c.left = 0, 1.0
    max_min_rates(flows, [10.0, 4.0])
    assert [c.rate for c in flows] == [2.0, 1.0, 2.0]


def test_bounds_and_shards():
    assert distribution.client_server_bound_s([10, 10, 10], 5, [2, 4, 4]) == 6
    assert distribution.p2p_bound_s([10, 10, 10], 10, 5, [4, 4, 4], [1, 1, 1]) == 3.75
    scenario = api.scenario("geo-ring", overrides=['geometry.preset="seed-700b"'])
    cut = inputs.shards(scenario)
    assert abs(sum(s.n_bytes for s in cut) - scenario.geometry.weight_bytes) <= len(cut)
    assert [s.layers for s in cut] == [34, 33, 33] and cut[0].head


def test_the_study_runs_and_its_json_reads_back(tmp_path):
    args = STUDY.parser(argparse.ArgumentParser()).parse_args(
        ["geo-ring", "--set", 'geometry.preset="llama-3.1-8b"', "--regions", "hong-kong,ireland,virginia",
         "--rings", "2", "--json", str(tmp_path / "w.json")])
    result = run(args, Console(file=None, quiet=True))
    assert len(result.weights_rows) == 12
    assert all(r.copies == pytest.approx(1.0 if r.strategy == "swarm" else 2.0) for r in result.weights_rows)
    assert result.streams_needed == result.streams_needed_simulated == 9  # RTT 197.5 ms, cap 2.87 MB
    STUDY.show(result, args, Console(quiet=True))
    assert WeightsResult.from_json((tmp_path / "w.json").read_text()) == result
    api_args = STUDY.parser().parse_args([])  # as testbed.study sets them: keywords, lists joined by commas
    for key, value in {"scenario": "geo-ring", "overrides": 'geometry.preset="llama-3.1-8b"',
                       "regions": "hong-kong,ireland,virginia", "rings": 2}.items():
        setattr(api_args, key, value)
    assert run(api_args, Console(quiet=True)).weights_rows == result.weights_rows
    part = STUDY.report.parse(result.to_dict(), "w.json")
    markdown = "\n".join(STUDY.report.markdown([part]))
    assert "| llama-3.1-8b on geo-ring from virginia | geo | kernel | swarm |" in markdown
    assert "9 parallel streams make it latency-insensitive" in markdown
    with pytest.raises(ConfigError, match="--down-mbit"):
        run(STUDY.parser().parse_args(["geo-ring", "--down-mbit", "0"]), Console(quiet=True))
    with pytest.raises(ConfigError, match="one_stream_slowdown"):
        STUDY.report.parse({**result.to_dict(), "one_stream_slowdown": 0.5}, "bad.json")


@pytest.mark.parametrize("kernel", [False, True])
def test_where_the_peers_uplinks_bind_the_origin_sends_more_copies_and_the_swarm_meets_the_bound(kernel):
    """Four nodes of one shard, their uplinks 100 Mbit/s, the origin's 1 Gbit/s: the third term binds (4 F / (125 +
    4 x 12.5) MB/s against F / 125 MB/s). The origin's uplink stays busy the whole time (its bytes are u_s x the ring's
    time, ~2.9 copies), every uplink from the first chunk's arrival: the swarm is within 1% of the peer-to-peer bound
    and within its stated tolerance of the prediction (that start included)."""
    net = network([1000.0] * 4, 0.01, kernel=kernel, same_shard=True, shard_bytes=256 * 16 * MIB, up_mbit=100.0)
    f, strategy, chunk = net.nodes[0].shard_bytes, Strategy("swarm", 4, swarm=True), 16 * MIB
    assert simulate_module.origin_assists(net)
    out, pred = simulate(net, strategy, chunk), predict.predict(net, strategy, chunk)
    bound = distribution.p2p_bound_s([f] * 4, f, 125e6, [125e6] * 4, [12.5e6] * 4)
    assert bound == pred.bound_s == 4 * f / 175e6
    assert bound < out.ring_ready_s < 1.01 * bound
    assert abs(out.ring_ready_s - pred.ring_s) <= pred.tolerance_s
    assert out.origin_bytes / f > 2.5 and out.origin_bytes == pytest.approx(125e6 * out.ring_ready_s, rel=0.02)
    assert out.origin_bytes + out.peer_bytes >= 4 * f  # the endgame's cancelled copies are bytes sent too


def test_where_the_origin_binds_it_sends_one_copy_and_with_one_shard_each_none_is_needed():
    """All links 1 Gbit/s and 3 nodes of one shard: the first term binds, the origin sends each chunk once (the
    peer-to-peer test above covers the times). Distinct shards: no peer can help, so no second copy either."""
    same = network([1000.0] * 3, 0.01, same_shard=True, shard_bytes=64 * 16 * MIB)
    assert not simulate_module.origin_assists(same)
    out = simulate(same, Strategy("swarm", 4, swarm=True), 16 * MIB)
    assert out.origin_bytes == pytest.approx(64 * 16 * MIB, rel=1e-12)
    assert not simulate_module.origin_assists(network([1000.0] * 3, 0.01, up_mbit=10.0))


def test_with_unequal_shards_the_origin_helps_the_group_with_most_left():
    """Two groups of three, shards of 3 and 1 units, uplinks 100 Mbit/s: a group's own uplinks cannot help the other,
    so the origin's second copies go to the big shard's group. The ring is within the chunk start and 3% of the
    pooled bound, which the two groups meet only by finishing together."""
    big, small = 192 * 16 * MIB, 64 * 16 * MIB
    nodes = tuple(Node(f"n{i}", "r", i % 2, big if i % 2 == 0 else small, 125e6, 12.5e6) for i in range(6))
    delays = tuple(tuple(0.01 for _ in range(7)) for _ in range(7))
    net = Network("o", 125e6, nodes, delays, False, IW, tcp.KERNEL_WINDOW_CAP_BYTES, tcp.RTO_MIN_S)
    strategy, chunk = Strategy("swarm", 4, swarm=True), 16 * MIB
    out, pred = simulate(net, strategy, chunk), predict.predict(net, strategy, chunk)
    assert pred.bound_s == pytest.approx(3 * (big + small) / (125e6 + 6 * 12.5e6), rel=1e-12)
    assert out.ring_ready_s < pred.bound_s * 1.03 + pred.tolerance_s
    assert abs(out.ring_ready_s - pred.ring_s) <= pred.tolerance_s
    assert min(out.ready_s[1::2]) > 0.8 * max(out.ready_s)  # the small shard's group is not done long before
