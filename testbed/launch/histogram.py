"""Running Prometheus-style histograms and the bucket grids a run's figures need (the run log's and its parts')."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


class RunningHistogram:
    """Cumulative-bucket histogram state (Prometheus semantics): observe is O(log buckets)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """`value`, n times."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def buckets(self) -> list[tuple[str, int]]:
        """[(upper bound, cumulative count)], ending with +Inf, as prometheus_client's HistogramMetricFamily wants."""
        out, running = [], 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


def latency_buckets(centres_s: list[float], step: float = 0.005, span: int = 8) -> tuple[float, ...]:
    """Buckets for one run: a +-0.5%-step grid around each configured value, plus coarse decades for tails.

    histogram_quantile interpolates linearly inside a bucket, so a constant 130 ms in a 100-150 ms bucket
    reads 125 ms; with 0.5% steps around 130 ms it reads within 0.65 ms. (Exact quantiles are exported as
    gauges as well; these buckets keep rate() and heatmaps honest.)
    """
    coarse = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
    fine = {round(c * (1 + step * i), 9) for c in centres_s if c > 0 for i in range(-span, 3 * span + 1)}
    return tuple(sorted(set(coarse) | fine))


def rate_buckets(centres_tok_s: list[float], step: float = 0.005, span: int = 8) -> tuple[float, ...]:
    """Buckets for a tokens/s histogram: 1-2-5 decades from 0.1 to 10^4, and a 0.5%-step grid around each centre.

    The grid reaches further below a centre than above it: a measured rate falls short of its closed form.
    """
    coarse = tuple(m * 10.0 ** e for e in range(-1, 5) for m in (1, 2, 5))
    fine = {round(c * (1 + step * i), 9) for c in centres_tok_s if c > 0 for i in range(-3 * span, span + 1)}
    return tuple(sorted(set(coarse) | fine))




def merge(histograms: Sequence[RunningHistogram]) -> tuple[list[tuple[str, int]], float]:
    """Buckets and sum of several histograms over the same bounds (the phases of one scenario)."""
    first = histograms[0]
    merged = RunningHistogram(first.bounds)
    for h in histograms:
        if h.bounds != first.bounds:
            raise ValueError("phases under one exporter must share their histogram buckets (same network)")
        merged.counts = [a + b for a, b in zip(merged.counts, h.counts)]
        merged.sum += h.sum
    return merged.buckets(), merged.sum
