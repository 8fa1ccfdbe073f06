"""The weights study's links as fluid: connections sharing bottlenecks max-min fair, each held to its TCP window.

A connection crosses two bottlenecks, its source's uplink and its destination's downlink. Between two events every
rate is constant: the rates are the max-min fair allocation (progressive filling) of the bottlenecks' capacities
among the connections that have bytes to send, each capped at its window over its round trip. This is the fluid
form of testbed.core.tcp.TcpFlow, where parallel connections queue on a link's next-free clock: here they share it
evenly instead of in FIFO turns (the same aggregate; a chunk's end differs by less than a window's turn).

The window (transport "kernel"; "tuned" has none: an infinite cap and no rounds) follows TcpFlow's rules:

    round      lasts one round trip; `carried` counts the bytes the connection sent in it.
    slow start at a round's end the window grows by `carried` when the round used more than half of it (Linux grows
               cwnd only while cwnd-limited), up to window_cap. A connection whose window cannot grow (at the cap,
               or held below half its window by its fair share) keeps no round clock; a new round starts at the
               next event that changes its rate.
    idle       a connection that had nothing to send for longer than its RTO restarts slow start: the window halves
               once per RTO idle, to no less than the initial window (tcp_cwnd_restart).

A lone connection on one link therefore sends round k's window w_k = IW 2^k at w_k / RTT, one round trip a round,
until the window fills the pipe: testbed.core.tcp.cold_transfer_s exactly, whenever the transfer outlasts slow start
(a transfer that ends inside a round sends its last bytes at w / RTT, where the closed form bursts them at the rate).
Loss is left out (each path is loss-free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Connection:
    """One TCP connection, src -> dst, over bottlenecks `links` (indices into the capacities)."""

    src: int
    dst: int
    links: tuple[int, ...]
    rtt_s: float
    one_way_s: float
    initial_window: float = math.inf  # inf: transport "tuned" (no window, no rounds)
    window_cap: float = math.inf
    rto_s: float = math.inf
    window: float = field(init=False)
    rate: float = 0.0
    left: float = 0.0  # bytes of the current chunk still to send
    chunk: int | None = None
    round_start: float | None = None  # None: no round clock (the window cannot grow now)
    carried: float = 0.0
    idle_since: float = 0.0
    sent_bytes: float = 0.0
    rounds: int = 0
    restarts: int = 0

    def __post_init__(self) -> None:
        self.window = self.initial_window

    @property
    def busy(self) -> bool:
        return self.chunk is not None

    @property
    def window_rate(self) -> float:
        if math.isinf(self.window) or self.rtt_s <= 0:
            return math.inf
        return self.window / self.rtt_s

    def can_grow(self) -> bool:
        """Would a round at the current rate grow the window? (more than half of it carried, below the cap)"""
        if math.isinf(self.window) or self.window >= self.window_cap:
            return False
        return 2 * self.rate * self.rtt_s > self.window

    def start_chunk(self, now: float, chunk: int, n_bytes: float) -> None:
        """Take a chunk to send; a connection idle longer than its RTO restarts slow start first."""
        if not self.busy:
            self._restart_if_idle(now)
        self.chunk, self.left = chunk, float(n_bytes)

    def finish_chunk(self, now: float) -> None:
        """The chunk's last byte left: the connection is idle from now until it takes another."""
        self.chunk, self.left, self.idle_since = None, 0.0, now

    def _restart_if_idle(self, now: float) -> None:
        idle = now - self.idle_since
        if math.isinf(self.window) or idle <= self.rto_s:
            return
        floor, window = min(self.initial_window, self.window), self.window
        while idle > self.rto_s and window > floor:
            window /= 2
            idle -= self.rto_s
        self.window, self.round_start, self.carried = max(window, floor), None, 0.0
        self.restarts += 1

    def end_round(self, now: float) -> None:
        """The round's ACKs are back: grow the window by what it carried if it used more than half."""
        if 2 * self.carried > self.window:
            self.window = min(self.window + self.carried, self.window_cap)
        self.rounds += 1
        self.round_start, self.carried = now, 0.0

    def round_end(self) -> float:
        return math.inf if self.round_start is None else self.round_start + self.rtt_s


def max_min_rates(connections: list[Connection], capacities: list[float]) -> None:
    """Set each busy connection's rate: the max-min fair allocation of `capacities` among them, each capped at its
    window rate (progressive filling: raise every unfrozen rate together; freeze a connection at its cap or where one
    of its bottlenecks fills). Idle connections get 0."""
    for c in connections:
        c.rate = 0.0
    unfrozen = [c for c in connections if c.busy]
    room = list(capacities)
    while unfrozen:
        users = [0] * len(room)
        for c in unfrozen:
            for b in c.links:
                users[b] += 1
        level = min(min(room[b] / n for b, n in enumerate(users) if n), min(c.window_rate for c in unfrozen))
        if math.isinf(level):
            raise ValueError("a connection with no bottleneck and no window: its rate is unbounded")
        full = {b for b, n in enumerate(users) if n and room[b] / n <= level * (1 + 1e-12)}
        keep = []
        for c in unfrozen:
            c.rate = level
            for b in c.links:
                room[b] -= level
            if c.window_rate <= level * (1 + 1e-12) or any(b in full for b in c.links):
                continue
            keep.append(c)
        for c in keep:  # still rising: give back the level, it is added again next pass
            for b in c.links:
                room[b] += level
        unfrozen = keep
