"""How a stage groups the frames it takes from its inbox (continuous batching), and what it does to them on arrival."""

from __future__ import annotations

import dataclasses

import numpy as np

from agents import wire


def batches(items: list[tuple[wire.Frame, float]]) -> list[list[tuple[wire.Frame, float]]]:
    """Arrival order kept; consecutive one-token HIDDEN frames of different streams form one batch, anything
    else (a probe, a prefill block, SHUTDOWN, a second frame of a stream already in the batch) stands alone."""
    groups: list[list[tuple[wire.Frame, float]]] = []
    streams: set[int] = set()  # the streams of the last group, when it is a batch (O(1) a frame, not O(batch))
    for item in items:
        frame = item[0]
        batchable = frame.kind == wire.Kind.HIDDEN and frame.tensor is not None and frame.tensor.shape[:2] == (1, 1)
        if batchable and groups and streams and frame.stream not in streams:
            groups[-1].append(item)
            streams.add(frame.stream)
        else:
            groups.append([item])
            streams = {frame.stream} if batchable else set()
    return groups


def as_float32(item: tuple[wire.Frame, float]) -> tuple[wire.Frame, float]:
    """Stages compute in float32: a hidden state that travelled as f16 is upcast on arrival."""
    frame, at = item
    if frame.tensor is not None and frame.tensor.dtype == np.float16:
        frame = dataclasses.replace(frame, tensor=frame.tensor.astype(np.float32))
    return frame, at
