"""Many streams in flight: M independent sequences share the ring, each stage keeping one KV cache per stream.

Every frame carries its stream id. The entry node prefills every stream (one forward pass per prompt), then
works through the frames coming back: for each, the head samples the stream's next token and the front
embeds it and sends it on. Two scheduling policies (decode.batching), at the entry and at every stage:

- ``none``: one frame per forward pass, in arrival order. A stage busy with one stream delays the next:
  the frames form a train spaced by the slowest stage, and the ring carries min(M / (C + T_ring), 1 / c_max)
  tokens per second (physics.streams_rates).
- ``continuous``: a stage runs every one-token frame queued when it turns to its inbox as one batched
  forward pass, then sends them on as one burst. The entry waits for every stream's first token, so the
  decode starts as one convoy of M frames, which stays together: each lap costs every stage its batched
  cost compute_ms + per_token_ms (M - 1).

A lap of stream s runs from the entry step that sent its frame to the entry step that takes the frame up
again, so consecutive laps of a stream tile its time: its rate is 1 / mean lap. The lap's token is sampled
in that second step. Under time dilation every real forward pass is padded to D times its length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from agents import wire
from agents.prompts import prompt_ids
from agents.ring import CONTEXT_KEEP, RingClient
from testbed.core.decode import DecodeConfig
from testbed.core.errors import WireError
from testbed.core.records import LapRecord


@dataclass
class Stream:
    index: int
    sequence: list[int]
    generator: torch.Generator
    generated: int = 0
    lap: int = -1  # lap number of the frame in flight
    kind: str = "prefill"
    n_tok: int = 0
    start: float = 0.0  # when the entry step that sent the frame in flight began
    ids: list[int] = field(default_factory=list)


class StreamsMode:
    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        self.config = config
        self.ring = ring
        self.stage = ring.stage
        self.block_size = ring.stage.model.config.block_size
        self.continuous = config.batching == "continuous"
        self.streams = [Stream(s, prompt_ids(config, ring.stage.model, s),
                               torch.Generator().manual_seed(config.seed + s)) for s in range(config.streams)]
        self.lap_no = 0

    def sample(self, stream: Stream, last: torch.Tensor) -> int:
        if self.config.temperature <= 0:
            return int(torch.argmax(last))
        probs = torch.softmax(last / self.config.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=stream.generator))

    # --- one entry step: heads of the frames that came back, fronts of the next tokens ---------------

    @torch.inference_mode()
    def heads(self, items: list[tuple[wire.Frame, float]]) -> list[torch.Tensor]:
        """Last-position logits of every returned frame, in one batched pass."""
        last = torch.from_numpy(np.concatenate([frame.tensor[:, -1:, :] for frame, _ in items]))  # [b, 1, C]
        return list(self.stage.model.head(last)[:, 0, :])  # b x [V]

    async def front(self, streams: list[Stream], prefill: bool, step_start: float) -> None:
        """Run the entry's layers on each stream's next block, pad the step, send the frames on."""
        clock, ring = self.ring.clock, self.ring
        blocks = [(s.sequence, 0) if prefill else ([s.sequence[-1]], len(s.sequence) - 1) for s in streams]
        if len(streams) > 1 and not prefill:
            hiddens = self.stage.embed_and_run_batch([ids[0] for ids, _ in blocks], [pos for _, pos in blocks],
                                                     [s.index for s in streams])
        else:
            hiddens = [self.stage.embed_and_run(ids, pos, s.index) for (ids, pos), s in zip(blocks, streams)]
        real_end = clock.now()
        n_tok = max(len(ids) for ids, _ in blocks)
        cost = ring.cost_s(n_tok, len(streams), sum(pos for _, pos in blocks) / len(blocks))  # each reads its KV
        await clock.sleep_until(step_start + max(cost, ring.dilation * (real_end - step_start)))
        end = clock.now()
        frames = []
        for stream, (ids, pos), hidden in zip(streams, blocks, hiddens):
            stream.lap, self.lap_no = self.lap_no, self.lap_no + 1
            stream.kind, stream.n_tok, stream.start = ("prefill" if prefill else "decode"), len(ids), step_start
            frame = wire.Frame(wire.Kind.HIDDEN, stream=stream.index, lap=stream.lap, pos=pos, tensor=hidden)
            frames.append(ring.stamped(frame, step_start, step_start, real_end, end, hidden, len(streams)))
        if len(frames) > 1 and self.continuous:
            await ring.send_burst(frames)
        else:
            for frame in frames:
                await ring.send(frame)

    async def step(self, items: list[tuple[wire.Frame, float]]) -> None:
        """Take up returned frames: sample each stream's token, send the next token on, report the laps (after
        the sends: a batch of M records is not the entry's compute, and the convoy need not wait for it)."""
        step_start = self.ring.clock.now()
        going, restarting, records = [], [], []
        for (frame, recv), logits in zip(items, self.heads(items)):
            stream = self.streams[frame.stream]
            token = self.sample(stream, logits)
            stream.sequence.append(token)
            stream.ids.append(token)
            stream.generated += 1
            records.append(LapRecord(frame.lap, stream.kind, self.ring.mode, stream.n_tok, 1, stream.start,
                                     step_start, frame.stamps, recv, None, (token,), stream=stream.index))
            if stream.generated >= self.config.tokens:
                continue
            if len(stream.sequence) >= self.block_size:
                # Context full: the stream starts a new sequence from its recent tokens (a prefill lap).
                stream.sequence = stream.sequence[-CONTEXT_KEEP:]
                restarting.append(stream)
            else:
                going.append(stream)
        if going:
            await self.front(going, prefill=False, step_start=step_start)
        for stream in restarting:
            await self.front([stream], prefill=True, step_start=self.ring.clock.now())
        for record in records:
            self.ring.report(record)

    async def receive(self) -> list[tuple[wire.Frame, float]]:
        items = await self.ring.receive_burst() if self.continuous else [await self.ring.receive()]
        for frame, _ in items:
            if (frame.kind != wire.Kind.HIDDEN or not 0 <= frame.stream < len(self.streams)
                    or frame.lap != self.streams[frame.stream].lap):
                raise WireError(f"expected a lap of a stream in flight back, got {frame.kind.name} stream "
                                f"{frame.stream} lap {frame.lap}")
        return items

    async def run(self) -> int:
        """Decode config.tokens tokens on each of config.streams streams; returns how many were generated."""
        if self.ring.n_stages == 1:
            raise WireError("the streams mode needs a ring of at least two stages")
        for stream in self.streams:
            await self.front([stream], prefill=True, step_start=self.ring.clock.now())
        in_flight = len(self.streams)
        if self.continuous:
            # Every stream's first token before the decode starts: the streams leave the entry as one convoy.
            returned: list[tuple[wire.Frame, float]] = []
            while len(returned) < in_flight:
                returned.extend(await self.receive())
            in_flight -= sum(1 for frame, _ in returned if self.streams[frame.stream].generated + 1 >= self.config.tokens)
            await self.step(returned)
        while in_flight:
            items = await self.receive()
            in_flight -= sum(1 for frame, _ in items if self.streams[frame.stream].generated + 1 >= self.config.tokens)
            await self.step(items)
        return sum(stream.generated for stream in self.streams)
