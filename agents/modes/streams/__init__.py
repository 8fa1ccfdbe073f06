"""Several streams in flight around one ring (continuous batching optional): aggregate against per-stream rate."""

from __future__ import annotations

from testbed.core.decode import ModeInfo

INFO = ModeInfo("streams", __name__, metric_kind="streams", summary_field="streams", min_stages=2, per_stream=True,
                own_calibration=True, streams_as="streams")
