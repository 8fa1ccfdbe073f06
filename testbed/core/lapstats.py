"""Running lap statistics: what a run's summary needs from every lap, kept in memory bounded by laps' range, not count.

The run log keeps only its recent laps (RunLog.laps, a window); these totals see every lap as it arrives, so a
summary of a run longer than the window still counts, averages and takes percentiles over the whole run. Sums
are plain running sums (a mean differs from numpy's pairwise one in the last bits, which is why a run that fits
the window is summarized from its laps instead); percentiles come from a log-bucketed sketch.
"""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass

from agents.modes import decode_lap_kinds
from testbed.core.records import LapRecord

DECODE_KINDS = decode_lap_kinds()  # laps that produce decode tokens (prefill and probes do not): the modes' lap_kind
SKETCH_RELATIVE_ACCURACY = 1e-4  # a sketch's percentile is within this share of the value ...
SKETCH_RESOLUTION = 1e-6  # ... plus this much (1 us of latency): fine enough for a 130 ms hop's 0.2 ms overhead


class QuantileSketch:
    """Percentiles of any number of samples within SKETCH_RELATIVE_ACCURACY x value + SKETCH_RESOLUTION.

    DDSketch's log-spaced buckets, over log(1 + |x| / x0) with x0 = resolution / relative accuracy: buckets are
    `resolution` wide near zero and a fixed share of the value far from it. Memory grows with the samples' range,
    not their count (a hop between 0.5 and 3 ms: ~1,100 buckets at most; 125-135 ms: ~400). percentile(q)
    interpolates between order statistics as numpy's default does.
    """

    def __init__(self, relative_accuracy: float = SKETCH_RELATIVE_ACCURACY,
                 resolution: float = SKETCH_RESOLUTION) -> None:
        self._step = 2 * relative_accuracy  # a bucket's width in log(1 + |x| / x0); half of it either way
        self._x0 = resolution / relative_accuracy
        self.buckets: collections.Counter[int] = collections.Counter()
        self.count = 0

    def add(self, value: float, n: int = 1) -> None:
        """`value`, n times."""
        self.count += n
        self.buckets[round(math.copysign(math.log1p(abs(value) / self._x0), value) / self._step)] += n

    def _value(self, key: int) -> float:
        return math.copysign(self._x0 * math.expm1(abs(key) * self._step), key)

    def percentiles(self, qs: list[float]) -> list[float | None]:
        """The q-th percentiles (0-100) of the samples so far; None for each when there are none."""
        if not self.count:
            return [None for _ in qs]
        keys = sorted(self.buckets)  # ascending key is ascending value
        ends, running = [], 0
        for key in keys:
            running += self.buckets[key]
            ends.append(running)  # the bucket holds order statistics ends[j-1] .. ends[j] - 1

        def at(index: int) -> float:
            return self._value(keys[bisect.bisect_right(ends, index)])

        out = []
        for q in qs:
            rank = q / 100 * (self.count - 1)
            below = math.floor(rank)
            low, high = at(below), at(min(below + 1, self.count - 1))
            out.append(low + (high - low) * (rank - below))
        return out


@dataclass
class MeanTotal:
    total: float = 0.0
    count: int = 0

    def add(self, value: float, n: int = 1) -> None:
        """`value`, n times."""
        self.total += value * n
        self.count += n

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


class LapTotals:
    """What summarize() takes from every lap of a run, updated per lap in O(stages + hops)."""

    def __init__(self, n_hops: int) -> None:
        self.n_hops = n_hops
        self.kinds: collections.Counter[str] = collections.Counter()
        self.hop_decode = [QuantileSketch() for _ in range(n_hops)]  # decode laps that crossed the ring (> 1 stamp)
        self.hop_any = [QuantileSketch() for _ in range(n_hops)]  # laps before one did: read if none ever does
        self.decode_ring_laps = 0
        self.hop_bytes_plain = [MeanTotal() for _ in range(n_hops)]  # laps of kind "decode"
        self.hop_bytes_decode = [MeanTotal() for _ in range(n_hops)]  # laps of any DECODE_KINDS
        self.stage_compute: list[MeanTotal] = []  # per stage, over the decode laps
        self.stage_real: list[MeanTotal] = []
        self.stage_row_lengths: set[int] = set()
        self.residual = MeanTotal()  # lap time beyond compute, hops and drafting, per decode lap

    def add(self, lap: LapRecord, hops_s: list[float], hop_bytes: list[int], compute: list[float],
            real: list[float], n: int = 1) -> None:
        """One lap (n alike: one BATCH frame's streams), with the per-stage and per-hop figures the run log has already
        taken from it."""
        self.kinds[lap.kind] += n
        if not self.decode_ring_laps:  # (after the first such lap, these are never read: they stop growing)
            for sketch, latency in zip(self.hop_any, hops_s):
                sketch.add(latency, n)
        if lap.kind not in DECODE_KINDS:
            return
        if len(lap.stamps) > 1:
            self.decode_ring_laps += n
            for sketch, latency in zip(self.hop_decode, hops_s):
                sketch.add(latency, n)
        for i, size in enumerate(hop_bytes[:self.n_hops]):
            self.hop_bytes_decode[i].add(size, n)
            if lap.kind == "decode":
                self.hop_bytes_plain[i].add(size, n)
        while len(self.stage_compute) < len(compute):
            self.stage_compute.append(MeanTotal())
            self.stage_real.append(MeanTotal())
        self.stage_row_lengths.add(len(compute))
        for i, (c, r) in enumerate(zip(compute, real)):
            self.stage_compute[i].add(c, n)
            self.stage_real[i].add(r, n)
        compute_s = sum(compute)
        self.residual.add(lap.duration_s - compute_s - sum(hops_s) - lap.draft_s, n)

    def hop_percentiles_ms(self, hop: int, qs: list[float]) -> list[float | None]:
        """A hop's latency percentiles in ms over the decode laps that crossed the ring (else over every lap)."""
        sketch = (self.hop_decode if self.decode_ring_laps else self.hop_any)[hop]
        return [None if v is None else v * 1e3 for v in sketch.percentiles(qs)]

    def hop_bytes_mean(self, hop: int) -> int | None:
        """Mean bytes a hop carried per plain decode lap (else per decode lap of any kind)."""
        mean = self.hop_bytes_plain[hop].mean
        mean = mean if mean is not None else self.hop_bytes_decode[hop].mean
        return int(mean) if mean is not None else None

    def stage_mean_ms(self, stage: int, real: bool = False) -> float | None:
        totals = self.stage_real if real else self.stage_compute
        if len(self.stage_row_lengths) != 1 or stage >= len(totals):
            return None
        mean = totals[stage].mean
        return mean * 1e3 if mean is not None else None
