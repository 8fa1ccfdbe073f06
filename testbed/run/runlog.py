"""The run log: one run's recent laps (a bounded window, optionally every lap streamed to a JSONL file), with
O(1)-per-lap running aggregates for the exporter and for summaries of runs longer than the window."""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TYPE_CHECKING

from testbed.scenario.config import Scenario
from testbed.core.decode import MODES
from testbed.core.facts import PrefillChunk
from testbed.core.lapstats import DECODE_KINDS, LapTotals
from testbed.core.records import BYTES_PER_MBIT, LapRecord
from testbed.core.summary import AgentUsage, DilationSummary
from testbed.run.trace import TraceWriter
from testbed.run.trace import current as current_trace

if TYPE_CHECKING:
    from netem.base import ScheduleChange

__all__ = ["DECODE_KINDS", "LAP_WINDOW", "RunLog", "RunningHistogram", "StreamsWindow"]

LAP_WINDOW = 2048  # laps the run log keeps (a normal run fits: it is summarized from them, exactly as ever)
RATE_WINDOW_LAPS = 8  # the live rate is over this many recent laps
MAX_HISTORY_POINTS = 2000  # (and at most the window: every per-lap buffer is full once the window is)
QUANTILE_WINDOW_LAPS = 4096  # exact per-hop quantiles are over this many recent decode laps (at most the window)
SPEC_MAX_POSITIONS = 32  # accepted-per-position counters exist up to this K
STREAMS_WINDOW_LAPS_PER_STREAM = 4  # the streams gauges are over this many recent decode laps of each stream


def per_stream(mode: str) -> bool:
    """Laps of this mode feed the per-stream figures (ModeInfo.per_stream)."""
    info = MODES.get(mode)
    return info is not None and info.per_stream


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


def rate_buckets(centres_tok_s: list[float], step: float = 0.005, span: int = 8) -> tuple[float, ...]:
    """Buckets for a tokens/s histogram: 1-2-5 decades from 0.1 to 10^4, and a 0.5%-step grid around each centre.

    The grid reaches further below a centre than above it: a measured rate falls short of its closed form.
    """
    coarse = tuple(m * 10.0 ** e for e in range(-1, 5) for m in (1, 2, 5))
    fine = {round(c * (1 + step * i), 9) for c in centres_tok_s if c > 0 for i in range(-3 * span, span + 1)}
    return tuple(sorted(set(coarse) | fine))


@dataclass(frozen=True)
class StreamsWindow:
    """The streams mode over its recent decode laps (RunLog.streams_recent): what its gauges show.

    Laps end where the entry takes a stream's frame up, one token each, so the ring's aggregate rate is the
    tokens of the laps that ended after the oldest one, over the time from that end to the newest. A frame
    computed in a batch of b owns 1/b of that forward pass: summing c/b and 1/b over frames gives each
    stage's busy time and its number of passes without telling the batches apart.
    """

    span_s: float  # oldest lap end to newest lap end
    aggregate_tok_s: float
    stage_pass_s: tuple[float, ...]  # mean cost of one forward pass (batched: of the whole batch)
    stage_batch_mean: tuple[float, ...]  # mean frames per forward pass
    stage_busy: tuple[float, ...]  # share of span_s each stage computed

    @classmethod
    def of(cls, laps: Sequence[LapRecord], n_stages: int) -> "StreamsWindow | None":
        """None until the window holds two distinct lap ends."""
        if not laps:
            return None
        oldest, newest = min(lap.end for lap in laps), max(lap.end for lap in laps)
        if newest <= oldest:
            return None
        span_s = newest - oldest
        passes, pass_s, busy_s = [0.0] * n_stages, [0.0] * n_stages, [0.0] * n_stages
        for lap in laps:
            for i, (stamp, compute_s) in enumerate(zip(lap.stamps[:n_stages], lap.stage_compute_s())):
                passes[i] += 1.0 / stamp.batch
                pass_s[i] += compute_s / stamp.batch
                if lap.end > oldest:
                    busy_s[i] += compute_s / stamp.batch
        return cls(span_s, sum(lap.tokens for lap in laps if lap.end > oldest) / span_s,
                   tuple(s / n for s, n in zip(pass_s, passes)), tuple(len(laps) / n for n in passes),
                   tuple(s / span_s for s in busy_s))


@dataclass
class StageAggregate:
    compute: RunningHistogram
    real: RunningHistogram


@dataclass
class HopAggregate:
    latency: RunningHistogram
    bytes_total: int = 0
    window: collections.deque = field(default_factory=lambda: collections.deque(maxlen=QUANTILE_WINDOW_LAPS))

    @classmethod
    def over(cls, latency: RunningHistogram, window_laps: int) -> "HopAggregate":
        return cls(latency, window=collections.deque(maxlen=min(QUANTILE_WINDOW_LAPS, window_laps)))


@dataclass
class ModeAggregate:
    """Decode laps of one metric kind (plain, speculative, ...)."""

    laps: int = 0
    tokens: int = 0
    lap_seconds: RunningHistogram | None = None


class RunLog:
    """Everything one run measured, appended as it happens. `summarize(log)` turns it into a RunSummary.

    Memory is bounded by `window_laps`, not by the run's length: the latest laps (and every per-lap buffer) are
    kept up to it; counts, sums, histograms and sketches (LapTotals) cover every lap; the first prompt's laps and
    the token ids are kept whole. With `lap_log`, every lap is also written to that file as it arrives.
    """

    def __init__(self, scenario: Scenario, *, metrics_url: str | None = None, lap_log: Path | None = None,
                 window_laps: int = LAP_WINDOW, trace: TraceWriter | None = None) -> None:
        """lap_log: a file every lap is appended to as one JSON line (LapRecord.to_json) as it arrives. trace:
        a timeline every lap is added to (testbed.run.trace; default: that of the `tracing` block this is made in)."""
        self.scenario = scenario
        self.trace = trace if trace is not None else current_trace()
        self.metrics_url = metrics_url
        self.shaper = "?"
        self.shaper_reason = ""
        self.shaper_facts: dict = {}
        self.dilation: DilationSummary | None = None  # the records below are already in scenario time
        self.phase = "starting"
        self.schedule_origin: float | None = None  # box time the link schedule counts from (the agents' run)
        # the run's clock, on which schedule_origin is: the box's, or (a simulated run, netem.virtual) the last
        # simulated moment the launcher saw
        self.now: Callable[[], float] = time.monotonic
        self.schedule_changes: list[ScheduleChange] = []  # Shaper.schedule_changes: when each change took effect
        self.started_at = time.monotonic()
        self.laps: collections.deque[LapRecord] = collections.deque(maxlen=window_laps)  # the latest laps
        self.lap_count = 0  # laps added, those the window has dropped included
        self.first_prompt: list[LapRecord] = []  # the first prefill lap, or its chunks: the TTFT's laps, kept
        self.totals = LapTotals(len(scenario.ring))  # what the summary needs from every lap
        self.probes: list[LapRecord] = []
        self.token_ids: list[int] = []  # the first stream's tokens: the run's text (ids < 256 are shared ints)
        self.stream_ids: dict[int, list[int]] = {}  # the streams mode: every stream's tokens, in lap order
        self.lap_log = lap_log
        self._lap_file = lap_log.open("a", encoding="utf-8") if lap_log is not None else None
        self.history: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=min(MAX_HISTORY_POINTS, window_laps))
        self.generated_tokens: int | None = None
        self.agent_usage: dict[int, AgentUsage] = {}  # stage -> what the agent reported at its end
        # link name -> (mean propagation delay its chunks drew, s, box time; chunks): Shaper.realized_propagation
        self.propagation: dict[str, tuple[float, int]] = {}
        self._recent: collections.deque[LapRecord] = collections.deque(maxlen=RATE_WINDOW_LAPS)
        # running aggregates, O(1) per lap: what the Prometheus collector reads at scrape time
        sc = scenario
        self.lap_buckets = latency_buckets([sc.emulated_compute_s + sc.t_ring_s])
        self.modes = {info.metric_kind: ModeAggregate(lap_seconds=RunningHistogram(self.lap_buckets))
                      for info in MODES.values()}
        compute_buckets = latency_buckets([st.cost_ms() / 1e3 for st in sc.stages])
        self.stages = [StageAggregate(RunningHistogram(compute_buckets), RunningHistogram(compute_buckets))
                       for _ in sc.stages]
        self.hops = [HopAggregate.over(RunningHistogram(latency_buckets([link.delay_ms / 1e3])), window_laps)
                     for link in sc.ring]
        self.decode_laps = 0
        self.decode_tokens = 0
        self.decode_wall_s = 0.0
        self.decode_compute_s = 0.0
        self.decode_real_s = 0.0
        self.decode_ring_s = 0.0
        self.decode_hop_bytes = [0] * len(sc.ring)  # bytes each hop carried for the decode laps
        self.hop_rates_bytes_s = [link.rate_mbit * BYTES_PER_MBIT for link in sc.ring]  # 0: unlimited
        self._init_mode_aggregates(sc, compute_buckets)

    def _init_mode_aggregates(self, sc: Scenario, compute_buckets: tuple[float, ...]) -> None:
        """The speculative rounds' and the streams mode's running aggregates."""
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
        # the streams mode: tokens per stream (prefills included) to count the finished ones, and its decode laps
        self.stream_tokens: collections.Counter[int] = collections.Counter()
        self.streams_finished = 0
        self.streams_recent: collections.deque[LapRecord] = collections.deque(
            maxlen=STREAMS_WINDOW_LAPS_PER_STREAM * sc.decode.streams)
        lone_lap_s = sc.emulated_compute_s + sc.t_ring_s  # a stream alone on the ring laps in C + T_ring
        self.stream_rate = RunningHistogram(rate_buckets([1.0 / lone_lap_s] if lone_lap_s > 0 else []))
        self.stage_queue = [RunningHistogram(compute_buckets) for _ in sc.stages]

    @property
    def complete(self) -> bool:
        """Whether the window still holds every lap of the run."""
        return len(self.laps) == self.lap_count

    def close(self) -> None:
        """Close the lap log file (laps are written through as they arrive; this only releases it)."""
        if self._lap_file is not None:
            self._lap_file.close()
            self._lap_file = None

    @property
    def streams_in_flight(self) -> int:
        """decode.streams less the streams that have produced all their decode.tokens tokens."""
        return self.scenario.decode.streams - self.streams_finished

    def add_probe(self, record: LapRecord) -> None:
        self.probes.append(record)

    def add_lap(self, record: LapRecord) -> None:
        """Append one lap and update every running aggregate: O(1) in the number of laps so far."""
        self.laps.append(record)
        self.lap_count += 1
        if self._lap_file is not None:
            self._lap_file.write(record.to_json() + "\n")
            self._lap_file.flush()
        if self.trace is not None:
            self.trace.add(record, self.scenario, phase=f"{self.scenario.name} {record.mode}")
        if record.kind == "prefill" and not self._first_prompt_done():
            self.first_prompt.append(record)
        if per_stream(record.mode):
            self.stream_ids.setdefault(record.stream, []).extend(record.ids)
            before = self.stream_tokens[record.stream]
            self.stream_tokens[record.stream] += record.tokens
            if before < self.scenario.decode.tokens <= before + record.tokens:
                self.streams_finished += 1
        if record.stream == 0:  # the run's text is the first stream's (the streams summary has every stream's)
            self.token_ids.extend(record.ids)
        compute, real = record.stage_compute_s(), record.stage_real_s()
        hops_s, hop_bytes = record.hop_latencies_s(), record.hop_bytes()
        self.totals.add(record, hops_s, hop_bytes, compute, real)
        for aggregate, c, r in zip(self.stages, compute, real):
            aggregate.compute.observe(c)
            aggregate.real.observe(r)
        decode = record.kind in DECODE_KINDS
        for aggregate, latency, size in zip(self.hops, hops_s, hop_bytes):
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
        self.decode_ring_s += sum(hops_s)
        for i, size in enumerate(hop_bytes[:len(self.decode_hop_bytes)]):
            self.decode_hop_bytes[i] += size
        if record.kind == "spec":
            self._add_spec(record, compute)
        if per_stream(record.mode):
            self._add_streams_lap(record)
        self._recent.append(record)
        recent_s = sum(lap.duration_s for lap in self._recent)
        if recent_s > 0:  # laps of zero length (compute_ms = 0 on zero-delay links, simulated) have no rate
            self.history.append((time.monotonic() - self.started_at, sum(lap.tokens for lap in self._recent) / recent_s))

    def _add_spec(self, record: LapRecord, compute: list[float]) -> None:
        """One speculation round into the speculative aggregates."""
        k, accepted = record.facts.k, record.facts.accepted
        self.spec_rounds += 1
        self.spec_draft_tokens += k
        self.spec_accepted_tokens += accepted
        self.spec_tokens += record.tokens
        self.spec_overlap_sum += record.facts.overlap_sum
        for position in range(min(accepted, SPEC_MAX_POSITIONS)):
            self.spec_accepted_per_position[position] += 1
        self.spec_draft_seconds.observe(record.facts.draft_s)
        self.spec_last_k = k
        self.spec_draft_s_sum += record.facts.draft_s
        self.spec_compute_s_sum += sum(compute)
        self.spec_k_counts[k] += 1

    def _add_streams_lap(self, record: LapRecord) -> None:
        """One decode lap of the streams mode into its window, rate and queueing aggregates."""
        self.streams_recent.append(record)
        if record.duration_s > 0:
            self.stream_rate.observe(record.tokens / record.duration_s)
        for histogram, wait_s in zip(self.stage_queue, record.stage_queue_s()):
            histogram.observe(wait_s)

    def _first_prompt_done(self) -> bool:
        if not self.first_prompt:
            return False
        last = self.first_prompt[-1].facts
        return not isinstance(last, PrefillChunk) or last.chunk + 1 >= last.chunks

    def streams_window(self) -> StreamsWindow | None:
        """The streams gauges' figures over streams_recent (computed at scrape time, not per lap)."""
        return StreamsWindow.of(self.streams_recent, self.scenario.n_stages)

    @property
    def measured_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_wall_s if self.decode_wall_s > 0 else None

    @property
    def mean_compute_s(self) -> float | None:
        return self.decode_compute_s / self.decode_laps if self.decode_laps else None

    @property
    def serialization_s(self) -> float:
        """Per decode lap: each hop's mean bytes at its rate, summed over the hops (0 where rates are unlimited)."""
        if not self.decode_laps:
            return 0.0
        return sum(b / self.decode_laps / r for b, r in zip(self.decode_hop_bytes, self.hop_rates_bytes_s) if r > 0)

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
