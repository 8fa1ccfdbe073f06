"""The weights study's simulation: chunks of every node's shard over fluid TCP connections, on simulated time.

Endpoint 0 is the origin (a hub mirror), 1..N the nodes. Every node's shard is cut into chunks (the last one short);
a chunk is usable at its node one one-way delay after its last byte left the source, and a node is ready when it
holds all its chunks. Requests are pipelined: a connection that finishes a chunk starts its next at once, with no
round trip for the request.

Strategies (Strategy):
    streams    each node opens `origin_streams` connections to the origin; a free one takes the node's next chunk
               (one stream: P = 1; parallel range requests as exo's downloader: P = 8).
    swarm      nodes that need the same shard (a stage replicated over several rings) form a group. Each node keeps
               `origin_streams` connections to the origin and one connection from each group peer, which fetches,
               rarest first (fewest holders in the group, among the first RAREST_WINDOW candidates in the order the
               peer got them), a chunk the peer holds that the node neither holds nor is fetching. What the origin
               sends depends on which term of the peer-to-peer bound binds (origin_assists):
               - its uplink (F / u_s): each chunk to the group once, in order (one copy; the peers carry the rest);
               - the peers' uplinks (N F / (u_s + sum u_i)): Kumar & Ross's schedule, chunk by chunk. A node gets a
                 fresh chunk (one no node of its group holds or fetches, from the front of the shard) while what it
                 has to forward would last less than SEED_LEAD chunks at an origin stream's share; otherwise the
                 origin sends it a second copy of a chunk it lacks, from the back of the shard (where the fresh chunks
                 have not reached, so it takes least from what the peers could give), and only to the group with the
                 most bytes left per its own uplinks (within NEEDIEST: a group that finishes early leaves its uplinks
                 idle). Endgame: a node that holds or fetches every chunk has the origin fetch again the chunk whose
                 peer connection will finish last; the first copy to arrive cancels the other (BitTorrent's endgame
                 cancels the same way). The origin's bytes are then more than one copy, every uplink stays busy from
                 the first chunk's arrival, and the ring is ready within that start and one chunk of the bound.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from testbed.studies.weights.fluid import Connection, max_min_rates

SEED_LEAD = 2.0  # origin assist: a node gets a fresh chunk while its forwarding would last under this many chunks
                 # at an origin stream's share (a request's wait for a free stream, then the chunk's own transfer)
NEEDIEST = 0.05  # origin assist: second copies go to groups within 5% of the most bytes left per own uplink
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
        self.assist = strategy.swarm and origin_assists(net)
        self.need: dict[int, int] = {}  # node -> below it, the chunks it may lack (origin assist, from the back)
        self.seeded: list[list[int]] = [[] for _ in range(n)]  # fresh chunks the origin sent each node (assist)
        self.chunk_bytes = chunk_bytes
        keys = {min(g) for g in self.group}  # a group by its first node
        self.group_left = {k: float(sum(sum(self.sizes[j]) for j in self.group[k])) for k in keys}  # bytes to arrive
        self.group_up = {k: sum(net.nodes[j].up_bytes_s for j in self.group[k]) for k in keys}
        self.lead_s = SEED_LEAD * chunk_bytes / (net.origin_up_bytes_s / (n * strategy.origin_streams))
        self.doubled: set[tuple[int, int]] = set()  # (node, chunk) fetched from a peer and the origin at once
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
        if chunk in self.have[node]:
            return False  # the endgame's slower copy, whose last byte left before the first arrived
        woke = self._cancel_double(node, chunk) if (node, chunk) in self.doubled else False
        self.fetching[node].discard(chunk)
        self.have[node].add(chunk)
        self.got_order[node].append(chunk)
        key = (self.net.nodes[node].shard, chunk)
        self.holders[key] = self.holders.get(key, 0) + 1
        if len(self.have[node]) == len(self.sizes[node]):
            self.ready[node] = self.now
        self.group_left[min(self.group[node])] -= self.sizes[node][chunk]
        if self.strategy.swarm:  # the node's peers may now fetch this chunk from it
            for c in self.conns:
                if not c.busy and (c.src == node + 1 or (self.assist and c.src == ORIGIN)):  # the neediest moved
                    woke |= self._assign(c)
        return woke

    def _assign_all(self) -> None:
        for c in self.conns:
            if not c.busy:
                self._assign(c)

    def _assign(self, c: Connection) -> bool:
        """Give an idle connection its next chunk, if there is one; True if it got one."""
        node = c.dst - 1
        if c.src != ORIGIN:
            chunk = self._from_peer(c.src - 1, node)
        else:
            chunk = self._assisted(node) if self.assist else self._from_origin(node)
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

    def _assisted(self, node: int) -> int | None:
        """The origin's next chunk for the node where it sends more than one copy: a fresh chunk while the node's
        forwarding would last under SEED_LEAD chunks at an origin stream's share; else, for the neediest groups, a
        second copy from the back of the shard, else the endgame (module doc)."""
        chunk = None
        if self._backlog(node) * self.chunk_bytes / self.net.nodes[node].up_bytes_s < self.lead_s:
            chunk = self._fresh(node)
        if chunk is not None or not self._neediest(node):
            return chunk
        chunk = self._direct(node)
        return chunk if chunk is not None else self._endgame(node)

    def _neediest(self, node: int) -> bool:
        """Whether the node's group has, within NEEDIEST, the most left per its own uplinks of any group."""
        need = {g: left / self.group_up[g] for g, left in self.group_left.items()}
        return need[min(self.group[node])] >= (1 - NEEDIEST) * max(need.values())

    def _backlog(self, node: int) -> int:
        """What the node's uplink has yet to forward of the fresh chunks it got: (chunk, peer) pairs the peer neither
        holds nor fetches."""
        peers = [j for j in self.group[node] if j != node]
        missing = [(c, sum(c not in self.have[j] and c not in self.fetching[j] for j in peers))
                   for c in self.seeded[node]]
        self.seeded[node] = [c for c, m in missing if m]
        return sum(m for _, m in missing)

    def _fresh(self, node: int) -> int | None:
        """The group's first chunk no node of it holds or fetches: the origin's one copy of it, to this node."""
        group = self.group[node]
        key, size = min(group), len(self.sizes[node])
        chunk = self.cursor.get(key, 0)
        while chunk < size and any(chunk in self.have[j] or chunk in self.fetching[j] for j in group):
            chunk += 1
        self.cursor[key] = chunk + 1
        if chunk >= size:
            return None
        self.seeded[node].append(chunk)
        return chunk

    def _direct(self, node: int) -> int | None:
        """The last chunk of the shard the node neither holds nor fetches: the origin's second copies come from the
        back, where the fresh chunks (from the front) have not reached, so they take the least from what the peers
        could give."""
        chunk = self.need.get(node, len(self.sizes[node])) - 1
        while chunk >= 0 and (chunk in self.have[node] or chunk in self.fetching[node]):
            chunk -= 1
        self.need[node] = max(chunk, 0)
        return chunk if chunk >= 0 else None

    def _endgame(self, node: int) -> int | None:
        """The node holds or fetches every chunk: the origin fetches again the one whose peer connection will finish
        last (the most seconds left at its rate), once; the first copy to arrive cancels the other."""
        slow = [c for c in self.conns if c.busy and c.dst == node + 1 and c.src != ORIGIN
                and (node, c.chunk) not in self.doubled]
        if not slow:
            return None
        chunk = max(slow, key=lambda c: c.left / c.rate if c.rate > 0 else math.inf).chunk
        self.doubled.add((node, chunk))  # type: ignore[arg-type]
        return chunk

    def _cancel_double(self, node: int, chunk: int) -> bool:
        """The first copy of a doubled chunk arrived: the connection still sending the other stops (its bytes so far
        wasted, counted where they left) and takes another chunk."""
        self.doubled.discard((node, chunk))
        woke = False
        for c in self.conns:
            if c.busy and c.dst == node + 1 and c.chunk == chunk:
                c.finish_chunk(self.now)
                self._assign(c)
                woke = True  # a rate changed either way
        return woke

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


def distinct_bytes(net: Network) -> float:
    """What the origin must send at least once: each shard's bytes, once however many nodes need it."""
    return float(sum({nd.shard: nd.shard_bytes for nd in net.nodes}.values()))


def origin_assists(net: Network) -> bool:
    """Whether the swarm's origin sends more than one copy: where the peers' uplinks bind the peer-to-peer bound,
    i.e. every node's bytes over u_s + the uplinks of nodes that have group peers take longer than the origin's one
    copy over u_s (Kumar & Ross's schedule then serves the rest of u_s to the nodes directly)."""
    shards = [nd.shard for nd in net.nodes]
    peers_up = sum(nd.up_bytes_s for nd in net.nodes if shards.count(nd.shard) > 1)
    total = sum(nd.shard_bytes for nd in net.nodes)
    return total / (net.origin_up_bytes_s + peers_up) > distinct_bytes(net) / net.origin_up_bytes_s


def chunk_sizes(n_bytes: int, chunk_bytes: int) -> list[int]:
    """A shard cut into chunks of chunk_bytes, the last one what is left."""
    full, rest = divmod(n_bytes, chunk_bytes)
    return [chunk_bytes] * full + ([rest] if rest else [])


def simulate(net: Network, strategy: Strategy, chunk_bytes: int) -> Outcome:
    return Distribution(net, strategy, chunk_bytes).run()
