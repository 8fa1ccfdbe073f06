"""Several streams in flight around one ring (continuous batching optional): aggregate against per-stream rate."""

from __future__ import annotations

from agents.modes.streams.facts import StreamsSummary
from testbed.core.decode import ModeInfo

INFO = ModeInfo("streams", __name__, metric_kind="streams", min_stages=2, per_stream=True, own_calibration=True,
                streams_as="streams", summary=StreamsSummary, summary_field="streams")
