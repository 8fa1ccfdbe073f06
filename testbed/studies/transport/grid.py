"""The transport study's grid and its predictions: which transfers it makes over which links, and what
testbed.core.tcp says each should take.

A point is one link (one-way delay, rate, loss; the ACKs take the same delay back, so RTT = 2 x delay) and one
transfer over it: S bytes on n fresh connections, S / n each, all written at once. Its prediction:

- one connection, no loss: `cold_transfer_s`, the closed form of slow start's rounds and then the link's rate;
- n connections, no loss: n windows that start together and double together on one link add up to one window of
  n x IW, capped at n x cap, so the closed form with those (`aggregate_params`);
- with loss: the model itself, `TcpFlow`, as an expectation: its mean over MODEL_SEEDS seeds (each its own draw of
  the losses; `expectation`), with that mean's standard error, and Mathis' rate beside it as S / (n x Mathis rate)
  + one way, the steady state a long transfer tends to. A lossy point is measured `repeats` times, each over a link
  with a seed of its own (`draws`): the kernel's mean over its draws is set against the model's expectation. A
  loss-free point is deterministic: one transfer.

The model column is what the virtual backend must give to 1e-6: TcpFlow replayed over the pieces the virtual
link cuts a write into (netem.userspace.RELAY_CHUNK), each connection's pieces written at once, the connections
sharing the link's next-free clock (`modelled_s`); a lossy point's is its mean over the seeds of the draws measured
(the first `repeats` of the expectation's seeds).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache

from netem.userspace import RELAY_CHUNK
from testbed.core.records import LinkSpec
from testbed.core.tcp import Bottleneck, TcpFlow, TcpParams, cold_transfer_s, link_params, mathis_rate

KiB, MiB = 2 ** 10, 2 ** 20
RTO_MS = 200.0  # the minimum RTO the links are built with (netem.base.DEFAULT_LOSS_RTO_MS, Linux's tcp_rto_min)
MAX_POINT_S = 60.0  # a point predicted to take longer is left out of the grid (said so), to keep a run's time
REPEATS = 20  # a lossy point's transfers by default: its time is heavy-tailed (a loss-free one's is deterministic: one)
# Repeat i runs over a link of seed i x SEED_STRIDE: a transfer's k-th connection draws its losses from seed + k
# (TcpFlow), so the repeats' draws never share a stream while a point has fewer connections than this.
SEED_STRIDE = 1_000
# A lossy point's prediction is the model's mean over this many seeds (0, SEED_STRIDE, ...): its time is heavy-tailed
# (a loss early in slow start leaves Reno a long climb in congestion avoidance), so a few seeds say little; at 400
# the mean's standard error is 2-4% at the grid's lossy points.
MODEL_SEEDS = 400


@dataclass(frozen=True)
class Point:
    """One transfer over one link: S bytes on n connections of S / n each."""

    delay_ms: float  # one way; RTT = 2 x delay_ms
    rate_mbit: float  # 0: unlimited
    loss_pct: float
    size_bytes: int
    connections: int = 1
    purpose: str = "grid"  # grid, ceiling (the backend's own goodput), floor (its cost a transfer), cap, slow start
    seed: int = 0  # the link's (LinkSpec.seed): the model's k-th connection over it draws its losses from seed + k

    @property
    def link(self) -> LinkSpec:
        return LinkSpec(0, 1, self.delay_ms, loss_pct=self.loss_pct, rate_mbit=self.rate_mbit, seed=self.seed)

    @property
    def link_key(self) -> tuple[float, float, float]:
        return self.delay_ms, self.rate_mbit, self.loss_pct

    @property
    def params(self) -> TcpParams:
        link = self.link
        return link_params([link], link, RTO_MS)


@dataclass(frozen=True)
class Prediction:
    """A point's predicted time, how it was had, the model's own time, Mathis' figure where there is loss, the
    model's time on each seed a lossy point is measured on (their mean is `model_s`), and the standard error of
    a lossy prediction (the model's mean over MODEL_SEEDS seeds)."""

    predicted_s: float
    how: str
    model_s: float
    mathis_s: float | None = None
    model_draws_s: tuple[float, ...] = ()
    predicted_se_s: float = 0.0


def aggregate_params(params: TcpParams, connections: int) -> TcpParams:
    """n connections that start together on one link, as one flow: their windows add up."""
    return replace(params, initial_window=connections * params.initial_window,
                   window_cap=connections * params.window_cap)


def modelled_s(point: Point) -> float:
    """TcpFlow replayed as the virtual link runs it (see the module doc): the last piece's arrival."""
    params, one_way = point.params, point.delay_ms / 1e3
    link = Bottleneck()
    each = point.size_bytes // point.connections
    last = 0.0
    for _ in range(point.connections):
        flow = TcpFlow(params, link)
        for offset in range(0, each, RELAY_CHUNK):
            last = max(last, flow.send(0.0, min(RELAY_CHUNK, each - offset)) + one_way)
    return last


def draws(point: Point, repeats: int = 1) -> list[Point]:
    """The transfers a point is measured by: a loss-free point once (it is deterministic), a lossy one `repeats`
    times, each over a link with a seed of its own (fresh connections each time, as every transfer's)."""
    if not point.loss_pct:
        return [point]
    return [replace(point, seed=point.seed + i * SEED_STRIDE) for i in range(repeats)]


@lru_cache(maxsize=None)
def expectation(point: Point, seeds: int = MODEL_SEEDS) -> tuple[float, ...]:
    """The model's time on each of `seeds` seeds of a lossy point: point.seed + i x SEED_STRIDE, as `draws`."""
    return tuple(modelled_s(replace(point, seed=point.seed + i * SEED_STRIDE)) for i in range(seeds))


def predict(point: Point, repeats: int = 1) -> Prediction:
    """The point's prediction; a lossy one's is the model's expectation (its mean over MODEL_SEEDS seeds), beside
    the model on the seeds of its `repeats` draws."""
    one_way = point.delay_ms / 1e3
    params = point.params
    if point.loss_pct:
        every = expectation(point, max(MODEL_SEEDS, repeats))
        models = every[:repeats]
        mean = sum(every) / len(every)
        se = statistics.stdev(every) / math.sqrt(len(every)) if len(every) > 1 else 0.0
        mathis = point.size_bytes / (point.connections * mathis_rate(params)) + one_way
        return Prediction(mean, f"TcpFlow, mean of {len(every)} seeds", sum(models) / len(models), mathis, models, se)
    model = modelled_s(point)
    if point.connections == 1:
        return Prediction(cold_transfer_s(point.size_bytes, params, one_way), "cold_transfer_s", model)
    both = aggregate_params(params, point.connections)
    return Prediction(cold_transfer_s(point.size_bytes, both, one_way), f"cold_transfer_s, {point.connections} x IW",
                      model)


def estimate_s(point: Point) -> float:
    """A point's time for sizing (the grid's cut, a transfer's deadline): its prediction without loss, else the
    model on the point's own seed, one draw, where the expectation takes MODEL_SEEDS runs of the model."""
    return modelled_s(point) if point.loss_pct else predict(point).predicted_s


def _points(links: list[tuple[float, float, float]], sizes: list[int], connections: tuple[int, ...],
            purpose: str = "grid") -> list[Point]:
    return [Point(d, r, l, s, n, purpose) for d, r, l in links for s in sizes for n in connections
            if s // n >= 64 * KiB]


# The grid: RTT 2-280 ms, 10-1,000 Mbit/s, loss 0-1%, 64 KiB-256 MiB, one and four connections (a representative
# subset of the product; points estimated over MAX_POINT_S are left out: `estimate_s`).
GRID_LINKS = [(1.0, 1000.0, 0.0), (10.0, 100.0, 0.0), (50.0, 10.0, 0.0), (50.0, 1000.0, 0.0), (140.0, 100.0, 0.0),
              (25.0, 100.0, 0.1), (50.0, 100.0, 1.0)]
GRID_SIZES = [64 * KiB, MiB, 16 * MiB, 256 * MiB]
QUICK_LINKS = [(10.0, 100.0, 0.0), (50.0, 1000.0, 0.0), (25.0, 100.0, 0.1)]
QUICK_SIZES = [64 * KiB, 4 * MiB]
# The window's cap: one connection at RTT 280 ms and 1,000 Mbit/s; the plateau between the two sizes is cap / RTT.
CAP_LINK = (140.0, 1000.0, 0.0)
CAP_SIZES = [64 * MiB, 256 * MiB]
# Slow start's rounds: small transfers at RTT 100 ms, where each round shows as 100 ms.
SLOW_START_LINK = (50.0, 1000.0, 0.0)
SLOW_START_SIZES = [64 * KiB, 256 * KiB, MiB, 4 * MiB]
# The backend's own ceiling: no delay, no rate limit (on netem in user-mode-linux: the guest's per-byte cost).
CEILING = Point(0.0, 0.0, 0.0, 64 * MiB, 1, "ceiling")
# The backend's own floor: the smallest transfer on the same link (the model gives it no time at all: what is
# measured is the backend's cost a transfer; inside user-mode-linux, about a millisecond).
FLOOR = Point(0.0, 0.0, 0.0, 64 * KiB, 1, "floor")


def grid(quick: bool = False, max_point_s: float = MAX_POINT_S) -> tuple[list[Point], list[Point]]:
    """(the points to measure, those left out for their predicted time), the cap's and slow start's included."""
    if quick:
        points = _points(QUICK_LINKS, QUICK_SIZES, (1, 4))
    else:
        points = (_points(GRID_LINKS, GRID_SIZES, (1, 4)) + _points([CAP_LINK], CAP_SIZES, (1,), "cap")
                  + _points([SLOW_START_LINK], SLOW_START_SIZES, (1,), "slow start"))
    points = list({(p.link_key, p.size_bytes, p.connections): p for p in reversed(points)}.values())[::-1]
    kept = [p for p in points if estimate_s(p) <= max_point_s]
    return kept, [p for p in points if p not in kept]


def rounds_of(point: Point, measured_s: float) -> float:
    """Slow start's rounds a measured time holds: what is left after the one way and the bytes at the link's rate,
    in round trips."""
    params = point.params
    serialization = point.size_bytes / params.rate_bytes_s if math.isfinite(params.rate_bytes_s) else 0.0
    return (measured_s - point.delay_ms / 1e3 - serialization) / params.rtt_s


def size_text(size: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"
