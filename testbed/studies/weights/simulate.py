"""The weights study's simulation: chunks of every node's shard over fluid TCP connections, on simulated time.

Endpoint 0 is the origin (a hub mirror), 1..N the nodes. Every node's shard is cut into chunks (the last one short);
a chunk is usable at its node one one-way delay after its last byte left the source, and a node is ready when it
holds all its chunks. Requests are pipelined: a connection that finishes a chunk starts its next at once, with no
round trip for the request.

Strategies (Strategy):
    streams    each node opens `origin_streams` connections to the origin; a free one takes the node's next chunk
               (one stream: P = 1; parallel range requests as exo's downloader: P = 8).
    swarm      nodes that need the same shard (a stage replicated over several rings) form a group. Each node keeps
               `origin_streams` connections to the origin, which fetch chunks no node of its group holds or is
               fetching (the origin sends each chunk to the group once: its bytes served are one copy), and one
               connection from each group peer, which fetches, rarest first (fewest holders in the group, among the
               first RAREST_WINDOW candidates in the order the peer got them), a chunk the peer holds that the node
               neither holds nor is fetching. One copy from the origin is what the peer-to-peer bound needs where
               its first two terms bind; where the third binds (the peers' uplinks cannot carry the other N - 1
               copies) the origin would have to send more, which this swarm does not: the table shows the gap.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from testbed.studies.weights.fluid import Connection, max_min_rates

RAREST_WINDOW = 64  # a peer connection looks this far down the peer's chunks for the rarest
ORIGIN = 0


@dataclass(frozen=True)
class Strategy:
    """How nodes fetch: `origin_streams` connections each to the origin, and whether group peers exchange chunks."""

    name: str
    origin_streams: int
    swarm: bool = False


@dataclass(frozen=True)
class Node:
    name: str
    region: str
    shard: int  # which shard it needs (its stage): nodes with the same shard form a swarm group
    shard_bytes: int
    down_bytes_s: float
    up_bytes_s: float


@dataclass(frozen=True)
class Network:
    """The origin, the nodes, and the one-way delay between any two endpoints (0 = origin), seconds."""

    origin_region: str
    origin_up_bytes_s: float
    nodes: tuple[Node, ...]
    one_way_s: tuple[tuple[float, ...], ...]  # [from][to] over endpoints: 0 the origin, i the node i - 1
    kernel: bool  # transport "kernel" (TCP windows) or "tuned" (none)
    initial_window: float
    window_cap: float
    rto_min_s: float

    def rtt_s(self, a: int, b: int) -> float:
        return self.one_way_s[a][b] + self.one_way_s[b][a]


@dataclass(frozen=True)
class Outcome:
    """One simulated distribution: when each node was ready, and who sent what."""

    ready_s: tuple[float, ...]  # per node
    origin_bytes: float
    peer_bytes: float
    rounds: int
    restarts: int

    @property
    def ring_ready_s(self) -> float:
        return max(self.ready_s)


class Distribution:
    """One run of a strategy over a network, event by event (module doc)."""

    def __init__(self, net: Network, strategy: Strategy, chunk_bytes: int) -> None:
        self.net, self.strategy, self.now = net, strategy, 0.0
        n = len(net.nodes)
        self.capacities = [net.origin_up_bytes_s] + [nd.up_bytes_s for nd in net.nodes] + \
                          [nd.down_bytes_s for nd in net.nodes]
        self.sizes = [chunk_sizes(nd.shard_bytes, chunk_bytes) for nd in net.nodes]
        self.have: list[set[int]] = [set() for _ in range(n)]
        self.fetching: list[set[int]] = [set() for _ in range(n)]
        self.got_order: list[list[int]] = [[] for _ in range(n)]  # chunks in the order each node got them
        self.ready: list[float] = [math.inf if self.sizes[i] else 0.0 for i in range(n)]
        self.group = [[j for j in range(n) if net.nodes[j].shard == nd.shard] for nd in net.nodes]
        self.cursor: dict[int, int] = {}  # the next chunk the origin has not sent: per node, or per group (swarm)
        self.holders: dict[tuple[int, int], int] = {}  # (shard, chunk) -> nodes holding it
        self.scan: dict[tuple[int, int], int] = {}  # (peer, node) -> where in the peer's chunks the node's needs begin
        self.arrivals: list[tuple[float, int, int, int]] = []  # (time, node, chunk, source endpoint)
        self.conns = [self._connection(ORIGIN, i) for i in range(n) for _ in range(strategy.origin_streams)]
        if strategy.swarm:
            self.conns += [self._connection(j + 1, i) for i in range(n) for j in self.group[i] if j != i]
        self.origin_bytes = self.peer_bytes = 0.0

    def _connection(self, src: int, node: int) -> Connection:
        net, dst = self.net, node + 1
        down = 1 + len(net.nodes) + node
        rtt = net.rtt_s(src, dst)
        if not net.kernel:
            return Connection(src, dst, (src, down), rtt, net.one_way_s[src][dst])
        return Connection(src, dst, (src, down), rtt, net.one_way_s[src][dst], net.initial_window, net.window_cap,
                          rtt + net.rto_min_s)

    def run(self) -> Outcome:
        self._assign_all()
        dirty = True
        while any(math.isinf(t) for t in self.ready):
            if dirty:
                self._allocate()
            at = self._next_event()
            if math.isinf(at):
                raise RuntimeError(f"the {self.strategy.name} distribution stalled at {self.now:.3f} s")
            dirty = self._advance(at)
        return Outcome(tuple(self.ready), self.origin_bytes, self.peer_bytes, sum(c.rounds for c in self.conns),
                       sum(c.restarts for c in self.conns))

    def _allocate(self) -> None:
        max_min_rates(self.conns, self.capacities)
        for c in self.conns:  # a round clock runs only while a round could grow the window
            if c.round_start is None and c.busy and c.can_grow():
                c.round_start, c.carried = self.now, 0.0
            elif c.round_start == self.now and not c.can_grow():
                c.round_start = None

    def _next_event(self) -> float:
        sends = (self.now + c.left / c.rate for c in self.conns if c.busy and c.rate > 0)
        rounds = (c.round_end() for c in self.conns)
        return min(min(sends, default=math.inf), min(rounds, default=math.inf),
                   self.arrivals[0][0] if self.arrivals else math.inf)

    def _advance(self, at: float) -> bool:
        """Move every rate on to the event at `at`, then handle what happens then; True where the rates must be
        redone."""
        step = at - self.now
        finished = []
        for c in self.conns:
            if not c.busy or c.rate <= 0:
                continue
            moved = min(c.left, c.rate * step)
            if self.now + c.left / c.rate <= at:  # this connection's chunk is the event (or ties with it)
                moved = c.left
            c.left -= moved
            c.carried += moved
            c.sent_bytes += moved
            if c.src == ORIGIN:
                self.origin_bytes += moved
            else:
                self.peer_bytes += moved
            if c.left <= 1e-6:
                finished.append(c)
        self.now = at
        dirty = False
        for c in finished:
            heapq.heappush(self.arrivals, (at + c.one_way_s, c.dst - 1, c.chunk, c.src))
            c.finish_chunk(at)
            dirty |= not self._assign(c)
        for c in self.conns:
            if c.round_end() <= at:
                before = c.window
                c.end_round(at)
                dirty |= c.window != before or not c.can_grow()
        while self.arrivals and self.arrivals[0][0] <= at:
            _, node, chunk, _ = heapq.heappop(self.arrivals)
            dirty |= self._arrive(node, chunk)
        return dirty

    def _arrive(self, node: int, chunk: int) -> bool:
        self.fetching[node].discard(chunk)
        self.have[node].add(chunk)
        self.got_order[node].append(chunk)
        key = (self.net.nodes[node].shard, chunk)
        self.holders[key] = self.holders.get(key, 0) + 1
        if len(self.have[node]) == len(self.sizes[node]):
            self.ready[node] = self.now
        woke = False
        if self.strategy.swarm:  # the node's peers may now fetch this chunk from it
            for c in self.conns:
                if not c.busy and c.src == node + 1:
                    woke |= self._assign(c)
        return woke

    def _assign_all(self) -> None:
        for c in self.conns:
            if not c.busy:
                self._assign(c)

    def _assign(self, c: Connection) -> bool:
        """Give an idle connection its next chunk, if there is one; True if it got one."""
        node = c.dst - 1
        chunk = self._from_origin(node) if c.src == ORIGIN else self._from_peer(c.src - 1, node)
        if chunk is None:
            return False
        self.fetching[node].add(chunk)
        c.start_chunk(self.now, chunk, self.sizes[node][chunk])
        return True

    def _from_origin(self, node: int) -> int | None:
        """The next chunk the origin has not yet sent the node (streams) or the node's group (swarm)."""
        key = min(self.group[node]) if self.strategy.swarm else node
        chunk = self.cursor.get(key, 0)
        if chunk >= len(self.sizes[node]):
            return None
        self.cursor[key] = chunk + 1
        return chunk

    def _from_peer(self, peer: int, node: int) -> int | None:
        """Rarest first among the first RAREST_WINDOW chunks the peer holds that the node neither holds nor fetches."""
        shard, best, seen = self.net.nodes[node].shard, None, 0
        order, have, fetching = self.got_order[peer], self.have[node], self.fetching[node]
        start = self.scan.get((peer, node), 0)
        while start < len(order) and (order[start] in have or order[start] in fetching):
            start += 1  # the node holds or fetches every chunk before this one, for good
        self.scan[(peer, node)] = start
        for chunk in itertools.islice(order, start, None):
            if chunk in have or chunk in fetching:
                continue
            if best is None or self.holders[(shard, chunk)] < self.holders[(shard, best)]:
                best = chunk
            seen += 1
            if seen >= RAREST_WINDOW:
                break
        return best


def chunk_sizes(n_bytes: int, chunk_bytes: int) -> list[int]:
    """A shard cut into chunks of chunk_bytes, the last one what is left."""
    full, rest = divmod(n_bytes, chunk_bytes)
    return [chunk_bytes] * full + ([rest] if rest else [])


def simulate(net: Network, strategy: Strategy, chunk_bytes: int) -> Outcome:
    return Distribution(net, strategy, chunk_bytes).run()
