"""Speculation while serving (decode.speculate = K): the serving entry's drafts, its convoy of K + 1 positions a
row, and the exact rule on the rows that come back (a mixin of agents.modes.serve.runner.ServeMode)."""

from __future__ import annotations

import numpy as np
import torch

from agents.modes.serve.runner.request import Request
from agents.modes.speculative.runner import probabilities, verify
from agents.modes.streams.runner import unique_frames
from agents.process import wire


class Speculating:
    """The tokens a returned convoy keeps, and the convoy's departure, when requests speculate. ServeMode's attributes
    (config, ring, stage, spec_k, lap_no) and its head_logits and sample_rows are used."""

    def next_tokens(self, arrivals: list[tuple[Request, wire.Frame, float]]) -> list[list[int]]:
        """The tokens each returned request keeps (none for an aborted one): a sampled token after a prompt or a
        plain lap; under decode.speculate, after a convoy lap, its accepted drafts and the rule's next token."""
        out: list[list[int]] = [[] for _ in arrivals]
        if not self.spec_k:
            logits = self.head_logits(arrivals)
            live = [i for i, (request, _, _) in enumerate(arrivals) if not request.aborted]
            sampled = self.sample_rows(logits if len(live) == len(arrivals) else logits[live],
                                       [arrivals[i][0] for i in live])
            for i, token in zip(live, sampled):
                out[i] = [token]
            return out
        row = 0
        for frame, _ in unique_frames(arrivals):
            rows = range(row, row + frame.tensor.shape[0])
            row += frame.tensor.shape[0]
            live = [i for i in rows if not arrivals[i][0].aborted]
            if not live:
                continue
            if arrivals[live[0]][0].kind == "prefill":  # a prompt's frame: its first token, sampled
                logits = self.head_logits([arrivals[i] for i in rows])
                sampled = self.sample_rows(logits[[i - rows.start for i in live]], [arrivals[i][0] for i in live])
                for i, token in zip(live, sampled):
                    out[i] = [token]
                continue
            with torch.inference_mode():
                logits = self.stage.model.head(torch.from_numpy(frame.tensor))  # [b, K + 1, V]
            for i in live:
                out[i] = self.verified(arrivals[i][0], logits[i - rows.start])
        return out

    def verified(self, request: Request, logits: torch.Tensor) -> list[int]:
        """The exact rule over a request's K + 1 rows: its accepted drafts, then the next token."""
        base, rand = len(request.sequence), request.drafter.rand
        p = [probabilities(row, self.config.temperature) for row in logits]
        accepted, nxt = verify(request.drafts, request.qs, p, lambda offset, purpose: rand.generator(base + offset,
                                                                                                   purpose))
        return request.drafts[:accepted] + [nxt]

    async def front_speculating(self, requests: list[Request], step_start: float) -> None:
        """decode.speculate: every request drafts K tokens from its sequence (the draft's K passes over the convoy
        held once, as a batched pass: K c_d, or D times their real time if longer), then the entry's layers run each
        one's [last token, K drafts] and the convoy leaves as one BATCH frame of K + 1 positions a row."""
        clock, ring, k = self.ring.clock, self.ring, self.spec_k
        real = 0.0
        for request in requests:
            context, request.drafts, request.qs = list(request.sequence), [], []
            for _ in range(k):
                token, q, took = request.drafter.step(context)
                real += took
                context.append(token)
                request.drafts.append(token)
                request.qs.append(q)
        await clock.sleep_until(step_start + max(k * self.config.draft_ms / 1e3, ring.dilation * real))
        start = clock.now()
        blocks = [([r.sequence[-1], *r.drafts], len(r.sequence) - 1) for r in requests]
        hidden = np.concatenate([self.stage.embed_and_run(ids, pos, r.index) for (ids, pos), r in zip(blocks, requests)])
        real_end = clock.now()
        positions = [pos for _, pos in blocks]
        cost = ring.cost_s(k + 1, len(requests), sum(positions) / len(positions))
        await clock.sleep_until(start + max(cost, ring.dilation * (real_end - start)))
        for request in requests:
            request.lap, self.lap_no = self.lap_no, self.lap_no + 1
            request.kind, request.n_tok, request.start = "decode", k + 1, step_start
        rows = wire.batch_rows([r.index for r in requests], [r.lap for r in requests], positions)
        frame = wire.Frame(wire.Kind.BATCH, pos=min(positions), tensor=hidden, rows=rows)
        await ring.send(ring.stamped(frame, step_start, step_start, real_end, clock.now(), hidden, len(requests)))
