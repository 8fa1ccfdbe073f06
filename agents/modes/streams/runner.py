"""Many streams in flight: M independent sequences share the ring, each stage keeping one KV cache per stream.

Every frame carries its stream id. The entry node prefills every stream (one forward pass per prompt; under
continuous batching the prompts of one length as one batched pass), then works through the frames coming back: for
each, the head samples the stream's next token and the front embeds it and sends it on. Two scheduling policies
(decode.batching), at the entry and at every stage:

- ``none``: one frame per forward pass, in arrival order. A stage busy with one stream delays the next:
  the frames form a train spaced by the slowest stage, and the ring carries min(M / (C + T_ring), 1 / c_max)
  tokens per second (physics.streams_rates).
- ``continuous``: a stage runs every one-token frame queued when it turns to its inbox as one batched
  forward pass, then sends them on as one burst. The entry waits for every stream's first token, so the
  decode starts as one convoy of M streams, which stays together: each lap costs every stage its batched
  cost compute_ms + per_token_ms (M - 1). The convoy travels as one BATCH frame (agents.process.wire: [M, 1, C] and
  a row per stream), so a hop costs a frame, not M; its M laps share the frame's stamps and are reported
  together (RingClient.report_laps).

A lap of stream s runs from the entry step that sent its frame to the entry step that takes the frame up
again, so consecutive laps of a stream tile its time: its rate is 1 / mean lap. The lap's token is sampled
in that second step. Under time dilation every real forward pass is padded to D times its length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from agents.process import wire
from agents.zoo.prompts import prompt_ids
from agents.process.ring import CONTEXT_KEEP, RingClient
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


Arrival = tuple[Stream, wire.Frame, float]  # a stream whose frame came back: the frame and when it arrived


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
    def heads(self, arrivals: list[Arrival]) -> list[torch.Tensor]:
        """Last-position logits of every returned stream, in one batched pass."""
        last = np.concatenate([frame.tensor[:, -1, :] for frame, _ in unique_frames(arrivals)])  # [b, C]
        return list(self.stage.model.head(torch.from_numpy(last)[:, None, :])[:, 0, :])  # b x [V]

    async def front(self, streams: list[Stream], prefill: bool, step_start: float) -> None:
        """Run the entry's layers on each stream's next block, pad the step, send the frames on: under continuous
        batching as one BATCH frame (the convoy's next tokens, or prompts of one length: one frame on every hop)."""
        clock, ring = self.ring.clock, self.ring
        blocks = [(s.sequence, 0) if prefill else ([s.sequence[-1]], len(s.sequence) - 1) for s in streams]
        one_frame = len(streams) > 1 and self.continuous
        if len(streams) > 1 and not prefill:
            hidden = self.stage.embed_and_run_batch([ids[0] for ids, _ in blocks], [pos for _, pos in blocks],
                                                    [s.index for s in streams])  # [B, 1, C]
            hiddens = [hidden[i:i + 1] for i in range(len(streams))]
        else:
            hiddens = [self.stage.embed_and_run(ids, pos, s.index) for (ids, pos), s in zip(blocks, streams)]
            hidden = np.concatenate(hiddens) if one_frame else hiddens[0]  # prompts of one length: [B, T, C]
        real_end = clock.now()
        n_tok = max(len(ids) for ids, _ in blocks)
        cost = ring.cost_s(n_tok, len(streams), sum(pos for _, pos in blocks) / len(blocks))  # each reads its KV
        await clock.sleep_until(step_start + max(cost, ring.dilation * (real_end - step_start)))
        end = clock.now()
        for stream, (ids, pos) in zip(streams, blocks):
            stream.lap, self.lap_no = self.lap_no, self.lap_no + 1
            stream.kind, stream.n_tok, stream.start = ("prefill" if prefill else "decode"), len(ids), step_start
        if one_frame:
            positions = [pos for _, pos in blocks]
            rows = wire.batch_rows([s.index for s in streams], [s.lap for s in streams], positions)
            frame = wire.Frame(wire.Kind.BATCH, pos=min(positions), tensor=hidden, rows=rows)
            await ring.send(ring.stamped(frame, step_start, step_start, real_end, end, hidden, len(streams)))
            return
        for stream, (ids, pos), hidden in zip(streams, blocks, hiddens):
            frame = wire.Frame(wire.Kind.HIDDEN, stream=stream.index, lap=stream.lap, pos=pos, tensor=hidden)
            await ring.send(ring.stamped(frame, step_start, step_start, real_end, end, hidden, len(streams)))

    async def prefill_all(self) -> None:
        """Every stream's prompt. Under continuous batching the prompts of one length go as one batched pass (as a
        continuous-batching server takes the prompts waiting for it), the lengths one after another; else (and
        where KV is shipped: a batch ships none) one pass a prompt."""
        if not self.continuous or self.ring.kv_ship:
            for stream in self.streams:
                await self.front([stream], prefill=True, step_start=self.ring.clock.now())
            return
        by_length: dict[int, list[Stream]] = {}
        for stream in self.streams:
            by_length.setdefault(len(stream.sequence), []).append(stream)
        for group in by_length.values():
            await self.front(group, prefill=True, step_start=self.ring.clock.now())

    async def step(self, arrivals: list[Arrival]) -> None:
        """Take up returned frames: sample each stream's token, send the next tokens on, report the laps (after
        the sends: a batch of M records is not the entry's compute, and the convoy need not wait for it). The
        streams of one BATCH frame share its stamps: they are reported as one batch of laps."""
        step_start = self.ring.clock.now()
        going, restarting, reports = [], [], {}
        stamps = {id(frame): tuple(frame.stamps) for frame, _ in unique_frames(arrivals)}  # unpacked once a frame
        for (stream, frame, recv), logits in zip(arrivals, self.heads(arrivals)):
            token = self.sample(stream, logits)
            stream.sequence.append(token)
            stream.ids.append(token)
            stream.generated += 1
            reports.setdefault(id(frame), []).append(
                LapRecord(stream.lap, stream.kind, self.ring.mode, stream.n_tok, 1, stream.start, step_start,
                          stamps[id(frame)], recv, None, (token,), stream=stream.index))
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
        for records in reports.values():
            self.ring.report_laps(records)

    async def receive(self) -> list[Arrival]:
        """The streams whose frames came back (a BATCH frame's rows each), each checked to be a lap in flight."""
        items = await self.ring.receive_burst() if self.continuous else [await self.ring.receive()]
        arrivals = []
        for frame, recv in items:
            for index, lap in lap_rows(frame, "a lap of a stream in flight"):
                if not 0 <= index < len(self.streams) or lap != self.streams[index].lap:
                    raise WireError(f"expected a lap of a stream in flight back, got {frame.kind.name} stream "
                                    f"{index} lap {lap}")
                arrivals.append((self.streams[index], frame, recv))
        return arrivals

    def finishing(self, arrivals: list[Arrival]) -> int:
        """Streams whose last token these arrivals bring."""
        return sum(1 for stream, _, _ in arrivals if stream.generated + 1 >= self.config.tokens)

    async def run(self) -> int:
        """Decode config.tokens tokens on each of config.streams streams; returns how many were generated."""
        if self.ring.n_stages == 1:
            raise WireError("the streams mode needs a ring of at least two stages")
        await self.prefill_all()
        in_flight = len(self.streams)
        if self.continuous:
            # Every stream's first token before the decode starts: the streams leave the entry as one convoy.
            returned: list[Arrival] = []
            while len(returned) < in_flight:
                returned.extend(await self.receive())
            in_flight -= self.finishing(returned)
            await self.step(returned)
        while in_flight:
            arrivals = await self.receive()
            in_flight -= self.finishing(arrivals)
            await self.step(arrivals)
        return sum(stream.generated for stream in self.streams)


def lap_rows(frame: wire.Frame, what: str) -> Iterable[tuple[int, int]]:
    """(stream, lap) of each sequence a frame back at the entry carries (a BATCH frame's rows each); a frame of
    another kind is a WireError saying it expected `what`."""
    if frame.kind == wire.Kind.BATCH:
        return zip(frame.rows["stream"].tolist(), frame.rows["lap"].tolist())
    if frame.kind == wire.Kind.HIDDEN:
        return ((frame.stream, frame.lap),)
    raise WireError(f"expected {what} back, got a {frame.kind.name} frame")


def unique_frames(arrivals: list[Arrival]) -> list[tuple[wire.Frame, float]]:
    """The frames the arrivals came in, each once, in order (a BATCH frame brings several streams)."""
    frames: dict[int, tuple[wire.Frame, float]] = {}
    for _, frame, recv in arrivals:
        frames.setdefault(id(frame), (frame, recv))
    return list(frames.values())


Runner = StreamsMode  # what an agent of this mode runs (ModeInfo.runner_path)
