"""Speculation at a distance (seeds 002/003): edge clients draft, the entry verifies.

spec.placement = "edge": each of spec.clients edge clients is an agent of its own after the stages, with its own
draft model and a link to the entry and one back (spec.rtt_ms / 2 each way). A round: the client drafts K tokens
(K t_d), sends them with the draft's distribution at each (a PROBS frame, float32 [K, V], then a DRAFT frame, int32
[last token, drafts]); the entry runs the target over them in one lap of the ring (t_v) and applies the exact rule
(agents.modes.speculative.verify), then sends the verdict (VERDICT: accepted, next token). The entry serves the
clients' rounds in arrival order, one lap at a time, each client's KV in its own per-stream cache.

spec.pipelined: after sending a round the client keeps drafting the most likely continuation (the draft's argmax
guess for the target's next token, then K drafts after it) while the round is verified; if the verdict accepts
all K and its next token is the guess, those drafts are the next round's, sent at once; otherwise they are dropped.

The edge reports one "spec" lap per round (start: the previous verdict; end: this one; its facts a DsdRound: what it
drafted, waited and accepted) and a "request" lap for the whole request; the entry reports its "verify" laps.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch
import trio

from agents.process import wire
from agents.modes.dsd.facts import DsdRequest, DsdRound, DsdVerify
from agents.modes.speculative.runner import Drafter, PositionRandom, overlap, probabilities, sample, verify
from agents.zoo.prompts import prompt_ids
from agents.process.ring import RingClient
from agents.modes.speculative.settings import SpecSettings
from testbed.core.decode import DecodeConfig, SpecConfig
from testbed.core.errors import PeerTimeout, WireError
from testbed.core.records import LapRecord, Stamp

LAP_KINDS = ("verify", "prefill")


def exact_q(q: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """The draft distribution as both sides will use it: rounded to the float32 that crosses the wire, renormalized."""
    q32 = q.to(torch.float32)
    return q32.to(torch.float64) / q32.to(torch.float64).sum(), q32.numpy()


def randoms(seed: int, client: int) -> PositionRandom:
    return PositionRandom(seed * 1009 + client)


class VerifyServer:
    """The entry: prefills each client's prompt and verifies its rounds; ends when every client said BYE."""

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        self.config, self.ring = config, ring
        self.probs: dict[int, np.ndarray] = {}
        self.rand: dict[int, PositionRandom] = {}
        self.overlaps: dict[int, float] = {}  # sum_x min(p, q) over the round's drafts: alpha-hat

    async def receive(self) -> tuple[wire.Frame, float]:
        with trio.move_on_after(self.ring.lap_timeout_s):
            return await self.ring.side.receive()
        raise PeerTimeout(f"no frame from the edge clients within {self.ring.lap_timeout_s:g} s")

    def queued(self) -> list[tuple[wire.Frame, float]]:
        items = []
        while True:
            try:
                items.append(self.ring.side.receive_nowait())
            except trio.WouldBlock:
                return items

    def decider(self, c: int, frame: wire.Frame) -> Callable[[torch.Tensor], tuple[int, int]]:
        """The exact rule on client c's round, given the target's logits over [last, drafts]."""
        config, ids = self.config, frame.tensor.tolist()
        rand = self.rand.setdefault(c, randoms(config.seed, c))
        if frame.flags & wire.PROMPT:
            return lambda logits: (0, sample(probabilities(logits[-1], config.temperature),
                                             rand.generator(len(ids), PositionRandom.RESIDUAL)))
        q = self.probs.pop(c, None)
        drafts, base = ids[1:], frame.pos + 1
        if q is None or q.shape != (len(drafts), self.ring.stage.model.config.vocab_size):
            raise WireError(f"client {c}'s drafts came without their {len(drafts)} rows of probabilities")
        qs = [exact_q(torch.from_numpy(row))[0] for row in q]

        def decide(logits: torch.Tensor) -> tuple[int, int]:
            p = [probabilities(row, config.temperature) for row in logits]
            self.overlaps[c] = sum(overlap(p[i], qs[i]) for i in range(len(drafts)))
            return verify(drafts, qs, p, lambda offset, purpose: rand.generator(base + offset, purpose))

        return decide

    async def run(self) -> int:
        """Rounds in arrival order, one lap each; with decode.batching = "continuous" on a one-node cloud, every
        round queued when the entry turns to its inbox is verified in one batched pass (StageConfig.cost_ms with
        the batch: compute_ms + per_token_ms (b - 1))."""
        ring = self.ring
        clients = {dst - ring.n_stages for dst in ring.peers if dst >= ring.n_stages}
        batched = self.config.batching == "continuous" and ring.n_stages == 1
        served = 0
        while clients:
            rounds = []
            for frame, recv in [await self.receive()] + (self.queued() if batched else []):
                c = frame.stream
                if c not in clients or frame.tensor is None:
                    raise WireError(f"a {frame.kind.name} frame from unknown or finished client {c}")
                if frame.kind == wire.Kind.PROBS:
                    self.probs[c] = frame.tensor
                elif frame.flags & wire.BYE:
                    clients.discard(c)
                elif frame.flags & wire.PROMPT or not batched:
                    kind = "prefill" if frame.flags & wire.PROMPT else "verify"
                    verdict, record = await ring.lap(frame.tensor.tolist(), frame.pos, kind, self.decider(c, frame),
                                                     stream=c)
                    await self.reply(frame, recv, verdict, record)
                    served += verdict[0] + 1
                else:
                    rounds.append((frame, recv, self.decider(frame.stream, frame)))
            if rounds:
                served += await self.verify_batch(rounds)
        return served

    async def verify_batch(self, rounds: list) -> int:
        """Several clients' rounds in one (emulated) batched forward pass of the one-node cloud; real numerics per client."""
        ring, clock = self.ring, self.ring.clock
        start = clock.now()
        verdicts = []
        with torch.inference_mode():
            for frame, _, decide in rounds:
                hidden = ring.stage.embed_and_run(frame.tensor.tolist(), frame.pos, frame.stream)
                verdicts.append(decide(ring.stage.logits(hidden)))
        real_end = clock.now()
        b, n_tok = len(rounds), rounds[0][0].tensor.size
        await clock.sleep_until(start + max(ring.cost_s(n_tok, b), ring.dilation * (real_end - start)))
        end = clock.now()
        for (frame, recv, _), verdict in zip(rounds, verdicts):
            stamp = Stamp(0, start, start, real_end, end, end, batch=b)
            record = LapRecord(ring.lap_no, "verify", ring.mode, n_tok, 0, start, end, (stamp,), end, stream=frame.stream)
            ring.lap_no += 1
            await self.reply(frame, recv, verdict, record)
        return sum(v[0] + 1 for v in verdicts)

    async def reply(self, frame: wire.Frame, recv: float, verdict: tuple[int, int], record: LapRecord) -> None:
        """The verdict to the client, and the lap to the launcher (a prompt's: with the client's first token)."""
        ring, c = self.ring, frame.stream
        reply = wire.Frame(wire.Kind.VERDICT, stream=c, lap=frame.lap, pos=frame.pos, tensor=np.array(verdict, np.int32))
        await ring.send(ring.pass_through(reply, ring.clock.now()), ring.n_stages + c)
        facts = DsdVerify(c, max(0.0, record.start - recv), frame.tensor.size - 1,
                          record.stamps[0].batch if record.stamps else 1, self.overlaps.pop(c, None))
        first = {"tokens": 1, "ids": (verdict[1],)} if frame.flags & wire.PROMPT else {}
        ring.report(dataclasses.replace(record, facts=facts, **first))


class EdgeClient:
    """One edge client: its prompt, then rounds of K drafts until decode.tokens tokens (its own request)."""

    def __init__(self, config: DecodeConfig, ring: RingClient, spec: SpecConfig) -> None:
        from agents.process.shared import draft_name, shared_model

        self.config, self.ring, self.spec = config, ring, spec
        self.client = ring.index - ring.n_stages
        self.k = int(config.settings(SpecSettings).k)
        self.rand = randoms(config.seed, self.client)
        model = shared_model(draft_name(config.draft, ring.stage.model))
        self.drafter = Drafter(model, config.draft, config.alpha, config.temperature, config.draft_ms / 1e3, self.rand,
                               ring.clock, ring.dilation)

    async def draft_one(self, context: list[int]) -> tuple[int, torch.Tensor, float]:
        """One draft token after `context`: (token, its exact q, real seconds); padded to draft_ms with a sleep."""
        from agents.modes.speculative.runner import calibrated_q

        clock = self.ring.clock
        step = clock.now()
        logits = self.drafter._next_distribution(context)
        q = probabilities(logits, self.config.temperature)
        if self.config.draft == "calibrated":
            q, _ = calibrated_q(q, self.config.alpha)
        q, _ = exact_q(q)
        token = sample(q, self.rand.generator(len(context), PositionRandom.DRAFT))
        took = clock.now() - step
        await clock.sleep_until(step + max(self.drafter.draft_s, self.ring.dilation * took))
        return token, q, took

    async def send_round(self, sequence: list[int], drafts: list[int], qs: list[torch.Tensor], lap: int) -> None:
        probs = np.stack([exact_q(q)[1] for q in qs])
        now = self.ring.clock.now()
        for frame in (wire.Frame(wire.Kind.PROBS, stream=self.client, lap=lap, tensor=probs),
                      wire.Frame(wire.Kind.DRAFT, stream=self.client, lap=lap, pos=len(sequence) - 1,
                                 tensor=np.array([sequence[-1]] + drafts, np.int32))):
            await self.ring.send(self.ring.pass_through(frame, now), 0)

    async def verdict(self) -> tuple[int, int, float]:
        """(accepted, the target's next token, when the verdict arrived)."""
        frame, arrived = await self.ring.receive()
        if frame.kind != wire.Kind.VERDICT or frame.tensor is None or frame.tensor.shape != (2,):
            raise WireError(f"edge client {self.client} expected a verdict, got a {frame.kind.name} frame")
        return int(frame.tensor[0]), int(frame.tensor[1]), arrived

    async def run(self) -> int:
        ring, clock, config, k = self.ring, self.ring.clock, self.config, self.k
        sequence = prompt_ids(config, ring.stage.model)
        request_start = clock.now()
        await ring.send(ring.pass_through(wire.Frame(wire.Kind.DRAFT, stream=self.client, flags=wire.PROMPT,
                                                     tensor=np.array(sequence, np.int32)), request_start), 0)
        sequence.append((await self.verdict())[1])
        generated, lap, ready = 1, 0, None  # ready: a pipelined round drafted while the last one was verified
        last = clock.now()
        while generated < config.tokens and len(sequence) + k + 2 <= ring.stage.model.config.block_size:
            start = clock.now()
            drafts, qs, real = ready if ready is not None else ([], [], 0.0)
            had = len(drafts)  # drafted ahead, during the last round's wait
            while len(drafts) < k:
                token, q, took = await self.draft_one(sequence + drafts)
                drafts, qs, real = drafts + [token], qs + [q], real + took
            draft_s = clock.now() - start
            await self.send_round(sequence, drafts, qs, lap)
            sent = clock.now()
            guess, ahead = None, ([], [], 0.0)
            if self.spec.pipelined:
                guess, ahead = await self.draft_ahead(sequence + drafts)
            accepted, nxt, arrived = await self.verdict()
            end = clock.now()
            hit = self.spec.pipelined and accepted == k and nxt == guess
            new = drafts[:accepted] + [nxt]
            sequence += new
            generated += len(new)
            ready = ahead if hit else None
            ring.report(LapRecord(lap, "spec", ring.mode, k + 1, len(new), last, end, (), end, ids=tuple(new),
                                  stream=self.client,
                                  facts=DsdRound(k, accepted, draft_s, real, had, 0.0, end - sent, arrived - sent, hit,
                                                 self.client, config.draft)))
            last, lap = end, lap + 1
        ring.report(LapRecord(lap, "request", ring.mode, 0, generated, request_start, clock.now(), (), clock.now(),
                              stream=self.client, facts=DsdRequest(self.client, lap)))
        await ring.send(ring.pass_through(wire.Frame(wire.Kind.DRAFT, stream=self.client, flags=wire.BYE,
                                                     tensor=np.zeros(0, np.int32)), clock.now()), 0)
        return generated

    async def draft_ahead(self, context: list[int]) -> tuple[int | None, tuple[list[int], list[torch.Tensor], float]]:
        """Pipelined: while the verdict is on its way, the guess (the draft's argmax after `context`) and up to K
        drafts after it; stops as soon as the verdict is in (it stays queued for `verdict`)."""
        clock, ring = self.ring.clock, self.ring
        step = clock.now()
        guess = int(torch.argmax(self.drafter._next_distribution(context)))  # one draft step too
        await clock.sleep_until(step + max(self.drafter.draft_s, ring.dilation * (clock.now() - step)))
        drafts, qs, real = [], [], 0.0
        while len(drafts) < self.k and ring.inbox.statistics().current_buffer_used == 0:
            token, q, took = await self.draft_one(context + [guess] + drafts)
            drafts, qs, real = drafts + [token], qs + [q], real + took
        return guess, (drafts, qs, real)


Runner = VerifyServer  # what an agent of this mode runs (ModeInfo.runner_path)
