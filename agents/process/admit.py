"""What a serving stage takes off the wire: a frame that would fail its forward pass is refused on arrival."""

from __future__ import annotations

import numpy as np

from agents.process import wire
from agents.process.stage import PipelineStage
from testbed.core.errors import WireError


class Admission:
    """A serving stage's view of the frames queued for it: each stream's cache length once they are computed.

    `admit(frame)` raises WireError (the connection closes) for a well-formed frame PipelineStage would fail on: a kind
    it does not take, a block not [1, T, n_embd] float32 (a BATCH frame: [B, T, n_embd], one row per stream) or past
    the KV cache the frames queued before leave it."""

    def __init__(self, stage: PipelineStage, index: int) -> None:
        self.stage = stage
        self.index = index
        self.serving = False  # set in serve(): before it, frames are the entry's own and pass unchecked
        # stream -> its cache length once the frames queued so far are computed (an array: a batch checks at once)
        self.frontier = np.zeros(PipelineStage.MAX_STREAMS, np.int64)
        self.tree_nodes: dict[int, int] = {}  # stream -> nodes of the tree its next queued block is

    def admit(self, frame: wire.Frame) -> None:
        kind, stream, pos, x, config = frame.kind, frame.stream, frame.pos, frame.tensor, self.stage.model.config
        if self.serving and len(frame.stamps) >= wire.MAX_STAMPS - 1:  # with this stage's, the next would refuse it
            raise WireError(f"a frame with {len(frame.stamps)} stamps leaves no room for stage {self.index}'s")
        if not self.serving or kind in (wire.Kind.PROBE, wire.Kind.SHUTDOWN):
            return
        if kind == wire.Kind.BATCH:
            return self.admit_rows(frame)
        if kind not in (wire.Kind.HIDDEN, wire.Kind.TREE) or not 0 <= stream < PipelineStage.MAX_STREAMS:
            raise WireError(f"a {kind.name} frame of stream {stream}: stage {self.index} takes HIDDEN, TREE and BATCH "
                            f"frames")
        length, slots = int(self.frontier[stream]), config.block_size + self.stage.tree_slots
        if kind == wire.Kind.TREE:
            self.tree_nodes[stream] = len(wire.tree_plan(x, slots, pos, length))
            self.frontier[stream] = max(length, pos)  # KVCache.compact
            return
        if x is None or x.dtype != np.float32 or x.ndim != 3 or x.shape[0] != 1 or x.shape[2] != config.n_embd:
            raise WireError(f"stage {self.index} takes [1, T, {config.n_embd}] float32, not {getattr(x, 'shape', x)}")
        nodes = self.tree_nodes.get(stream)
        if not 0 < x.shape[1] <= slots - pos or pos > length or nodes not in (None, x.shape[1]):
            raise WireError(f"a block of {x.shape[1]} at position {pos} does not fit stage {self.index}: stream "
                            f"{stream} has {length} cached by then of {slots} slots; tree nodes expected: {nodes}")
        self.frontier[stream] = pos + x.shape[1]
        self.tree_nodes.pop(stream, None)

    def admit_rows(self, frame: wire.Frame) -> None:
        """A BATCH frame: T new positions of each of its rows' streams, each stream once, each within its cache."""
        x, rows, config = frame.tensor, frame.rows, self.stage.model.config
        if x is None or x.dtype != np.float32 or x.shape[2] != config.n_embd:
            raise WireError(f"stage {self.index} takes [B, T, {config.n_embd}] float32 batches, not "
                            f"{getattr(x, 'shape', x)}")
        n_tok = x.shape[1]
        streams, positions = rows["stream"].astype(np.int64), rows["pos"].astype(np.int64)
        if streams.max() >= PipelineStage.MAX_STREAMS or np.bincount(streams).max() > 1:
            raise WireError(f"a batch's rows name streams {streams[:8].tolist()}...: each once, below "
                            f"{PipelineStage.MAX_STREAMS}")
        frontier, slots = self.frontier, config.block_size + self.stage.tree_slots
        fits = (positions <= frontier[streams]) & (positions + n_tok <= slots)
        if not fits.all() or (self.tree_nodes and not self.tree_nodes.keys().isdisjoint(streams.tolist())):
            row = int(np.flatnonzero(~fits)[0]) if not fits.all() else 0
            raise WireError(f"a batch's block at position {positions[row]} does not fit stage {self.index}: stream "
                            f"{streams[row]} has {frontier[streams[row]]} cached by then of {slots} slots (or a "
                            f"tree expected)")
        frontier[streams] = positions + n_tok
