"""Overlapped speculation: the draft keeps drafting while the ring verifies, up to W rounds in flight.

A round is speculative decoding's (agents.modes.speculative): K drafts, one lap of the ring verifies them with the
exact rule. Here the entry does not wait for the verdict. After round j leaves, the draft goes on from its
optimistic continuation: all K accepted, and the target's next token equal to the draft's own guess g (drawn from the
draft's distribution with the very draw the rule uses for that position's bonus token, so the two agree as often as
the distributions let them). It then drafts round j+1 = [g, K drafts], which leaves once drafted and fewer than W
rounds are in flight. A verdict that accepts all K and whose next token is g is a hit: the round after it was drafted
from the verified sequence, so its verdict, when it comes, stands. Any other verdict is a miss: the tokens it gives
are kept, the rounds in flight are dropped (their frames still cross the ring; their verdicts are not read), and the
draft starts again from the verified sequence. The draft drafts at most one round beyond the window.

Lossless: a verdict is used only when its round was drafted from the verified sequence, and every draw is keyed by its
position (PositionRandom), so the tokens are synchronous speculation's at the same K and seed, greedy or sampled.

The draft is a device of its own beside the entry's share of the target: its passes are held as sleeps, so the entry
takes up returning frames (its head, padded to its cost) while the draft works. physics.overlap_run_s is the time of a
run of rounds between two misses; the summary sets it beside the measured time (agents.modes.overlap.summary).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import trio

from agents.modes.overlap.facts import OverlapRound
from agents.modes.overlap.settings import OverlapSettings
from agents.modes.speculative.runner import (K_AUTO_START, K_AUTO_WARMUP_ROUNDS, Drafter, KChooser, PositionRandom,
                                             Sequenced, overlap, probabilities, verify)
from agents.modes.speculative.settings import ALPHA_CAP, SpecSettings
from agents.process import wire
from agents.process.lap import PendingLap, end_lap, lap_record, start_lap
from agents.process.ring import CONTEXT_KEEP, RingClient
from agents.zoo.prompts import prompt_ids
from testbed.core import physics
from testbed.core.decode import DecodeConfig
from testbed.core.errors import PeerTimeout

EVENTS = 256  # the entry's event queue: frames back, rounds drafted, verdicts due


@dataclass
class Round:
    """A drafted round: its block [first token, K drafts] at position `pos`, and once sent, its lap."""

    branch: int
    pos: int
    block: list[int]
    qs: list[torch.Tensor]
    draft_s: float
    draft_real_s: float
    passes: int
    pending: PendingLap | None = None
    sent_at: float = 0.0
    in_flight: int = 0

    @property
    def drafts(self) -> list[int]:
        return self.block[1:]

    @property
    def k(self) -> int:
        return len(self.block) - 1


@dataclass
class Branch:
    """The draft's optimistic continuation from a verified sequence: its tokens (context[i] is position i's), its K,
    and the scope of the task drafting it."""

    number: int
    k: int  # every round of a branch drafts K (decode.k, or the chooser's pick for it)
    context: list[int]
    scope: trio.CancelScope
    stalled: bool = False  # the next round would not fit in the context window


@dataclass
class OverlapChooser(KChooser):
    """K fixed, or chosen at the start of each run (after a miss) to maximize physics.overlap_rate from what was
    measured: the survival curve (acceptance per position), the guess's hit rate, c_d and the lap (send to verdict).
    A run keeps its K: the closed form of a run (physics.overlap_run_s) is at one K."""

    window: int = 1
    all_accepted: int = 0  # rounds that accepted all K
    hits: int = 0  # ... and whose next token was the guess

    def observe_round(self, overlaps: list[float], draft_per_pass_s: float, k: int, lap_s: float, accepted: int,
                      hit: bool) -> None:
        self.observe(overlaps, draft_per_pass_s * k, k, lap_s, 0.0, accepted)
        self.all_accepted += accepted == k
        self.hits += hit

    def next_k(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if len(self.compute_s) < K_AUTO_WARMUP_ROUNDS:
            return min(K_AUTO_START, self.k_max)
        alpha = min(self.alpha_hat, ALPHA_CAP)
        survival = self.survival()
        tail = min(physics.survival_tail(survival, alpha), ALPHA_CAP) if survival else alpha
        guess = self.hits / self.all_accepted if self.all_accepted else alpha
        k, _rate = physics.best_k_overlap(survival, tail, guess, float(np.median(self.draft_per_token_s)),
                                          float(np.median(self.compute_s)), self.window, self.k_max)
        return k


class OverlapMode(Sequenced):
    """The entry's loop: drafted rounds out while fewer than W are in flight, verdicts in as frames return.

    Ends after config.tokens tokens and at least decode.min_rounds verified rounds.
    """

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        from agents.process.shared import draft_name, shared_model

        spec = config.settings(SpecSettings)  # no K sweep (ModeInfo.no_k_sweep: the scenario's loader saw to it)
        self.config, self.ring = config, ring
        self.window, self.min_rounds = config.settings(OverlapSettings).window, spec.min_rounds
        self.chooser = OverlapChooser(None if spec.k == "auto" else int(spec.k), spec.k_max, window=self.window)
        self.rand = PositionRandom(config.seed)
        self.drafter = Drafter(shared_model(draft_name(config.draft, ring.stage.model)), config.draft, config.alpha,
                               config.temperature, config.draft_ms / 1e3, self.rand, ring.clock, ring.dilation)
        self.block_size = ring.stage.model.config.block_size
        self.sequence: list[int] = []
        self.generated = self.rounds = self.run_no = self.run_index = 0
        self.inflight: deque[Round] = deque()  # sent, verdict awaited, oldest first
        self.ready: deque[Round] = deque()  # drafted, waiting for a place in the window
        self.by_lap: dict[int, Round] = {}  # frames expected back: the live rounds' and the dropped ones'
        self.branch: Branch | None = None
        self.last_verdict = 0.0
        self.progress = trio.Event()  # set when a verdict frees a place (the draft waits on it at W + 1 drafted)
        self.events_in, self.events = trio.open_memory_channel(EVENTS)
        self.verdicts_in, self.verdicts = trio.open_memory_channel(math.inf)  # (due, round, result), in order

    # --- the draft ---------------------------------------------------------------------------

    async def drafting(self, branch: Branch) -> None:
        """Draft rounds along `branch` while at most W are unverified; the first of a branch without a guess."""
        clock, drafter, k = self.ring.clock, self.drafter, branch.k
        context, first = branch.context, True
        while True:
            while len(self.inflight) + len(self.ready) > self.window:
                await self.progress.wait()
            if len(context) + (0 if first else 1) + k + 1 > self.block_size:
                branch.stalled = True
                await self.events_in.send(("stalled", branch.number, None))
                await trio.sleep_forever()
            start, held, real, passes = clock.now(), 0.0, 0.0, 0
            if not first:  # the guess of the target's next token, drawn as the rule draws the bonus token
                guess, _q, took = drafter.step(context, PositionRandom.RESIDUAL)
                held, real, passes = drafter.held_s(took), took, 1
                await clock.sleep_until(start + held)
                context.append(guess)
            pos, qs = len(context) - 1, []
            for _ in range(k):
                x, q, took = drafter.step(context)
                held, real, passes = held + drafter.held_s(took), real + took, passes + 1
                await clock.sleep_until(start + held)
                context.append(x)
                qs.append(q)
            first = False
            drafted = Round(branch.number, pos, context[pos:pos + k + 1], qs, held, real, passes)
            await self.events_in.send(("drafted", branch.number, drafted))

    def new_branch(self, nursery: trio.Nursery) -> None:
        """Drop every round in flight or waiting and draft again from the verified sequence."""
        if self.branch is not None:
            self.branch.scope.cancel()
        number = self.branch.number + 1 if self.branch is not None else 0
        self.branch = branch = Branch(number, self.chooser.next_k(), list(self.sequence), trio.CancelScope())
        self.inflight.clear()
        self.ready.clear()
        self.run_index = 0

        async def task() -> None:
            with branch.scope:
                await self.drafting(branch)

        nursery.start_soon(task)

    # --- the ring ----------------------------------------------------------------------------

    async def pump(self) -> None:
        """Frames back from the ring, into the entry's events in the order they came."""
        while True:
            frame, recv = await self.ring.inbox.receive()
            await self.events_in.send(("frame", -1, (frame, recv)))

    async def send_ready(self) -> None:
        while self.ready and len(self.inflight) < self.window:
            r = self.ready.popleft()
            r.sent_at = self.ring.clock.now()
            r.pending = await start_lap(self.ring, r.block, r.pos, "overlap")
            r.in_flight = len(self.inflight) + 1
            self.inflight.append(r)
            if self.ring.n_stages == 1:  # nothing leaves: the entry verifies it at once
                self.verify(r, None, r.sent_at)
            else:
                self.by_lap[r.pending.lap_no] = r

    async def deliver(self) -> None:
        """Each verdict when the entry's compute for it ends, in the order the rounds left: under time dilation a
        round's padded head can end before the one before it (a slow front is padded D times), and a verdict never
        overtakes an earlier one."""
        async for at, r, result in self.verdicts:
            await self.ring.clock.sleep_until(at)
            await self.events_in.send(("verdict", r.branch, (r, result)))

    def head(self, frame: wire.Frame, recv: float) -> None:
        """A frame back: a live round's goes through the head; a dropped round's is let go."""
        r = self.by_lap.pop(frame.lap, None)
        if r is not None and r.branch == self.branch.number:
            self.verify(r, frame, recv)

    def verify(self, r: Round, frame: wire.Frame | None, recv: float) -> None:
        """The exact rule over the round's logits (a ring of one stage: its own, `frame` None); the verdict is due
        when the entry's compute, padded to its cost, ends."""
        base, k = r.pos + 1, r.k

        def decide(logits: torch.Tensor) -> tuple[int, int, list[float]]:
            p = [probabilities(row, self.config.temperature) for row in logits]  # K + 1 rows
            accepted, nxt = verify(r.drafts, r.qs, p,
                                   lambda offset, purpose: self.rand.generator(base + offset, purpose))
            return accepted, nxt, [overlap(p[i], r.qs[i]) for i in range(k)]

        result, ready_at = end_lap(self.ring, r.pending, frame, recv, decide)
        self.verdicts_in.send_nowait((ready_at, r, result))

    def take_verdict(self, nursery: trio.Nursery, r: Round, result: tuple[int, int, list[float]]) -> None:
        """Keep the verdict's tokens, report the round; on a miss start a new branch."""
        accepted, nxt, overlaps = result
        oldest = self.inflight.popleft()
        assert oldest is r, "verdicts come in the order their rounds left"
        now = self.ring.clock.now()
        k = r.k
        guess_at = r.pos + k + 1  # the next token's position: the guess the round after r starts with
        context = self.branch.context
        hit = accepted == k and len(context) > guess_at and context[guess_at] == nxt
        self.chooser.observe_round(overlaps, r.draft_s / r.passes, k, now - r.sent_at, accepted, hit)
        new_tokens = r.drafts[:accepted] + [nxt]
        self.sequence.extend(new_tokens)
        self.generated += len(new_tokens)
        facts = OverlapRound(k, self.window, accepted, hit, self.run_no, self.run_index, r.draft_s,
                             r.draft_real_s, r.passes, sum(overlaps), r.sent_at - self.last_verdict, now - r.sent_at,
                             r.in_flight, 0 if hit else len(self.inflight) + len(self.ready))
        record = lap_record(self.ring, r.pending, now)
        self.ring.report(dataclasses.replace(record, start=self.last_verdict, tokens=len(new_tokens),
                                             ids=tuple(new_tokens), facts=facts))
        self.last_verdict = now
        self.rounds += 1
        self.run_index += 1
        if not hit:
            self.run_no += 1
            if not self.done:
                self.new_branch(nursery)
        self.progress.set()
        self.progress = trio.Event()

    @property
    def done(self) -> bool:
        return self.generated >= self.config.tokens and self.rounds >= self.min_rounds

    # --- the run -------------------------------------------------------------------------------

    async def restart(self, ids: list[int], origin: int) -> None:
        """Start a sequence with a prefill lap: at the beginning, and when the context fills."""
        await super().restart(ids, origin)
        self.last_verdict = self.ring.clock.now()

    async def segment(self) -> bool:
        """Rounds from the verified sequence until the run is done (True) or the context is full and no frame is
        still out (False: a restart follows)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.pump)
            nursery.start_soon(self.deliver)
            self.branch = None
            self.new_branch(nursery)
            while not self.done:
                if self.branch.stalled and not self.inflight and not self.by_lap:
                    nursery.cancel_scope.cancel()
                    return False
                waiting = bool(self.inflight or self.by_lap)
                try:
                    with trio.fail_after(self.ring.lap_timeout_s) if waiting else nullcontext():
                        kind, branch, item = await self.events.receive()
                except trio.TooSlowError as exc:
                    raise PeerTimeout(f"stage 0: no frame back within {self.ring.lap_timeout_s:g} s (box time) with "
                                      f"{len(self.by_lap)} rounds out") from exc
                if kind == "frame":
                    self.head(*item)
                elif branch != self.branch.number:
                    continue  # from a branch dropped since
                elif kind == "drafted":
                    self.ready.append(item)
                elif kind == "verdict":
                    self.take_verdict(nursery, *item)
                if not self.done:
                    await self.send_ready()
            nursery.cancel_scope.cancel()
        return True

    async def run(self) -> int:
        await self.restart(prompt_ids(self.config, self.ring.stage.model), 0)
        while not await self.segment():
            keep = self.sequence[-CONTEXT_KEEP:]
            await self.restart(keep, self.rand.origin + len(self.sequence) - CONTEXT_KEEP)
            self.run_no += 1
        return self.generated


Runner = OverlapMode  # what an agent of this mode runs (ModeInfo.runner_path)
