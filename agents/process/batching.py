"""How a stage groups the frames it takes from its inbox (continuous batching), and what it does to them on arrival."""

from __future__ import annotations

import dataclasses

import numpy as np

from agents.process import wire


def batches(items: list[tuple[wire.Frame, float]]) -> list[list[tuple[wire.Frame, float]]]:
    """Arrival order kept; consecutive one-token HIDDEN frames and BATCH frames of different streams form one
    batch, anything else (a probe, a prefill block, SHUTDOWN, a stream already in the batch) stands alone."""
    groups: list[list[tuple[wire.Frame, float]]] = []
    streams: set[int] = set()  # the streams of the last group, when it is a batch (O(1) a row, not O(batch))
    for item in items:
        frame = item[0]
        mine = row_streams(frame)
        if mine and groups and streams and streams.isdisjoint(mine):
            groups[-1].append(item)
            streams.update(mine)
        else:
            groups.append([item])
            streams = set(mine)
    return groups


def row_streams(frame: wire.Frame) -> list[int]:
    """The streams of a frame a batch can take ([] for one it cannot): a one-token BATCH frame's rows', a one-token
    HIDDEN frame's own. (A BATCH frame of prompts is a batch of its own.)"""
    if frame.kind == wire.Kind.BATCH:
        return frame.rows["stream"].tolist() if frame.tensor.shape[1] == 1 else []
    if frame.kind == wire.Kind.HIDDEN and frame.tensor is not None and frame.tensor.shape[:2] == (1, 1):
        return [frame.stream]
    return []


def rows_of(group: list[tuple[wire.Frame, float]]) -> tuple[np.ndarray, list[int], list[int]]:
    """A batch's hidden states [B, T, C], first positions and streams, row by row over its frames."""
    tensors, positions, streams = [], [], []
    for frame, _ in group:
        tensors.append(frame.tensor)
        if frame.kind == wire.Kind.BATCH:
            positions += frame.rows["pos"].tolist()
            streams += frame.rows["stream"].tolist()
        else:
            positions.append(frame.pos)
            streams.append(frame.stream)
    return (tensors[0] if len(tensors) == 1 else np.concatenate(tensors)), positions, streams


def as_float32(item: tuple[wire.Frame, float]) -> tuple[wire.Frame, float]:
    """Stages compute in float32: a hidden state that travelled as f16 is upcast on arrival."""
    frame, at = item
    if frame.tensor is not None and frame.tensor.dtype == np.float16:
        frame = dataclasses.replace(frame, tensor=frame.tensor.astype(np.float32))
    return frame, at
