"""How a stage groups the frames it takes from its inbox (continuous batching), and what it does to them on arrival."""

from __future__ import annotations

import dataclasses

import numpy as np

from agents import wire


def batches(items: list[tuple[wire.Frame, float]]) -> list[list[tuple[wire.Frame, float]]]:
    """Arrival order kept; consecutive one-token HIDDEN frames of different streams form one batch, anything
    else (a probe, a prefill block, SHUTDOWN, a second frame of a stream already in the batch) stands alone."""
    groups: list[list[tuple[wire.Frame, float]]] = []
    for item in items:
        frame = item[0]
        batchable = (frame.kind == wire.Kind.HIDDEN and frame.tensor is not None and frame.tensor.shape[:2] == (1, 1))
        last = groups[-1] if groups else None
        if (batchable and last is not None and last[0][0].kind == wire.Kind.HIDDEN
                and last[0][0].tensor is not None and last[0][0].tensor.shape[:2] == (1, 1)
                and all(f.stream != frame.stream for f, _ in last)):
            last.append(item)
        else:
            groups.append([item])
    return groups


def as_float32(item: tuple[wire.Frame, float]) -> tuple[wire.Frame, float]:
    """Stages compute in float32: a hidden state that travelled as f16 is upcast on arrival."""
    frame, at = item
    if frame.tensor is not None and frame.tensor.dtype == np.float16:
        frame = dataclasses.replace(frame, tensor=frame.tensor.astype(np.float32))
    return frame, at
