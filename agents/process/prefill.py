"""Chunked prefill (as vLLM and Sarathi): the prompt in chunks sent back to back, pipelined over the ring."""

from __future__ import annotations

from typing import Any, Callable

import torch

from agents.process import wire
from testbed.core.errors import WireError
from testbed.core.facts import PrefillChunk
from testbed.core.records import HeadTiming, LapRecord


async def chunked_prefill(ring: Any, ids: list[int], chunk: int, decide: Callable[[torch.Tensor], Any]
                          ) -> tuple[Any, LapRecord]:
    """The prompt in chunks of `chunk` tokens over `ring` (an agents.process.ring.RingClient), sent back to back.

    The chunks are pipelined: chunk j+1 leaves the entry while chunk j is on the ring (each stage keeps the
    earlier chunks' KV, and frames on a link stay in order). Every chunk but the last is reported now as a
    "prefill" lap with extra chunk/chunks; the last one's record (with the head) is returned, like `lap`. A
    single chunk is exactly `lap`."""
    if chunk <= 0 or chunk >= len(ids) or ring.n_stages == 1:
        return await ring.lap(ids, 0, "prefill", decide)
    blocks = [(ids[i:i + chunk], i) for i in range(0, len(ids), chunk)]
    n = len(blocks)
    sent = []
    for j, (block, pos) in enumerate(blocks):
        lap_no, ring.lap_no = ring.lap_no, ring.lap_no + 1
        start = ring.clock.now()
        hidden = ring.stage.embed_and_run(block, pos)
        real_end = ring.clock.now()
        if j < n - 1:  # the last chunk's front is padded together with the head, as in `lap`
            await ring.clock.sleep_until(start + max(ring.cost_s(len(block), 1, pos),
                                                     ring.dilation * (real_end - start)))
        end = ring.clock.now()
        frame = wire.Frame(wire.Kind.HIDDEN, lap=lap_no, pos=pos, tensor=hidden,
                           flags=wire.NO_SAMPLE if j < n - 1 else 0)
        kv = ring.kv_frame(pos, len(block))
        await ring.send(ring.stamped(frame, start, start, real_end, end, hidden, extra_bytes=wire.parts_len(kv)), kv=kv)
        sent.append((lap_no, start, real_end - start))
    for j, (block, block_pos) in enumerate(blocks):
        back, return_recv = await ring.receive()
        lap_no, start, front = sent[j]
        if back.kind not in (wire.Kind.HIDDEN, wire.Kind.TOKEN) or back.lap != lap_no:
            raise WireError(f"expected prefill chunk lap {lap_no} back, got {back.kind.name} lap {back.lap}")
        facts = PrefillChunk(j, n)
        if j < n - 1:
            ring.report(LapRecord(lap_no, "prefill", ring.mode, len(block), 0, start, return_recv, back.stamps,
                                  return_recv, facts=facts))
            continue
        head_start = ring.clock.now()
        result = ring.head(back, decide)
        head_real_end = ring.clock.now()
        real = front + head_real_end - head_start
        await ring.clock.sleep_until(max(head_real_end, head_start + max(ring.cost_s(len(block), 1, block_pos),
                                                                         ring.dilation * real) - front))
        end = ring.clock.now()
        record = LapRecord(lap_no, "prefill", ring.mode, len(block), 0, start, end, back.stamps, return_recv,
                           HeadTiming(head_start, head_real_end, end), facts=facts)
    return result, record

