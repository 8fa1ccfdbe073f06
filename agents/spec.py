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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from agents.model import GPT, KVCache
from agents.model import encode as encode_text
from testbed.core import clock, physics
from testbed.metrics import SPEC_MAX_POSITIONS

if TYPE_CHECKING:
    from agents.agent import Agent
    from testbed.laps import RunStats
    from testbed.metrics import RunMetrics

CONTEXT_KEEP = 64  # tokens kept when the context window fills and a new sequence starts
K_AUTO_START = 4  # K before anything has been measured
K_AUTO_WARMUP_ROUNDS = 3  # rounds at K_AUTO_START before the online choice takes over
ALPHA_PRIOR = 0.7
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
                 rand: PositionRandom) -> None:
        self.model = model
        self.kind = kind
        self.alpha = alpha
        self.temperature = temperature
        self.draft_s = draft_s  # emulated per-token draft time (0 = real time only)
        self.rand = rand
        self.cache = KVCache(model.config, model.config.n_layer)
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

    def propose(self, sequence: list[int], k: int) -> tuple[list[int], list[torch.Tensor], float, float]:
        """K drafts and their q rows; also the draft time (with emulation) and the real compute time."""
        drafts, qs, real = [], [], 0.0
        start = clock.now()
        context = list(sequence)
        for _ in range(k):
            step = clock.now()
            logits = self._next_distribution(context)
            if self.kind == "calibrated":
                q, _eps = calibrated_q(probabilities(logits, self.temperature), self.alpha)
            else:
                q = probabilities(logits, self.temperature)
            x = sample(q, self.rand.generator(len(context), PositionRandom.DRAFT))
            real += clock.now() - step
            clock.spin_until(step + self.draft_s)
            drafts.append(x)
            qs.append(q)
            context.append(x)
        return drafts, qs, clock.now() - start, real


@dataclass
class KChooser:
    """K fixed, or chosen online to maximize Gamma(a, K) / (K c_d + C + T_ring) from measured values."""

    fixed: int | None
    k_max: int
    alpha_sum: float = 0.0
    drafted: int = 0
    draft_per_token_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    ring_s: list[float] = field(default_factory=list)

    def observe(self, overlaps: list[float], draft_s: float, k: int, compute_s: float, ring_s: float) -> None:
        self.alpha_sum += sum(overlaps)
        self.drafted += len(overlaps)
        self.draft_per_token_s.append(draft_s / k)
        self.compute_s.append(compute_s)
        self.ring_s.append(ring_s)

    @property
    def alpha_hat(self) -> float:
        return self.alpha_sum / self.drafted if self.drafted else ALPHA_PRIOR

    def next_k(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if len(self.compute_s) < K_AUTO_WARMUP_ROUNDS:
            return min(K_AUTO_START, self.k_max)
        alpha = min(self.alpha_hat, 0.999)
        k, _rate = physics.best_k(alpha, float(np.median(self.draft_per_token_s)), float(np.median(self.compute_s)),
                                  float(np.median(self.ring_s)), self.k_max)
        return k


def _lap_compute_and_ring(record: dict, n_stages: int) -> tuple[float, float]:
    from testbed.laps import decompose

    lap = decompose(record, n_stages)
    return lap.compute_s, lap.ring_s


def k_schedule(decode: dict[str, Any]) -> Callable[[int, "KChooser"], int | None]:
    """Which K the next round uses: fixed, auto, or a sweep (rounds_per_k rounds at each K in k_sweep)."""
    sweep = list(decode.get("k_sweep") or [])
    rounds_per_k = int(decode.get("rounds_per_k", 30))
    if sweep:
        return lambda round_no, _chooser: sweep[round_no // rounds_per_k] if round_no < len(sweep) * rounds_per_k \
            else None
    return lambda _round_no, chooser: chooser.next_k()


async def run_speculative(agent: "Agent", decode: dict[str, Any]) -> None:
    """The entry node's decode loop with speculation; lap records carry the per-round figures.

    Ends after decode.tokens tokens, or, for a K sweep, after the last K's rounds.
    """
    from agents.train import load_model

    temperature = float(decode.get("temperature", 0.0))
    rand = PositionRandom(int(decode.get("seed", 0)))
    kind = decode.get("draft", "trained")
    draft_s = float(decode.get("draft_ms", 0.0)) / 1e3
    draft_model = load_model("target" if kind == "calibrated" else "draft")
    drafter = Drafter(draft_model, kind, float(decode.get("alpha", 0.8)), temperature, draft_s, rand)
    k_setting = decode.get("k", 4)
    chooser = KChooser(None if k_setting == "auto" else int(k_setting), int(decode.get("k_max", 24)))
    next_k = k_schedule(decode)
    sweeping = bool(decode.get("k_sweep"))
    block_size = agent.stage.model.config.block_size
    n_stages = agent.spec.n_stages
    prompt = encode_text(decode["prompt"])[-(block_size // 2):]
    sequence: list[int] = []
    generated, lap_no, round_no = 0, 0, 0

    async def restart(ids: list[int], origin: int) -> None:
        """Start a sequence (a prefill lap): at the beginning, when the context fills, and at each K of a sweep."""
        nonlocal sequence, generated, lap_no
        rand.origin = origin
        sequence = list(ids)
        token, record = await agent.lap(
            sequence, 0, lap_no, "prefill",
            lambda logits: sample(probabilities(logits[-1], temperature),
                                  rand.generator(len(sequence), PositionRandom.RESIDUAL)))
        agent.control.send("lap", tokens=1, ids=[token], **record)
        sequence.append(token)
        generated += 1
        lap_no += 1

    await restart(prompt, 0)
    target_tokens = int(decode["tokens"])
    while sweeping or generated < target_tokens:
        k = next_k(round_no, chooser)
        if k is None:
            break
        if sweeping and round_no > 0 and k != next_k(round_no - 1, chooser):
            await restart(prompt, 0)  # every K starts from the same state: common random numbers across K
        elif len(sequence) + k + 1 > block_size:
            await restart(sequence[-CONTEXT_KEEP:], rand.origin + len(sequence) - CONTEXT_KEEP)
        round_start = clock.now()
        drafts, qs, draft_time, draft_real = drafter.propose(sequence, k)
        block, pos = [sequence[-1]] + drafts, len(sequence) - 1
        base = len(sequence)

        def decide(logits: torch.Tensor) -> tuple[int, int, list[float]]:
            p = [probabilities(row, temperature) for row in logits]  # K+1 rows
            accepted, nxt = verify(drafts, qs, p, lambda offset, purpose: rand.generator(base + offset, purpose))
            return accepted, nxt, [overlap(p[i], qs[i]) for i in range(k)]

        (accepted, nxt, overlaps), record = await agent.lap(block, pos, lap_no, "spec", decide)
        new_tokens = drafts[:accepted] + [nxt]
        sequence.extend(new_tokens)
        generated += len(new_tokens)
        compute, ring = _lap_compute_and_ring(record, n_stages)
        chooser.observe(overlaps, draft_time, k, compute, ring)
        record["start"] = round_start  # a round is the draft plus the verify lap
        spec = {"k": k, "accepted": accepted, "draft_s": draft_time, "draft_real_s": draft_real,
                "overlap_sum": sum(overlaps), "draft": kind, "alpha_hat": chooser.alpha_hat,
                "k_auto": k_setting == "auto" and not sweeping}
        agent.control.send("lap", tokens=len(new_tokens), ids=new_tokens, spec=spec, **record)
        lap_no += 1
        round_no += 1
    agent.control.send("done", tokens=generated)


# --- launcher side: metrics and summary --------------------------------------------------------

def export_round(m: "RunMetrics", spec: dict, summary: dict | None) -> None:
    m.spec_num_drafts_total.inc()
    m.spec_num_draft_tokens_total.inc(spec["k"])
    m.spec_num_accepted_tokens_total.inc(spec["accepted"])
    for position in range(min(spec["accepted"], SPEC_MAX_POSITIONS)):
        m.spec_num_accepted_tokens_per_pos_total.labels(position=str(position)).inc()
    m.spec_draft_seconds.observe(spec["draft_s"])
    m.spec_k.set(spec["k"])
    if summary:
        m.spec_acceptance_rate.set(summary["alpha"])
        m.spec_gamma.labels(kind="measured").set(summary["gamma_measured"])
        m.spec_gamma.labels(kind="predicted").set(summary["gamma_predicted"])


def _rate_figures(rounds: list, t_ring: float, alpha: float) -> dict:
    """Measured and predicted figures of a set of rounds (all rounds of a run, or those at one K)."""
    ks = [lap.spec["k"] for lap in rounds]
    gamma_measured = float(np.mean([lap.tokens for lap in rounds]))
    draft_s = float(np.mean([lap.spec["draft_s"] for lap in rounds]))
    compute = float(np.mean([lap.compute_s for lap in rounds]))
    round_s = float(np.mean([lap.duration_s for lap in rounds]))
    gamma_predicted = float(np.mean([physics.gamma(min(alpha, 1.0), k) for k in ks]))
    return {
        "rounds": len(rounds), "gamma_measured": gamma_measured, "gamma_predicted": gamma_predicted,
        "draft_s": draft_s, "draft_per_token_s": draft_s / float(np.mean(ks)), "verify_compute_s": compute,
        "round_s": round_s, "measured_tok_s": sum(lap.tokens for lap in rounds) / sum(lap.duration_s for lap in rounds),
        # r_spec = Gamma / (K c_d + C + T_ring): measured Gamma, K c_d and C; configured T_ring
        "predicted_tok_s": gamma_measured / (draft_s + compute + t_ring),
        # the same with Gamma(alpha_hat, K) in place of the measured Gamma: the formula end to end
        "predicted_tok_s_from_alpha": gamma_predicted / (draft_s + compute + t_ring),
    }


def summarize_spec(stats: "RunStats", summary: dict) -> dict | None:
    """The JSON summary's `spec` object (DESIGN.md section 4) from the rounds seen so far."""
    rounds = [lap for lap in stats.laps if lap.kind == "spec"]
    if not rounds:
        return None
    ks = [lap.spec["k"] for lap in rounds]
    alpha = sum(lap.spec["overlap_sum"] for lap in rounds) / sum(ks)
    accepted_per_pos = [0] * max(ks)
    drafted_per_pos = [0] * max(ks)
    for lap in rounds:
        for i in range(lap.spec["k"]):
            drafted_per_pos[i] += 1
            accepted_per_pos[i] += int(i < lap.spec["accepted"])
    t_ring = stats.scenario.t_ring_s
    overall = _rate_figures(rounds, t_ring, alpha)
    k_star, r_star = physics.best_k(min(alpha, 0.999), overall["draft_per_token_s"], overall["verify_compute_s"],
                                    t_ring, max(stats.scenario.decode.k_max, max(ks)))
    spec = {
        "k": ks[-1] if len(set(ks)) == 1 else round(float(np.mean(ks)), 2), "k_last": ks[-1],
        "k_auto": bool(rounds[-1].spec.get("k_auto")), "draft": rounds[-1].spec["draft"],
        "drafted": sum(ks), "accepted": sum(lap.spec["accepted"] for lap in rounds), "alpha": alpha,
        "alpha_dialled": stats.scenario.decode.alpha if rounds[-1].spec["draft"] == "calibrated" else None,
        "acceptance_per_position": [a / d for a, d in zip(accepted_per_pos, drafted_per_pos)],
        **overall,
        "k_star": k_star, "k_star_tok_s": r_star,
        "plain_predicted_tok_s": physics.wall_rate(overall["verify_compute_s"], t_ring),
    }
    if len(set(ks)) > 1 and not spec["k_auto"]:
        per_k = []
        for k in sorted(set(ks)):
            at_k = [lap for lap in rounds if lap.spec["k"] == k]
            # the curve predicted from this run's alpha_hat, c_d and C, at this K
            formula = physics.spec_rate(min(alpha, 1.0), k, spec["draft_per_token_s"], spec["verify_compute_s"],
                                        t_ring)
            per_k.append({"k": k, **_rate_figures(at_k, t_ring, alpha), "formula_tok_s": formula})
        spec["per_k"] = per_k
        spec["k_star_measured"] = max(per_k, key=lambda row: row["measured_tok_s"])["k"]
        spec["k_star_predicted"] = max(per_k, key=lambda row: row["formula_tok_s"])["k"]
    return spec
