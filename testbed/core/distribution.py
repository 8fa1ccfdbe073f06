"""Closed forms of distributing a model's weights to a ring: the client-server and peer-to-peer bounds, fluid fair
sharing of one uplink, slow start's lag, and the parallel streams that make one path latency-insensitive.

Rates are bytes/s, sizes bytes, times seconds. A node i needs F_i bytes (its stage's shard) and has downlink d_i and
uplink u_i; the origin (a hub mirror) has uplink u_s. For N nodes that need the same F (Kumar & Ross, 2006):

    client-server   T >= max{ N F / u_s,  F / d_min }
    peer-to-peer    T >= max{ F / u_s,  F / d_min,  N F / (u_s + sum u_i) }

A ring needs distinct shards, so the general forms below take every node's F_i: the origin must send every distinct
byte once (sum over distinct shards), each node must take its own F_i through its downlink, and all the bytes the
nodes take must come out of some uplink. With one ring every shard is needed once, and the peer-to-peer bound is the
client-server one: peers can help only where several nodes need the same bytes (replicated stages, a second ring).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from testbed.core.tcp import TcpParams, cold_transfer_s, window_limited_rate

LATENCY_INSENSITIVE_WITHIN = 0.05  # P streams make a path latency-insensitive when they reach 95% of its rate


def client_server_bound_s(shard_bytes: Sequence[float], origin_up: float, downlinks: Sequence[float]) -> float:
    """max{ sum F_i / u_s, max F_i / d_i }: every byte leaves the origin, every node's through its own downlink."""
    return max(sum(shard_bytes) / origin_up, max(f / d for f, d in zip(shard_bytes, downlinks, strict=True)))


def p2p_bound_s(shard_bytes: Sequence[float], distinct_bytes: float, origin_up: float, downlinks: Sequence[float],
                uplinks: Sequence[float]) -> float:
    """max{ distinct / u_s, max F_i / d_i, sum F_i / (u_s + sum u_i) }: the origin sends each distinct byte at
    least once, each node takes its own, and every byte taken leaves some uplink."""
    return max(distinct_bytes / origin_up, max(f / d for f, d in zip(shard_bytes, downlinks, strict=True)),
               sum(shard_bytes) / (origin_up + sum(uplinks)))


def stream_cap(downlink: float, streams: int, params: TcpParams) -> float:
    """What one node's `streams` connections over a path can take: its downlink, or streams x the window-limited
    rate of one (window_cap / RTT under transport "kernel"; a tuned path's TcpParams has an infinite cap)."""
    return min(downlink, streams * window_limited_rate(params))


def fair_share_finish_s(sizes: Sequence[float], caps: Sequence[float], capacity: float) -> list[float]:
    """Jobs of `sizes` bytes started together on one link of `capacity`, each taking at most its cap, shared max-min
    fair (water-filling): when each finishes. Piecewise exact: between finishes every rate is constant."""
    left = [float(s) for s in sizes]
    done = [0.0 if s <= 0 else math.inf for s in sizes]
    now = 0.0
    while any(math.isinf(t) for t in done):
        active = [i for i, t in enumerate(done) if math.isinf(t)]
        rates = water_fill([caps[i] for i in active], capacity)
        step = min(left[i] / r for i, r in zip(active, rates))
        now += step
        for i, r in zip(active, rates):
            left[i] -= r * step
            if left[i] <= 1e-9 * max(1.0, sizes[i]):
                done[i] = now
    return done


def water_fill(caps: Sequence[float], capacity: float) -> list[float]:
    """Max-min fair shares of `capacity` among flows each capped: the smallest caps are met, the rest split even."""
    rates = [0.0] * len(caps)
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    left, remaining = capacity, len(caps)
    for i in order:
        share = left / remaining
        rates[i] = min(caps[i], share)
        left -= rates[i]
        remaining -= 1
    return rates


def streams_ready_s(sizes: Sequence[float], downlinks: Sequence[float], origin_up: float, streams: int,
                    params: Callable[[int, float], TcpParams], one_way_s: Sequence[float]) -> tuple[list[float], list[float]]:
    """Every node pulling its shard from one origin over `streams` connections: (each node's first rate, each node's
    ready time). The fluid schedule of each node's cap (its downlink, or the streams' windows over its round trip:
    params(node, rate)) on the origin's uplink, slow start's lag on each stream's first share, and the last chunk's
    one-way delay. The weights study's streams strategies and a run's [weights] phase both predict with it."""
    caps = [stream_cap(d, streams, params(i, d)) for i, d in enumerate(downlinks)]
    first = water_fill(caps, origin_up)
    ready = [t + slow_start_lag_s(f / streams, params(i, r / streams)) + one_way_s[i]
             for i, (t, f, r) in enumerate(zip(fair_share_finish_s(sizes, caps, origin_up), sizes, first))]
    return first, ready


def slow_start_lag_s(n_bytes: float, params: TcpParams) -> float:
    """What slow start adds to n bytes at the rate params allow (window_limited_rate): the cold transfer less the
    bytes at that rate (cold_transfer_s with its one-way delay left out)."""
    rate = window_limited_rate(params)
    if n_bytes <= 0 or math.isinf(rate) or math.isinf(params.initial_window):  # no window: no slow start
        return 0.0
    steady = TcpParams(params.rtt_s, rate, params.initial_window, max(params.window_cap, params.initial_window))
    return cold_transfer_s(n_bytes, steady, 0.0) - n_bytes / rate  # type: ignore[arg-type] - a share's bytes


def one_stream_slowdown(params: TcpParams) -> float:
    """How many times slower one stream is than its link: rate / (window_cap / RTT), 1 where the window fills the
    pipe."""
    return params.rate_bytes_s / window_limited_rate(params)


def streams_for_link(params: TcpParams, within: float = LATENCY_INSENSITIVE_WITHIN) -> int:
    """The fewest parallel streams whose window-limited rates together reach (1 - within) of the link's rate:
    ceil((1 - within) x rate x RTT / window_cap); 1 where one stream already does."""
    one = window_limited_rate(params)
    if math.isinf(params.rate_bytes_s) and math.isinf(one):
        return 1
    if math.isinf(params.rate_bytes_s):
        raise ValueError("an unlimited link with a window-limited stream: no number of streams reaches its rate")
    return max(1, math.ceil((1 - within) * params.rate_bytes_s / one - 1e-12))
