"""The LM head off the entry (seed 000 "Placement laws"; seed 001's return path).

placement.head = "separate": an agent after the last stage turns the last stage's hidden state into logits,
samples, and sends only the sampled token on to the entry: a lap is N + 1 hops instead of N, and the extra hop's
latency is what the law's co-located head saves. placement.head = "last": the last stage does it itself (the
mode's runner's `last_head`: sampled_head for one token a lap; a token tree's verifies the tree and returns the
accepted path's node indices and the next token) and the return hop carries token ids instead of hidden states.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from agents.process import wire
from agents.process.ring import RingClient
from agents.process.stage import PipelineStage
from testbed.core.errors import WireError


def sampled_head(sample: Callable[[torch.Tensor], int]
                 ) -> Callable[[PipelineStage, wire.Frame, np.ndarray], np.ndarray]:
    """A last stage's head that samples one token a lap (none for a prefill chunk flagged NO_SAMPLE): what it returns
    instead of its hidden state (RingClient.last_head; a mode's runner builds its own with `last_head`)."""

    def sampled(stage: PipelineStage, frame: wire.Frame, hidden: np.ndarray) -> np.ndarray:
        return np.array([] if frame.flags & wire.NO_SAMPLE else [sample(stage.logits(hidden))], np.int32)

    return sampled


async def serve_head(ring: RingClient, sample: Callable[[torch.Tensor], int]) -> None:
    """Until SHUTDOWN: every HIDDEN frame in, one TOKEN frame (int32 [1]; [0] for a prefill chunk flagged
    NO_SAMPLE) out to the entry, stamped like a stage's, with the head's compute padded to its compute_ms."""
    while True:
        frame, recv = await ring.inbox.receive()
        if frame.kind in (wire.Kind.SHUTDOWN, wire.Kind.PROBE):
            await ring.send(ring.pass_through(frame, recv))
            if frame.kind == wire.Kind.SHUTDOWN:
                return
            continue
        if frame.kind != wire.Kind.HIDDEN or frame.tensor is None:
            raise WireError(f"the head expects hidden states, got a {frame.kind.name} frame")
        start = ring.clock.now()
        if frame.flags & wire.NO_SAMPLE:
            ids = np.zeros(0, np.int32)
        else:
            ids = np.array([sample(ring.stage.logits(frame.tensor))], np.int32)
        real_end = ring.clock.now()
        await ring.clock.sleep_until(start + max(ring.cost_s(), ring.dilation * (real_end - start)))
        token = wire.Frame(wire.Kind.TOKEN, stream=frame.stream, lap=frame.lap, pos=frame.pos, stamps=frame.stamps)
        await ring.send(ring.stamped(token, recv, start, real_end, ring.clock.now(), ids))
