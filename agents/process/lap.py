"""A lap in two halves, for modes with several laps in flight at once (agents.modes.overlap): start_lap runs the
entry's layers over a block and sends its frame; end_lap runs the head over the frame when it returns and says when
the entry's compute, padded to its cost, ends; lap_record makes the lap's record. RingClient.lap is the three in a
row. `ring` is an agents.process.ring.RingClient."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import torch

from agents.process import wire
from testbed.core.errors import WireError
from testbed.core.records import HeadTiming, LapRecord, Stamp


@dataclasses.dataclass
class PendingLap:
    """A lap started (start_lap) and not yet ended: what end_lap and lap_record need of its start."""

    lap_no: int
    kind: str
    n_tok: int
    pos: int
    stream: int
    start: float
    front_real_end: float
    local: np.ndarray | None  # the hidden state a ring of one stage keeps (no frame leaves)
    stamps: tuple[Stamp, ...] = ()
    return_recv: float = 0.0
    head_start: float = 0.0
    head_real_end: float = 0.0


async def start_lap(ring: Any, ids: list[int], pos: int, kind: str, tree: np.ndarray | None = None,
                    positions: list[int] | None = None, stream: int = 0) -> PendingLap:
    """The first half of a lap: the entry's layers over the block, and its frame sent on (a ring of one stage
    keeps it)."""
    lap_no, ring.lap_no = ring.lap_no, ring.lap_no + 1
    start = ring.clock.now()
    if tree is not None:
        ring.stage.set_tree(tree, pos)
    hidden = ring.stage.embed_and_run(ids, pos, stream, positions=positions)
    front_real_end = ring.clock.now()
    if ring.n_stages > 1:
        frame = wire.Frame(wire.Kind.HIDDEN, stream=stream, lap=lap_no, pos=pos, tensor=hidden)
        kv = ([(wire.encode(wire.Frame(wire.Kind.TREE, pos=pos, tensor=tree)), 0)] if tree is not None else []
              ) + ring.kv_frame(pos, len(ids), stream)
        await ring.send(ring.stamped(frame, start, start, front_real_end, front_real_end, hidden,
                                     extra_bytes=wire.parts_len(kv)), kv=kv)
        hidden = None
    return PendingLap(lap_no, kind, len(ids), pos, stream, start, front_real_end, hidden)


def end_lap(ring: Any, pending: PendingLap, back: wire.Frame | None, return_recv: float,
            decide: Callable[[torch.Tensor], Any]) -> tuple[Any, float]:
    """The second half: the head over the returned frame (`back`; None on a ring of one stage). Returns decide's
    result and when the entry's compute, padded to its cost, ends: the lap's end (lap_record takes it)."""
    if back is not None:
        if back.kind not in (wire.Kind.HIDDEN, wire.Kind.TOKEN) or back.lap != pending.lap_no:
            raise WireError(f"expected lap {pending.lap_no} back, got {back.kind.name} lap {back.lap}")
        pending.stamps, pending.return_recv = back.stamps, return_recv
    else:
        back = wire.Frame(wire.Kind.HIDDEN, tensor=pending.local)
        end = pending.front_real_end
        pending.stamps, pending.return_recv = (Stamp(0, pending.start, pending.start, end, end, end),), end
    pending.local = None
    head_start = ring.clock.now()
    result = ring.head(back, decide)
    head_real_end = ring.clock.now()
    front = pending.front_real_end - pending.start
    real = front + head_real_end - head_start
    cost = ring.cost_s(pending.n_tok, 1, pending.pos)
    pending.head_start, pending.head_real_end = head_start, head_real_end
    return result, max(head_real_end, head_start + max(cost, ring.dilation * real) - front)


def lap_record(ring: Any, pending: PendingLap, end: float) -> LapRecord:
    """The record of a lap ended (end_lap) at `end`."""
    return LapRecord(pending.lap_no, pending.kind, ring.mode, pending.n_tok, 0, pending.start, end, pending.stamps,
                     pending.return_recv, HeadTiming(pending.head_start, pending.head_real_end, end),
                     stream=pending.stream)

