"""The run log: an append-only record of one run's laps, with O(1)-per-lap running aggregates for the exporter."""

from __future__ import annotations

import bisect
import collections
import time
from dataclasses import dataclass, field

from testbed.config import Scenario
from testbed.core.decode import MODES
from testbed.core.records import LapRecord
from testbed.core.summary import DilationSummary

DECODE_KINDS = ("decode", "spec")  # laps that produce decode tokens (prefill and probes do not)
RATE_WINDOW_LAPS = 8  # the live rate is over this many recent laps
MAX_HISTORY_POINTS = 2000
QUANTILE_WINDOW_LAPS = 4096  # exact per-hop quantiles are over this many recent decode laps
SPEC_MAX_POSITIONS = 32  # accepted-per-position counters exist up to this K


class RunningHistogram:
    """Cumulative-bucket histogram state (Prometheus semantics): observe is O(log buckets)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

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


@dataclass
class StageAggregate:
    compute: RunningHistogram
    real: RunningHistogram


@dataclass
class HopAggregate:
    latency: RunningHistogram
    bytes_total: int = 0
    window: collections.deque = field(default_factory=lambda: collections.deque(maxlen=QUANTILE_WINDOW_LAPS))


@dataclass
class ModeAggregate:
    """Decode laps of one metric kind (plain, speculative, ...)."""

    laps: int = 0
    tokens: int = 0
    lap_seconds: RunningHistogram | None = None


class RunLog:
    """Everything one run measured, appended as it happens. `summarize(log)` turns it into a RunSummary."""

    def __init__(self, scenario: Scenario, *, metrics_url: str | None = None) -> None:
        self.scenario = scenario
        self.metrics_url = metrics_url
        self.shaper = "?"
        self.shaper_reason = ""
        self.shaper_facts: dict = {}
        self.dilation: DilationSummary | None = None  # the records below are already in scenario time
        self.phase = "starting"
        self.started_at = time.monotonic()
        self.laps: list[LapRecord] = []
        self.probes: list[LapRecord] = []
        self.token_ids: list[int] = []
        self.history: collections.deque[tuple[float, float]] = collections.deque(maxlen=MAX_HISTORY_POINTS)
        self.generated_tokens: int | None = None
        self._recent: collections.deque[LapRecord] = collections.deque(maxlen=RATE_WINDOW_LAPS)
        # running aggregates, O(1) per lap: what the Prometheus collector reads at scrape time
        sc = scenario
        self.lap_buckets = latency_buckets([sc.emulated_compute_s + sc.t_ring_s])
        self.modes = {info.metric_kind: ModeAggregate(lap_seconds=RunningHistogram(self.lap_buckets))
                      for info in MODES.values()}
        compute_buckets = latency_buckets([st.compute_ms / 1e3 for st in sc.stages])
        self.stages = [StageAggregate(RunningHistogram(compute_buckets), RunningHistogram(compute_buckets))
                       for _ in sc.stages]
        self.hops = [HopAggregate(RunningHistogram(latency_buckets([link.delay_ms / 1e3])))
                     for link in sc.ring]
        self.decode_laps = 0
        self.decode_tokens = 0
        self.decode_wall_s = 0.0
        self.decode_compute_s = 0.0
        self.decode_real_s = 0.0
        self.decode_ring_s = 0.0
        self.spec_rounds = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0
        self.spec_tokens = 0  # tokens the rounds produced (accepted drafts + one each)
        self.spec_overlap_sum = 0.0
        self.spec_accepted_per_position = [0] * SPEC_MAX_POSITIONS
        self.spec_draft_seconds = RunningHistogram(self.lap_buckets)
        self.spec_last_k: int | None = None
        self.spec_draft_s_sum = 0.0
        self.spec_compute_s_sum = 0.0
        self.spec_k_counts: collections.Counter[int] = collections.Counter()  # rounds at each K

    def add_probe(self, record: LapRecord) -> None:
        self.probes.append(record)

    def add_lap(self, record: LapRecord) -> None:
        """Append one lap and update every running aggregate: O(1) in the number of laps so far."""
        self.laps.append(record)
        self.token_ids.extend(record.ids)
        compute, real = record.stage_compute_s(), record.stage_real_s()
        for aggregate, c, r in zip(self.stages, compute, real):
            aggregate.compute.observe(c)
            aggregate.real.observe(r)
        decode = record.kind in DECODE_KINDS
        for aggregate, latency, size in zip(self.hops, record.hop_latencies_s(), record.hop_bytes()):
            aggregate.latency.observe(latency)
            aggregate.bytes_total += size
            if decode:
                aggregate.window.append(latency)
        if not decode:
            return
        mode = self.modes[MODES[record.mode].metric_kind]
        mode.laps += 1
        mode.tokens += record.tokens
        mode.lap_seconds.observe(record.duration_s)
        self.decode_laps += 1
        self.decode_tokens += record.tokens
        self.decode_wall_s += record.duration_s
        self.decode_compute_s += sum(compute)
        self.decode_real_s += sum(real)
        self.decode_ring_s += record.ring_s
        if record.kind == "spec":
            k, accepted = record.extra["k"], record.extra["accepted"]
            self.spec_rounds += 1
            self.spec_draft_tokens += k
            self.spec_accepted_tokens += accepted
            self.spec_tokens += record.tokens
            self.spec_overlap_sum += record.extra["overlap_sum"]
            for position in range(min(accepted, SPEC_MAX_POSITIONS)):
                self.spec_accepted_per_position[position] += 1
            self.spec_draft_seconds.observe(record.extra["draft_s"])
            self.spec_last_k = k
            self.spec_draft_s_sum += record.extra["draft_s"]
            self.spec_compute_s_sum += sum(compute)
            self.spec_k_counts[k] += 1
        self._recent.append(record)
        rate = sum(lap.tokens for lap in self._recent) / sum(lap.duration_s for lap in self._recent)
        self.history.append((time.monotonic() - self.started_at, rate))

    @property
    def measured_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_wall_s if self.decode_wall_s > 0 else None

    @property
    def mean_compute_s(self) -> float | None:
        return self.decode_compute_s / self.decode_laps if self.decode_laps else None

    @property
    def mean_real_s(self) -> float | None:
        return self.decode_real_s / self.decode_laps if self.decode_laps else None

    @property
    def mean_ring_s(self) -> float | None:
        return self.decode_ring_s / self.decode_laps if self.decode_laps and self.scenario.n_stages > 1 else None

    @property
    def spec_alpha(self) -> float | None:
        return self.spec_overlap_sum / self.spec_draft_tokens if self.spec_draft_tokens else None

    @property
    def spec_gamma_measured(self) -> float | None:
        return self.spec_tokens / self.spec_rounds if self.spec_rounds else None
