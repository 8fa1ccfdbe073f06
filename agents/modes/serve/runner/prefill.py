"""Chunked prefill while serving (decode.prefill_chunk): an admitted prompt's chunks, back to back (a mixin of
agents.modes.serve.runner.ServeMode)."""

from __future__ import annotations

from agents.modes.serve.runner.request import Request
from agents.process import wire


class ChunkedPrefill:
    """Sends a prompt in chunks; ServeMode's `returned` reports the chunks before the last as they come back."""

    async def prefill_chunks(self, request: Request, chunk: int) -> None:
        """decode.prefill_chunk: the prompt in chunks sent back to back, pipelined over the stages (as
        agents.process.prefill does for plain decode), each padded to its cost at the entry; the last is the
        request's prefill lap (its first token), the earlier ones come back flagged NO_SAMPLE, without one."""
        clock, ring = self.ring.clock, self.ring
        blocks = [(request.prompt[i:i + chunk], i) for i in range(0, len(request.prompt), chunk)]
        for j, (block, pos) in enumerate(blocks):
            start = clock.now()
            hidden = self.stage.embed_and_run(block, pos, request.index)
            real_end = clock.now()
            await clock.sleep_until(start + max(ring.cost_s(len(block), 1, pos), ring.dilation * (real_end - start)))
            lap, self.lap_no = self.lap_no, self.lap_no + 1
            last = j == len(blocks) - 1
            frame = wire.Frame(wire.Kind.HIDDEN, stream=request.index, lap=lap, pos=pos, tensor=hidden,
                               flags=0 if last else wire.NO_SAMPLE)
            await ring.send(ring.stamped(frame, start, start, real_end, clock.now(), hidden))
            if last:
                request.lap, request.kind, request.n_tok, request.start = lap, "prefill", len(block), start
            else:
                request.chunks_out[lap] = (start, len(block), j, len(blocks))
