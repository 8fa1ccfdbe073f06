"""Speculative decoding across the ring: a local draft proposes K tokens, the ring verifies them in one lap.

The rule (Leviathan et al.; Chen et al.) preserves the target's output distribution exactly: draft x_i ~ q_i
is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the token is resampled
from norm(max(0, p_i - q_i)); if all K are accepted a bonus token is sampled from p_{K+1}.

Two drafts:
- ``trained``: the small trained draft model, on the entry node, with its own KV cache.
- ``calibrated``: q = (1 - eps) p + eps u with u a point mass on p's least likely token and eps chosen per
  position so that sum_x min(p, q) = 1 - eps * TV(p, u) equals the dialled alpha exactly. It needs the
  target's p at every draft position, so the entry node runs a local copy of the whole target (an
  oracle); its per-token time is emulated (decode.draft_ms) and reported as such.

Acceptance rate estimate: both p and q are at hand, so alpha_hat = mean over drafted positions of
sum_x min(p(x), q(x)), which, unlike accepted/drafted, is not biased by the stop at the first rejection.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from agents.zoo.model import GPT
from agents.modes.speculative.facts import SpecRound
from agents.zoo.prompts import prompt_ids
from agents.process.ring import CONTEXT_KEEP, RingClient
from testbed.core import physics
from testbed.core.clock import Clock
from agents.modes.speculative.settings import ALPHA_CAP, ALPHA_PRIOR, SpecSettings
from testbed.core.decode import DecodeConfig

K_AUTO_START = 4  # K before anything has been measured
K_AUTO_WARMUP_ROUNDS = 3  # rounds at K_AUTO_START before the online choice takes over
EPS = 1e-12


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling distribution; temperature 0 means greedy (a one-hot on the argmax)."""
    if temperature <= 0:
        return torch.nn.functional.one_hot(torch.argmax(logits, dim=-1), logits.shape[-1]).to(torch.float64)
    return torch.softmax(logits.to(torch.float64) / temperature, dim=-1)


def calibrated_q(p: torch.Tensor, alpha: float) -> tuple[torch.Tensor, float]:
    """q = (1 - eps) p + eps u with sum min(p, q) = alpha (or as close as a point mass u allows)."""
    worst = int(torch.argmin(p))
    tv = 1.0 - float(p[worst])  # TV(p, point mass on the least likely token)
    eps = min(1.0, (1.0 - alpha) / tv) if tv > EPS else 0.0
    q = (1.0 - eps) * p
    q[worst] += eps
    return q, eps


def overlap(p: torch.Tensor, q: torch.Tensor) -> float:
    """sum_x min(p(x), q(x)): the probability that the rule accepts a draft from q."""
    return float(torch.minimum(p, q).sum())


def sample(dist: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(dist.to(torch.float64), 1, generator=generator))


class PositionRandom:
    """Random draws keyed by (seed, sequence position, purpose): common random numbers across K.

    Every draw is still uniform and independent of every other draw, so the rule stays exact; but the
    coin that decides the draft at position j is the same whatever K is, so a K sweep compares the
    K-dependence of the rate rather than different luck. (A draft discarded after an earlier rejection
    never influenced the output, so re-using its position's draw later is still independent of it.)
    """

    DRAFT, ACCEPT, RESIDUAL = 1, 2, 3

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.origin = 0  # absolute index of the current sequence's first token (it moves when context fills)

    def generator(self, position: int, purpose: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 1_000_003 + self.origin + position) * 4 + purpose)


def verify(drafts: list[int], q: list[torch.Tensor], p: list[torch.Tensor],
           generator: torch.Generator | Callable[[int, int], torch.Generator]) -> tuple[int, int]:
    """The exact rule. p has K+1 rows (the last for the bonus). Returns (accepted count, next token).

    `generator` is one torch.Generator, or a function (offset in the block, purpose) -> Generator.
    """
    draw = generator if callable(generator) else (lambda _offset, _purpose: generator)
    for i, x in enumerate(drafts):
        ratio = float(p[i][x]) / max(float(q[i][x]), EPS)
        if ratio >= 1.0 or float(torch.rand((), generator=draw(i, PositionRandom.ACCEPT), dtype=torch.float64)) < ratio:
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = float(residual.sum())
        g = draw(i, PositionRandom.RESIDUAL)
        return i, sample(residual / total, g) if total > EPS else sample(p[i], g)
    return len(drafts), sample(p[len(drafts)], draw(len(drafts), PositionRandom.RESIDUAL))


class Drafter:
    """Proposes K tokens locally on the entry node, keeping its own KV cache in step with the sequence."""

    def __init__(self, model: GPT, kind: str, alpha: float, temperature: float, draft_s: float,
                 rand: PositionRandom, clock: Clock, dilation: float = 1.0) -> None:
        self.model = model
        self.clock = clock
        self.kind = kind
        self.alpha = alpha
        self.temperature = temperature
        self.draft_s = draft_s  # emulated per-token draft time (0 = real time only), already dilated
        self.dilation = dilation  # real drafting is padded to this many times its length (testbed.launch.dilation)
        self.rand = rand
        self.cache = model.new_cache(model.config.n_layer)
        self.fed: list[int] = []  # tokens whose keys/values are in the cache, in order

    @torch.inference_mode()
    def _next_distribution(self, sequence: list[int]) -> torch.Tensor:
        """Feed what the cache lacks of `sequence`; return the model's distribution for the next token."""
        common = 0
        for a, b in zip(self.fed, sequence):
            if a != b:
                break
            common += 1
        common = min(common, len(sequence) - 1)  # always feed at least the last token
        self.cache.truncate(common)
        del self.fed[common:]
        block = sequence[common:]
        idx = torch.tensor([block], dtype=torch.long)  # [1, T]
        x = self.model.embed(idx, common)  # [1, T, C]
        x = self.model.run_layers(x, 0, self.model.config.n_layer, self.cache)
        logits = self.model.head(x[:, -1:])[0, -1]  # [V]
        self.fed.extend(block)
        return logits

    def step(self, context: list[int], purpose: int = PositionRandom.DRAFT) -> tuple[int, torch.Tensor, float]:
        """One draft pass: the token drawn after `context` (with that position's `purpose` draw), its q row, and the
        pass's real time (the caller holds held_s of it)."""
        start = self.clock.now()
        logits = self._next_distribution(context)
        if self.kind == "calibrated":
            q, _eps = calibrated_q(probabilities(logits, self.temperature), self.alpha)
        else:
            q = probabilities(logits, self.temperature)
        return sample(q, self.rand.generator(len(context), purpose)), q, self.clock.now() - start

    def held_s(self, real_s: float) -> float:
        """What a pass that took `real_s` lasts: the emulated c_d, or D times its real time if longer."""
        return max(self.draft_s, self.dilation * real_s)

    async def propose(self, sequence: list[int], k: int) -> tuple[list[int], list[torch.Tensor], float, float]:
        """K drafts and their q rows; also the draft time (with emulation) and the real compute time.

        Each step lasts max(draft_ms, D x its real time); the steps follow one another with nothing in between, so
        the entry is held once, to the sum (on the box without yielding, as a busy device; on simulated time a sleep).
        """
        drafts, qs, real, held = [], [], 0.0, 0.0
        clock = self.clock
        start = clock.now()
        context = list(sequence)
        for _ in range(k):
            x, q, took = self.step(context)
            real += took
            held += self.held_s(took)
            drafts.append(x)
            qs.append(q)
            context.append(x)
        await clock.hold_until(start + held)
        return drafts, qs, clock.now() - start, real


@dataclass
class KChooser:
    """K fixed, or chosen online to maximize expected tokens / (K c_d + C + T_ring) from measured values.

    Expected tokens per round come from the measured survival curve (S_i: the share of rounds that drafted
    position i and accepted drafts 0..i), which holds for drafts whose rejections are correlated; positions
    with fewer than physics.SURVIVAL_MIN_ROUNDS samples extend it (physics.survival_gamma). Before any position has
    enough samples, the i.i.d. closed form Gamma(alpha_hat, K) decides.
    """

    fixed: int | None
    k_max: int
    alpha_sum: float = 0.0
    drafted: int = 0
    draft_per_token_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    ring_s: list[float] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)  # rounds that drafted position i
    accepted_at: list[int] = field(default_factory=list)  # ... and accepted drafts 0..i

    def observe(self, overlaps: list[float], draft_s: float, k: int, compute_s: float, ring_s: float,
                accepted: int = 0) -> None:
        self.alpha_sum += sum(overlaps)
        self.drafted += len(overlaps)
        self.draft_per_token_s.append(draft_s / k)
        self.compute_s.append(compute_s)
        self.ring_s.append(ring_s)
        if len(self.drafted_at) < k:
            grow = k - len(self.drafted_at)
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(k):
            self.drafted_at[i] += 1
            self.accepted_at[i] += int(accepted > i)

    def survival(self) -> list[float]:
        """The measured survival curve, over the leading positions with enough samples."""
        return physics.survival_curve(self.drafted_at, self.accepted_at)

    @property
    def alpha_hat(self) -> float:
        return self.alpha_sum / self.drafted if self.drafted else ALPHA_PRIOR

    def next_k(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if len(self.compute_s) < K_AUTO_WARMUP_ROUNDS:
            return min(K_AUTO_START, self.k_max)
        alpha = min(self.alpha_hat, ALPHA_CAP)
        timings = (float(np.median(self.draft_per_token_s)), float(np.median(self.compute_s)),
                   float(np.median(self.ring_s)))
        survival = self.survival()
        if survival:
            k, _rate = physics.best_k_survival(survival, min(physics.survival_tail(survival, alpha), ALPHA_CAP), *timings,
                                               self.k_max)
        else:
            k, _rate = physics.best_k(alpha, *timings, self.k_max)
        return k


def k_schedule(config: DecodeConfig) -> Callable[[int, KChooser], int | None]:
    """Which K the next round uses: fixed, auto, or a sweep (rounds_per_k rounds at each K in k_sweep)."""
    own = config.settings(SpecSettings)
    sweep, rounds_per_k = list(own.k_sweep), own.rounds_per_k
    if sweep:
        return lambda round_no, _chooser: sweep[round_no // rounds_per_k] if round_no < len(sweep) * rounds_per_k \
            else None
    return lambda _round_no, chooser: chooser.next_k()


class Sequenced:
    """A speculating entry's sequence: `sequence` (context[i] is position i's token), `rand`, `ring`, `config` and
    `generated` are the mode's; a prefill lap starts a sequence."""

    config: DecodeConfig
    ring: RingClient
    rand: PositionRandom
    sequence: list[int]
    generated: int

    def first_token(self, logits: torch.Tensor) -> int:
        return sample(probabilities(logits[-1], self.config.temperature),
                      self.rand.generator(len(self.sequence), PositionRandom.RESIDUAL))

    async def restart(self, ids: list[int], origin: int) -> None:
        """Start a sequence (a prefill lap): at the beginning, when the context fills, and at each K of a sweep."""
        self.rand.origin = origin
        self.sequence = list(ids)
        token, record = await self.ring.lap(self.sequence, 0, "prefill", self.first_token)
        self.ring.report(dataclasses.replace(record, tokens=1, ids=(token,)))
        self.sequence.append(token)
        self.generated += 1


class SpeculativeMode(Sequenced):
    """The entry node's decode loop with speculation; lap records carry the per-round figures (SpecRound facts).

    Ends after config.tokens tokens and at least config.min_rounds rounds, or, for a K sweep, after the last K's
    rounds.
    """

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        from agents.process.shared import draft_name, shared_model

        self.config = config
        self.ring = ring
        self.rand = PositionRandom(config.seed)
        draft_model = shared_model(draft_name(config.draft, ring.stage.model))
        self.drafter = Drafter(draft_model, config.draft, config.alpha, config.temperature, config.draft_ms / 1e3,
                               self.rand, ring.clock, ring.dilation)
        own = config.settings(SpecSettings)
        self.chooser = KChooser(None if own.k == "auto" else int(own.k), own.k_max)
        self.sequence: list[int] = []
        self.generated = 0

    async def round(self, k: int) -> None:
        """Draft K tokens, verify them in one lap, report the round."""
        config, clock = self.config, self.ring.clock
        round_start = clock.now()
        drafts, qs, draft_time, draft_real = await self.drafter.propose(self.sequence, k)
        block, pos = [self.sequence[-1]] + drafts, len(self.sequence) - 1
        base = len(self.sequence)

        def decide(logits: torch.Tensor) -> tuple[int, int, list[float]]:
            p = [probabilities(row, config.temperature) for row in logits]  # K+1 rows
            accepted, nxt = verify(drafts, qs, p, lambda offset, purpose: self.rand.generator(base + offset, purpose))
            return accepted, nxt, [overlap(p[i], qs[i]) for i in range(k)]

        (accepted, nxt, overlaps), record = await self.ring.lap(block, pos, "spec", decide)
        new_tokens = drafts[:accepted] + [nxt]
        self.sequence.extend(new_tokens)
        self.generated += len(new_tokens)
        self.chooser.observe(overlaps, draft_time, k, record.compute_s, record.ring_s, accepted)
        sweeping = bool(config.settings(SpecSettings).k_sweep)
        facts = SpecRound(k, accepted, draft_time, draft_real, sum(overlaps), config.draft, self.chooser.alpha_hat,
                          config.settings(SpecSettings).k == "auto" and not sweeping)
        # a round is the draft plus the verify lap
        self.ring.report(dataclasses.replace(record, start=round_start, tokens=len(new_tokens),
                                             ids=tuple(new_tokens), facts=facts))

    async def run(self) -> int:
        config = self.config
        block_size = self.ring.stage.model.config.block_size
        prompt = prompt_ids(config, self.ring.stage.model)
        next_k = k_schedule(config)
        sweeping = bool(config.settings(SpecSettings).k_sweep)
        await self.restart(prompt, 0)
        round_no = 0
        while sweeping or self.generated < config.tokens or round_no < config.settings(SpecSettings).min_rounds:
            k = next_k(round_no, self.chooser)
            if k is None:
                break
            if sweeping and round_no > 0 and k != next_k(round_no - 1, self.chooser):
                await self.restart(prompt, 0)  # every K starts from the same state: common random numbers across K
            elif len(self.sequence) + k + 1 > block_size:
                keep = self.sequence[-CONTEXT_KEEP:]
                await self.restart(keep, self.rand.origin + len(self.sequence) - CONTEXT_KEEP)
            await self.round(k)
            round_no += 1
        return self.generated


Runner = SpeculativeMode  # what an agent of this mode runs (ModeInfo.runner_path)
