"""The streams mode's part of RunSummary (its laps carry no facts of their own)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class StreamsSummary(JsonRecord):
    """M streams in flight (the streams mode): per-stream and aggregate rates next to physics.streams_rates."""

    streams: int
    batching: str
    window_s: float  # the stretch where every stream was decoding: the aggregate is measured over it
    aggregate_tok_s: float
    aggregate_predicted_tok_s: float
    aggregate_error_pct: float
    per_stream_predicted_tok_s: float
    per_stream_tok_s: tuple[float, ...]  # each stream's decode rate: its tokens over its laps' time
    per_stream_p50_tok_s: float
    per_stream_min_tok_s: float
    lap_ms_p50: float  # inter-token time of a stream, over every decode lap of every stream
    lap_ms_p99: float
    ceiling_tok_s: float  # none: 1 / c_max; continuous: the bottleneck batching all M (physics.batching_ceiling)
    stage_compute_ms: tuple[float, ...]  # mean cost of one forward pass (batched: of the whole batch)
    stage_batch_mean: tuple[float, ...]  # mean frames per forward pass
    stage_busy: tuple[float, ...]  # measured fraction of the window each stage computed
    stage_busy_predicted: tuple[float, ...]
    stage_queue_ms_mean: tuple[float, ...]  # how long a frame waited at each stage before its forward pass
    stage_queue_ms_p99: tuple[float, ...]
    texts: tuple[str, ...] = ()  # each stream's generated text

    @property
    def headline(self) -> tuple[float, float, float]:
        """(measured, predicted, error %) that the run's headline shows: the ring's aggregate rate."""
        return self.aggregate_tok_s, self.aggregate_predicted_tok_s, self.aggregate_error_pct

    def calibration_lap(self) -> tuple[float, float]:
        """At zero delay (testbed.launch.dilation): (what a stream's lap took beyond physics.streams_rates' lap with the
        measured passes, ms; that lap, s). A lap's M frames cross every hop one by one, so the testbed's cost of a
        lap grows with M, which one frame's calibration (plain decode) does not see."""
        physics_s = self.streams / self.aggregate_predicted_tok_s
        return max(0.0, (self.streams / self.aggregate_tok_s - physics_s) * 1e3), physics_s
