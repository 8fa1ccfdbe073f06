"""The streams mode's part of the run log (StreamsRecent: its recent decode laps, rate and queueing, O(1) a lap) and
its Prometheus families.

The streams mode (M sequences in flight) never labels by stream (M is unbounded): its gauges are over the
current phase's latest STREAMS_WINDOW_LAPS_PER_STREAM x M decode laps (StreamsWindow), and its histograms
observe once per decode lap (a stream's rate over that lap: tokens / lap time; each stage's queueing).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from agents.modes import per_stream
from agents.modes.streams.summary import predicted_rates
from testbed.core.records import LapRecord, alike_runs
from testbed.launch.histogram import RunningHistogram, merge, rate_buckets
from testbed.scenario.config import Scenario

STREAMS_WINDOW_LAPS_PER_STREAM = 4  # the streams gauges are over this many recent decode laps of each stream


@dataclass(frozen=True)
class StreamsWindow:
    """The streams mode over its recent decode laps (StreamsRecent.recent): what its gauges show.

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
        for run in alike_runs(laps):  # the laps of one BATCH frame: their stamps read once
            lap, count = run[0], len(run)
            for i, (stamp, compute_s) in enumerate(zip(lap.stamps[:n_stages], lap.stage_compute_s())):
                passes[i] += count / stamp.batch
                pass_s[i] += count * compute_s / stamp.batch
                if lap.end > oldest:
                    busy_s[i] += count * compute_s / stamp.batch
        return cls(span_s, sum(lap.tokens for lap in laps if lap.end > oldest) / span_s,
                   tuple(s / n for s, n in zip(pass_s, passes)), tuple(len(laps) / n for n in passes),
                   tuple(s / span_s for s in busy_s))


class StreamsRecent:
    """The laps of a per-stream mode (ModeInfo.per_stream): how many streams finished, the recent decode laps the
    gauges read, and the histograms of a stream's rate over a lap and of each stage's queueing."""

    name = "streams"

    def __init__(self, scenario: Scenario, lap_buckets: tuple[float, ...], compute_buckets: tuple[float, ...]) -> None:
        self.scenario = scenario
        self.tokens: collections.Counter[int] = collections.Counter()  # per stream, prefills included
        self.finished = 0
        self.recent: collections.deque[LapRecord] = collections.deque(
            maxlen=STREAMS_WINDOW_LAPS_PER_STREAM * scenario.decode.streams)
        lone_lap_s = scenario.emulated_compute_s + scenario.t_ring_s  # a stream alone on the ring laps in C + T_ring
        self.stream_rate = RunningHistogram(rate_buckets([1.0 / lone_lap_s] if lone_lap_s > 0 else []))
        self.stage_queue = [RunningHistogram(compute_buckets) for _ in scenario.stages]

    def add(self, records: list[LapRecord], compute: list[float], decode: bool) -> None:
        """Laps of the run, alike but for their stream (RunLog.add_laps): a per-stream mode's count toward each
        stream's tokens, and decode laps feed the window and the histograms."""
        first = records[0]
        if not per_stream(first.mode):
            return
        for record in records:
            before = self.tokens[record.stream]
            self.tokens[record.stream] += record.tokens
            if before < self.scenario.decode.tokens <= before + record.tokens:
                self.finished += 1
        if not decode:
            return
        self.recent.extend(records)
        if first.duration_s > 0:
            for record in records:
                self.stream_rate.observe(record.tokens / first.duration_s)
        for histogram, wait_s in zip(self.stage_queue, first.stage_queue_s()):
            histogram.observe(wait_s, len(records))

    @property
    def in_flight(self) -> int:
        """decode.streams less the streams that have produced all their decode.tokens tokens."""
        return self.scenario.decode.streams - self.finished

    def window(self) -> StreamsWindow | None:
        """The gauges' figures over the recent laps (computed at scrape time, not per lap)."""
        return StreamsWindow.of(self.recent, self.scenario.n_stages)

    @staticmethod
    def metrics(logs: Sequence[Any], current: Any) -> Iterator[Metric]:
        """Histograms over every phase's run log (`logs`, the current phase's last), gauges of the current phase's
        recent laps (a per-stream mode only)."""
        parts: list[StreamsRecent] = [log.parts[StreamsRecent.name] for log in logs]
        now: StreamsRecent = current.parts[StreamsRecent.name]
        stages = [stage.name for stage in current.scenario.stages]
        buckets, total = merge([part.stream_rate for part in parts])
        rate = HistogramMetricFamily("testbed_stream_rate_tokens_per_second",
                                     "Streams mode: one stream's decode rate over one lap (tokens / lap time), "
                                     "observed once per decode lap")
        rate.add_metric([], buckets, total)
        queue = HistogramMetricFamily("testbed_stage_queue_seconds",
                                      "Streams mode: how long a frame waited at a stage before its forward pass",
                                      labels=["stage"])
        for i, stage in enumerate(stages):
            buckets, total = merge([part.stage_queue[i] for part in parts])
            queue.add_metric([stage], buckets, total)
        yield from (rate, queue)
        if not per_stream(current.scenario.decode.mode):
            return
        yield GaugeMetricFamily("testbed_streams_in_flight", "Streams mode: streams still decoding (decode.streams "
                                "less those that produced all their tokens)", value=now.in_flight)
        window = now.window()
        if window is None:
            return
        per_stream_tok_s, aggregate, busy, _ceiling = predicted_rates(current.scenario, list(window.stage_pass_s))
        rates = GaugeMetricFamily("testbed_streams_aggregate_tokens_per_second",
                                  "Streams mode: tokens/s of all streams together over the recent laps, kind=measured "
                                  "or kind=predicted (physics.streams_rates)", labels=["kind"])
        rates.add_metric(["measured"], window.aggregate_tok_s)
        rates.add_metric(["predicted"], aggregate)
        yield rates
        yield GaugeMetricFamily("testbed_stream_rate_predicted_tokens_per_second",
                                "Streams mode: predicted decode rate of one stream (aggregate / M)",
                                value=per_stream_tok_s)
        utilization = GaugeMetricFamily("testbed_stage_utilization_ratio",
                                        "Streams mode: share of the recent laps' time a stage computed, kind=measured "
                                        "or kind=predicted", labels=["stage", "kind"])
        batch = GaugeMetricFamily("testbed_stage_batch_frames",
                                  "Streams mode: mean frames per forward pass of a stage over the recent laps",
                                  labels=["stage"])
        for stage, measured, predicted, frames in zip(stages, window.stage_busy, busy, window.stage_batch_mean):
            utilization.add_metric([stage, "measured"], measured)
            utilization.add_metric([stage, "predicted"], predicted)
            batch.add_metric([stage], frames)
        yield from (utilization, batch)


PART = StreamsRecent  # its part of the run log (testbed.launch.runlog.lap_parts)
