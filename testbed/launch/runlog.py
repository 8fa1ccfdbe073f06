"""The run log: one run's recent laps (a bounded window, optionally every lap streamed to a JSONL file), with
O(1)-per-lap running aggregates for the exporter and for summaries of runs longer than the window."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TYPE_CHECKING

from agents.modes import MODES, parts, per_stream
from testbed.core.facts import PrefillChunk
from testbed.core.lapstats import DECODE_KINDS, LapTotals
from testbed.core import tcp
from testbed.core.records import BYTES_PER_MBIT, LapRecord
from testbed.core.summary import AgentUsage, DilationSummary
from testbed.launch.histogram import RunningHistogram, latency_buckets
from testbed.launch.trace import TraceWriter
from testbed.launch.trace import current as current_trace
from testbed.scenario.config import Scenario

if TYPE_CHECKING:
    from netem.base import ScheduleChange

__all__ = ["DECODE_KINDS", "LAP_WINDOW", "RunLog", "RunningHistogram", "latency_buckets"]

LAP_WINDOW = 2048  # laps the run log keeps (a normal run fits: it is summarized from them, exactly as ever)
RATE_WINDOW_LAPS = 8  # the live rate is over this many recent laps
MAX_HISTORY_POINTS = 2000  # (and at most the window: every per-lap buffer is full once the window is)
QUANTILE_WINDOW_LAPS = 4096  # exact per-hop quantiles are over this many recent decode laps (at most the window)


def read_lap_log(path: Path) -> list[LapRecord]:
    """Every lap a run streamed to `path` (RunLog's lap_log, the CLI's --lap-log), in the order it was added."""
    return [LapRecord.from_json(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def lap_parts() -> list[type]:
    """Every registered mode's run-log part (its metrics module's PART), fed every lap; the collector asks each for
    its Prometheus families. A part has a `name` (its key in RunLog.parts), `__init__(scenario, lap_buckets,
    compute_buckets)`, `add(records, compute, decode)` (a batch of alike laps: RunLog.add_laps; it keeps those it
    wants) and `metrics(logs, current)` (its families over every phase's run log); it may have
    `predicted_tok_s(log)`, the run's headline prediction once it has one (testbed.launch.predict)."""
    return [module.PART for module in parts("metrics")]


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
        a timeline every lap is added to (testbed.launch.trace; default: that of the `tracing` block this is made in)."""
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
        self.weights = None  # [weights]: the run's first phase (testbed.launch.weights.WeightsPhase)
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
        # transport "kernel": every frame replayed through each hop's TCP flow; the decode laps' time on the links
        self.flows = tcp.HopFlows(sc.links, sc.ring, sc.loss_rto_ms) if sc.transport == "kernel" else None
        self.decode_transfer_s = 0.0
        self.span = [float("inf"), float("-inf")]  # the first lap's start and the last lap's end: the run's span
        # the modes' own running aggregates (each mode's metrics.PART: lap_parts()), each fed every lap, by name
        self.parts = {part.name: part(sc, self.lap_buckets, compute_buckets) for part in lap_parts()}

    @property
    def complete(self) -> bool:
        """Whether the window still holds every lap of the run."""
        return len(self.laps) == self.lap_count

    def close(self) -> None:
        """Close the lap log file (laps are written through as they arrive; this only releases it)."""
        if self._lap_file is not None:
            self._lap_file.close()
            self._lap_file = None

    def add_probe(self, record: LapRecord) -> None:
        self.probes.append(record)
        self._replay(record)

    def _replay(self, frame: LapRecord) -> list[float]:
        """Feed one frame (a lap, or a BATCH frame's laps) to the hops' TCP flows under transport "kernel"."""
        if self.flows is None or len(frame.stamps) < 2:
            return []
        return self.flows.feed([stamp.send for stamp in frame.stamps], frame.hop_bytes())

    def add_lap(self, record: LapRecord) -> None:
        """Append one lap and update every running aggregate: O(1) in the number of laps so far."""
        self.add_laps([record])

    def add_laps(self, records: list[LapRecord]) -> None:
        """Append laps alike but for their lap, stream, ids and tokens (one lap, or one BATCH frame's streams:
        testbed.core.records.expand_laps): what the stamps say is taken from the first once and counted for each, so
        a batch of M laps costs O(M + stages), not O(M x stages)."""
        first, n = records[0], len(records)
        keep_streams = per_stream(first.mode)  # every stream's tokens kept (the streams summary's texts)
        self.span = [min(self.span[0], first.start), max(self.span[1], max(record.end for record in records))]
        self.laps.extend(records)
        self.lap_count += n
        for record in records:
            if self._lap_file is not None:
                self._lap_file.write(record.to_json() + "\n")
            if self.trace is not None:
                self.trace.add(record, self.scenario, phase=f"{self.scenario.name} {record.mode}")
            if record.kind == "prefill" and not self._first_prompt_done():
                self.first_prompt.append(record)
            if keep_streams:
                self.stream_ids.setdefault(record.stream, []).extend(record.ids)
            if record.stream == 0:  # the run's text is the first stream's (the streams summary has every stream's)
                self.token_ids.extend(record.ids)
        if self._lap_file is not None:
            self._lap_file.flush()
        compute, real = first.stage_compute_s(), first.stage_real_s()
        hops_s, hop_bytes = first.hop_latencies_s(), first.hop_bytes()
        transfers = self._replay(first)
        self.totals.add(first, hops_s, hop_bytes, compute, real, n)
        decode = first.kind in DECODE_KINDS
        for part in self.parts.values():
            part.add(records, compute, decode)
        for aggregate, c, r in zip(self.stages, compute, real):
            aggregate.compute.observe(c, n)
            aggregate.real.observe(r, n)
        for aggregate, latency, size in zip(self.hops, hops_s, hop_bytes):
            aggregate.latency.observe(latency, n)
            aggregate.bytes_total += size  # the laps' one frame crossed the hop once
            if decode:
                aggregate.window.extend([latency] * n)
        if decode:
            self._add_decode(records, compute, real, hops_s, hop_bytes)
            self.decode_transfer_s += sum(transfers) * n

    def _add_decode(self, records: list[LapRecord], compute: list[float], real: list[float], hops_s: list[float],
                    hop_bytes: list[int]) -> None:
        first, n = records[0], len(records)
        tokens = sum(record.tokens for record in records)
        mode = self.modes[MODES[first.mode].metric_kind]
        mode.laps += n
        mode.tokens += tokens
        mode.lap_seconds.observe(first.duration_s, n)
        self.decode_laps += n
        self.decode_tokens += tokens
        self.decode_wall_s += first.duration_s * n
        self.decode_compute_s += sum(compute) * n
        self.decode_real_s += sum(real) * n
        self.decode_ring_s += sum(hops_s) * n
        for i, size in enumerate(hop_bytes[:len(self.decode_hop_bytes)]):
            self.decode_hop_bytes[i] += size * n
        self._recent.extend(records)
        recent_s = sum(lap.duration_s for lap in self._recent)
        if recent_s > 0:  # laps of zero length (compute_ms = 0 on zero-delay links, simulated) have no rate
            self.history.append((time.monotonic() - self.started_at, sum(lap.tokens for lap in self._recent) / recent_s))

    def _first_prompt_done(self) -> bool:
        if not self.first_prompt:
            return False
        last = self.first_prompt[-1].facts
        return not isinstance(last, PrefillChunk) or last.chunk + 1 >= last.chunks

    @property
    def measured_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_wall_s if self.decode_wall_s > 0 else None

    @property
    def mean_compute_s(self) -> float | None:
        return self.decode_compute_s / self.decode_laps if self.decode_laps else None

    @property
    def serialization_s(self) -> float:
        """Per decode lap: each hop's mean bytes at its rate, summed over the hops (0 where rates are unlimited);
        under transport "kernel" the mean time TCP's window kept the laps' frames on the links (tcp.HopFlows)."""
        if not self.decode_laps:
            return 0.0
        if self.flows is not None:
            return self.decode_transfer_s / self.decode_laps
        return sum(b / self.decode_laps / r for b, r in zip(self.decode_hop_bytes, self.hop_rates_bytes_s) if r > 0)

    @property
    def mean_real_s(self) -> float | None:
        return self.decode_real_s / self.decode_laps if self.decode_laps else None

    @property
    def mean_ring_s(self) -> float | None:
        return self.decode_ring_s / self.decode_laps if self.decode_laps and self.scenario.n_stages > 1 else None
