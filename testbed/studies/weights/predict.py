"""The weights study's predictions, from the closed forms of testbed.core.distribution, beside each simulation.

Per node, its rate bound: its downlink, or its connections' window-limited rates together (P x window_cap / RTT
under transport "kernel"), or its share of the origin's uplink, whichever is least. For the streams strategies the
prediction is the fluid schedule of those caps on the origin's uplink (fair_share_finish_s: a node that finishes
early frees its share), plus slow start's lag at each stream's first share and the one-way delay of the last chunk.
Shares are per connection (as TCP's are): a node whose last chunks keep fewer of its streams busy gets less than its
node's share for that tail, which the per-node prediction leaves out (the ring's last node is seldom the one).
For the swarm: the peer-to-peer bound with each node's downlink replaced by what its connections can take and the
origin's uplink by what its connections can carry. Where the origin's uplink binds (simulate.origin_assists false)
its one copy goes first: at least the other copies over the peers' uplinks ((sum F_i - distinct) / sum u_i), plus
the forwarding of the origin's last chunks (a chunk is forwarded only once it has arrived whole: origin streams x
(group size - 1) chunks at the least of the node's uplink and downlink). Where the peers' uplinks bind, the origin
sends second copies and every uplink is busy once the first chunk has arrived: the third term with the peers' uplinks
idle for one chunk at an origin stream's share, (sum F_i + t_chunk x sum u_i) / (u_s + sum u_i) (a chunked swarm
cannot meet the fluid bound closer than that start). Both add the delay origin -> peer -> node. Its stated tolerance
(the test's): one chunk at an origin stream's share (how far a node's forwarding may lag its intake) and the slowest
round trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from testbed.core.distribution import client_server_bound_s, p2p_bound_s, streams_ready_s
from testbed.core.tcp import TcpParams, window_limited_rate
from testbed.studies.weights.simulate import ORIGIN, Network, Strategy, distinct_bytes, origin_assists


@dataclass(frozen=True)
class Prediction:
    """A strategy's closed forms on one network."""

    node_cap_bytes_s: tuple[float, ...]  # per node: the least of downlink, windows x streams, origin share
    node_s: tuple[float, ...]  # per node: predicted ready time
    ring_s: float
    bound_s: float  # client-server (streams) or peer-to-peer (swarm), the F / rate terms alone
    bound: str  # which
    tolerance_s: float  # the swarm's chunk pipeline; 0 for the streams


def path_params(net: Network, src: int, node: int, rate: float) -> TcpParams:
    """One connection's TCP constants on the path src -> node (endpoint indices: 0 the origin)."""
    rtt = net.rtt_s(src, node + 1)
    if not net.kernel:
        return TcpParams(rtt, rate, initial_window=math.inf, window_cap=math.inf)  # type: ignore[arg-type]
    return TcpParams(rtt, rate, int(net.initial_window), int(net.window_cap), rto_min_s=net.rto_min_s)


def predict(net: Network, strategy: Strategy, chunk_bytes: int) -> Prediction:
    return predict_swarm(net, strategy, chunk_bytes) if strategy.swarm else predict_streams(net, strategy)


def predict_streams(net: Network, strategy: Strategy) -> Prediction:
    """Every node pulls its shard from the origin over P streams: the fluid schedule of their caps on u_s."""
    p = strategy.origin_streams
    sizes = [nd.shard_bytes for nd in net.nodes]
    first, ready = streams_ready_s(sizes, [nd.down_bytes_s for nd in net.nodes], net.origin_up_bytes_s, p,
                                   lambda i, rate: path_params(net, ORIGIN, i, rate),
                                   [net.one_way_s[ORIGIN][i + 1] for i in range(len(net.nodes))])
    node_s = tuple(ready)
    bound = client_server_bound_s(sizes, net.origin_up_bytes_s, [nd.down_bytes_s for nd in net.nodes])
    return Prediction(tuple(first), node_s, max(node_s), bound, "client-server", 0.0)


def window_rate(net: Network, src: int, node: int) -> float:
    """One connection's window-limited rate on the path src -> node, the links aside (inf under "tuned")."""
    return window_limited_rate(path_params(net, src, node, math.inf))


def predict_swarm(net: Network, strategy: Strategy, chunk_bytes: int) -> Prediction:
    """The peer-to-peer bound on what the nodes' connections can carry, plus the slowest one-way delay."""
    n, p = len(net.nodes), strategy.origin_streams
    groups = [[j for j in range(n) if net.nodes[j].shard == nd.shard] for nd in net.nodes]
    sizes, ups = [nd.shard_bytes for nd in net.nodes], [nd.up_bytes_s for nd in net.nodes]
    bound = p2p_bound_s(sizes, distinct_bytes(net), net.origin_up_bytes_s, [nd.down_bytes_s for nd in net.nodes], ups)
    if all(len(g) == 1 for g in groups):  # no two nodes need the same bytes: the swarm is the streams strategy
        return replace(predict_streams(net, strategy), bound_s=bound, bound="peer-to-peer")
    caps = [min(nd.down_bytes_s, p * window_rate(net, ORIGIN, i)
                + sum(window_rate(net, j + 1, i) for j in groups[i] if j != i)) for i, nd in enumerate(net.nodes)]
    origin = min(net.origin_up_bytes_s, sum(p * window_rate(net, ORIGIN, i) for i in range(n)))
    delays = [max((net.one_way_s[ORIGIN][j + 1] + net.one_way_s[j + 1][i + 1] for j in g if j != i),
                  default=net.one_way_s[ORIGIN][i + 1]) for i, g in enumerate(groups)]
    if origin_assists(net):  # every uplink busy from the first chunk's arrival: the third term, plus that start
        start = max(chunk_s(net, strategy, chunk_bytes, i) for i in range(n))
        peers = sum(u for u, g in zip(ups, groups) if len(g) > 1)
        whole = (sum(sizes) + start * peers) / (origin + peers)
        node_s = tuple(max(f / c, whole) + d for f, c, d in zip(sizes, caps, delays))
    else:  # the origin's one copy then its last chunks forwarded; each node's intake; the other copies over peers
        rest = max(p2p_bound_s(sizes, 0.0, origin, caps, ups), (sum(sizes) - distinct_bytes(net)) / sum(ups))
        node_s = tuple(max(distinct_bytes(net) / origin + forwarding_s(net, strategy, chunk_bytes, i, g), f / c, rest)
                       + d for i, (f, c, g, d) in enumerate(zip(sizes, caps, groups, delays)))
    slack = max(chunk_s(net, strategy, chunk_bytes, i)
                + max(net.rtt_s(ORIGIN, i + 1), *(net.rtt_s(j + 1, i + 1) for j in g)) for i, g in enumerate(groups))
    return Prediction(tuple(caps), node_s, max(node_s), bound, "peer-to-peer", slack)


def forwarding_s(net: Network, strategy: Strategy, chunk_bytes: int, i: int, group: list[int]) -> float:
    """After the origin's last chunks arrive, node i forwards its own to each group peer: origin streams x (group
    size - 1) chunks at the least of its uplink and downlink."""
    nd = net.nodes[i]
    return strategy.origin_streams * (len(group) - 1) * min(chunk_bytes, nd.shard_bytes) \
        / min(nd.up_bytes_s, nd.down_bytes_s)


def chunk_s(net: Network, strategy: Strategy, chunk_bytes: int, i: int) -> float:
    """One chunk at an origin stream's share: u_s over every node's origin streams, the node's downlink over its own,
    or one window's rate, whichever is least."""
    nd, p = net.nodes[i], strategy.origin_streams
    share = min(net.origin_up_bytes_s / (p * len(net.nodes)), nd.down_bytes_s / p, window_rate(net, ORIGIN, i))
    return min(chunk_bytes, nd.shard_bytes) / share
