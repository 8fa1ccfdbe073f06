"""python -m testbed acceptance: acceptance per draft position, calibrated on one set of prompts, checked on another.

The i.i.d. form Gamma(alpha_hat, K) misses the tokens a round of the shipped draft/target pair yields (acceptance is
not i.i.d. across draft positions). This study measures the positional vector a_i = P(accept draft i | drafts 0..i-1
accepted) (agents.modes.speculative.positional) at K_cal on a calibration set of prompts, predicts Gamma(K) =
1 + sum_{i<K} S_i and K* from it, beside Gamma(alpha_hat, K) with alpha_hat from the same rounds, then measures Gamma
at every K in 1..K_cal on held-out prompts and prints each prediction's error.

Offline, not on a ring: acceptance is a property of the two models, the rule and the text, not of the ring, which
only adds time. So the rounds run in this process with the real models (the scenario's target and the draft a
speculating entry would load: agents.process.shared) and the mode's own parts (agents.modes.speculative.runner's
Drafter, verify, probabilities and PositionRandom), step for step as SpeculativeMode.round takes them: the target
verifies a block [last token] + K drafts with its KV cache, and the same seed gives the same tokens as a ring run
(tests/test_acceptance.py holds the two to each other). Thousands of rounds take seconds here, not hours of ring.

Prompts are windows of the shipped prompt text (agents.zoo.prompts.SOURCE, which synthetic prompts are windows of):
window w is its tokens [64 w, 64 (w + 1)); a seeded shuffle of the windows gives the calibration set and a disjoint
held-out set. Each
prompt is continued for the same number of tokens at every K, so every K covers the same stretch of text (rounds
that stopped at a fixed count would reach further into the text at a larger K). Random draws are keyed by prompt
and position (PositionRandom): the same draws at every K. Standard errors are the jackknife over prompts (the rounds
of one prompt are correlated; prompts are independent).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from agents.modes.speculative import positional
from agents.modes.speculative.positional import PositionalAcceptance, positional_acceptance
from agents.modes.speculative.runner import Drafter, PositionRandom, overlap, probabilities, sample, verify
from agents.zoo.prompts import SOURCE
from testbed.core import physics
from testbed.core.clock import MONOTONIC
from testbed.core.errors import ConfigError
from testbed.scenario.config import Scenario
from testbed.studies.acceptance.figures import DRAFTS
from testbed.studies.acceptance.result import AcceptanceResult, AcceptanceRow, PositionRow
from testbed.studies.base import ensure_models_on, log_to, make_scenario, print_tables, results_path, write_json

PROMPT_TOKENS = 64  # each prompt's window of the shipped text
SEED_STRIDE = 100_003  # prompt p of seed s draws with PositionRandom(s * SEED_STRIDE + p): its own draws


@dataclass(frozen=True)
class Round:
    """One round of the rule: K drafted, `accepted` kept, the tokens it added, and sum_i sum_x min(p_i, q_i)."""

    k: int
    accepted: int
    ids: tuple[int, ...]  # the accepted drafts and the token the target drew after them
    overlap_sum: float

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class PromptRounds:
    """The rounds one prompt's continuation took at one K."""

    window: int
    k: int
    rounds: tuple[Round, ...]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.rounds)


def text_ids(vocabulary) -> tuple[int, ...]:
    """The shipped prompt text (agents.zoo.prompts.SOURCE, what synthetic prompts are windows of) in the models'
    tokens."""
    return tuple(vocabulary.encode(SOURCE.read_text()))


def prompt_sets(n: int, seed: int, text_tokens: int) -> tuple[list[int], list[int]]:
    """Calibration and held-out windows (window w: tokens [w P, (w + 1) P) of the text), n each, disjoint: a seeded
    shuffle of every whole window."""
    windows = text_tokens // PROMPT_TOKENS
    if not 1 <= n <= windows // 2:
        raise ConfigError(f"expected 1..{windows // 2} prompts a set (the shipped text has {windows} windows of "
                          f"{PROMPT_TOKENS} tokens, two sets), got {n}", key="--prompts")
    chosen = random.Random(seed).sample(range(windows), 2 * n)
    return sorted(chosen[:n]), sorted(chosen[n:])


class Speculation:
    """A target and a draft, run offline by the speculative mode's own rule (SpeculativeMode.round's steps)."""

    def __init__(self, target, draft_model, draft: str, alpha: float, temperature: float) -> None:
        self.target = target
        self.draft_model = draft_model
        self.draft = draft
        self.alpha = alpha
        self.temperature = temperature
        self.draft_real_s = 0.0  # real time of every draft pass, and their count: c_d when the scenario sets none
        self.draft_passes = 0

    @torch.inference_mode()
    def continue_prompt(self, prompt: list[int], k: int, tokens: int, rand: PositionRandom) -> tuple[Round, ...]:
        """Rounds at K until `tokens` tokens follow the prompt's first (the prefill's) token."""
        target, temperature = self.target, self.temperature
        n_layer = target.config.n_layer
        drafter = Drafter(self.draft_model, self.draft, self.alpha, temperature, 0.0, rand, MONOTONIC)
        cache = target.new_cache(n_layer)
        x = target.run_layers(target.embed(torch.tensor([prompt]), 0), 0, n_layer, cache)  # [1, P, C]
        sequence = list(prompt)
        sequence.append(sample(probabilities(target.head(x)[0, -1], temperature),
                               rand.generator(len(sequence), PositionRandom.RESIDUAL)))
        rounds, generated = [], 0
        while generated < tokens:
            context, drafts, qs = list(sequence), [], []
            for _ in range(k):
                token, q, took = drafter.step(context)
                self.draft_real_s += took
                drafts.append(token)
                qs.append(q)
                context.append(token)
            pos, base = len(sequence) - 1, len(sequence)
            cache.truncate(pos)  # the rejected tail of the last block, and its last token (verified again first)
            block = torch.tensor([[sequence[-1]] + drafts])  # [1, K + 1]
            logits = target.head(target.run_layers(target.embed(block, pos), 0, n_layer, cache))[0]  # [K + 1, V]
            p = [probabilities(row, temperature) for row in logits]
            accepted, nxt = verify(drafts, qs, p, lambda offset, purpose: rand.generator(base + offset, purpose))
            new_tokens = drafts[:accepted] + [nxt]
            sequence.extend(new_tokens)
            rounds.append(Round(k, accepted, tuple(new_tokens), sum(overlap(p[i], qs[i]) for i in range(k))))
            generated += accepted + 1
        self.draft_passes += sum(r.k for r in rounds)
        return tuple(rounds)


def measured_gamma(runs: Sequence[PromptRounds]) -> float:
    """Tokens per round over the prompts' rounds (the ratio a run's summary reports)."""
    return sum(r.tokens for r in runs) / sum(len(r.rounds) for r in runs)


def counts_of(runs: Sequence[PromptRounds]) -> PositionalAcceptance:
    return positional_acceptance((r.k, r.accepted) for run in runs for r in run.rounds)


def counts_by_start(runs: Sequence[PromptRounds]) -> tuple[PositionalAcceptance, PositionalAcceptance]:
    """The counts of the rounds that start after a residual token (the round before rejected a draft), and of those
    that start after a token drawn from the target's p (the round before accepted all K, or the prefill)."""
    after = {"residual": [], "target": []}
    for run in runs:
        start = "target"
        for r in run.rounds:
            after[start].append((r.k, r.accepted))
            start = "target" if r.accepted == r.k else "residual"
    return positional_acceptance(after["residual"]), positional_acceptance(after["target"])


def two_state(runs: Sequence[PromptRounds], k: int) -> float:
    after_residual, after_target = counts_by_start(runs)
    return positional.two_state_gamma(after_residual.vector, after_target.vector, k)


def alpha_hat_of(runs: Sequence[PromptRounds]) -> float:
    """Mean sum_x min(p, q) over drafted positions: the runner's alpha_hat (KChooser.alpha_hat)."""
    return sum(r.overlap_sum for run in runs for r in run.rounds) / sum(r.k for run in runs for r in run.rounds)


def error_pct(predicted: float, measured: float) -> float:
    return (predicted / measured - 1) * 100


def timings(scenario: Scenario, speculation: Speculation) -> tuple[float, float, float]:
    """(c_d, C, T_ring) for K*: the scenario's emulated draft and lap compute, else the draft's real pass time."""
    draft_s = scenario.decode.draft_ms / 1e3 or speculation.draft_real_s / max(speculation.draft_passes, 1)
    return draft_s, scenario.emulated_compute_s, scenario.t_ring_s


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread while the study computes: its passes are a few tokens wide, where an intra-op pool only
    adds hand-offs (and on a shared box, waits)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def measure(scenario: Scenario, draft: str, alpha: float, k_cal: int, prompts: int, tokens: int, seed: int,
            log) -> AcceptanceResult:
    with one_thread():
        return _measure(scenario, draft, alpha, k_cal, prompts, tokens, seed, log)


def _measure(scenario: Scenario, draft: str, alpha: float, k_cal: int, prompts: int, tokens: int, seed: int,
             log) -> AcceptanceResult:
    from agents.process.shared import draft_name, shared_model

    started = time.perf_counter()
    target = shared_model(scenario.model)
    draft_model = shared_model(draft_name(draft, target))
    block_size = min(target.config.block_size, draft_model.config.block_size)
    if PROMPT_TOKENS + 1 + tokens + k_cal + 1 > block_size:
        raise ConfigError(f"expected a prompt ({PROMPT_TOKENS}), --tokens and a last round of --k-cal + 1 to fit "
                          f"the models' {block_size} positions, got --tokens {tokens} at K_cal {k_cal}", key="--tokens")
    text = text_ids(target.vocabulary)
    calibration, held_out = prompt_sets(prompts, seed, len(text))
    speculation = Speculation(target, draft_model, draft, alpha, scenario.decode.temperature)

    def run_set(windows: list[int], k: int) -> list[PromptRounds]:
        return [PromptRounds(w, k, speculation.continue_prompt(list(text[w * PROMPT_TOKENS:(w + 1) * PROMPT_TOKENS]),
                                                               k, tokens, PositionRandom(seed * SEED_STRIDE + w)))
                for w in windows]

    log(f"calibrating at K = {k_cal} on {prompts} prompts ({draft} draft)")
    calibrated = run_set(calibration, k_cal)
    counts = counts_of(calibrated)
    vector, alpha_hat = counts.vector, alpha_hat_of(calibrated)
    if len(vector) < k_cal:
        raise ConfigError(f"no calibration round reached draft position {len(vector)}: more prompts or --tokens",
                          key="--prompts")

    def predicted(runs: Sequence[PromptRounds], k: int) -> float:
        return positional.predict_gamma(counts_of(runs).vector, k)

    rows, measured_by_k = [], {}
    for k in range(1, k_cal + 1):
        runs = run_set(held_out, k)
        measured = measured_gamma(runs)
        measured_by_k[k] = measured
        per_position = positional.predict_gamma(vector, k)
        iid = physics.gamma(min(alpha_hat, 1.0), k)
        by_start = two_state(calibrated, k)
        log(f"held out, K = {k}: Gamma {measured:.3f} measured, {per_position:.3f} per position, {by_start:.3f} "
            f"two-state, {iid:.3f} iid")
        rows.append(AcceptanceRow(
            k, sum(len(r.rounds) for r in runs), measured, positional.jackknife_se(runs, measured_gamma),
            per_position, positional.jackknife_se(calibrated, lambda kept, k=k: predicted(kept, k)),
            error_pct(per_position, measured), iid, error_pct(iid, measured), by_start,
            positional.jackknife_se(calibrated, lambda kept, k=k: two_state(kept, k)), error_pct(by_start, measured)))
    draft_s, compute_s, t_ring_s = timings(scenario, speculation)
    after_residual, after_target = counts_by_start(calibrated)
    split = lambda counts, i: counts.vector[i] if i < len(counts.vector) else None  # noqa: E731
    positions = tuple(PositionRow(i, counts.reached[i], a, se, s, alpha_hat ** (i + 1), split(after_residual, i),
                                  after_residual.reached[i] if i < len(after_residual.reached) else 0,
                                  split(after_target, i), after_target.reached[i] if i < len(after_target.reached) else 0)
                      for i, (a, se, s) in enumerate(zip(vector, counts.standard_errors, counts.survival)))
    return AcceptanceResult(
        scenario.name, draft, alpha if draft == "calibrated" else None, scenario.decode.temperature, scenario.model,
        k_cal, prompts, PROMPT_TOKENS, tokens, seed, tuple(calibration), tuple(held_out),
        sum(len(r.rounds) for r in calibrated), alpha_hat, counts.reached, counts.accepted, positions, tuple(rows),
        draft_s * 1e3, compute_s * 1e3, t_ring_s * 1e3, *k_stars(vector, alpha_hat, measured_by_k, draft_s, compute_s,
                                                                 t_ring_s), time.perf_counter() - started)


def tables(result: AcceptanceResult) -> list[Table]:
    draft = result.draft + (f" (alpha {result.alpha:g})" if result.alpha is not None else "")
    gamma = Table(title=f"{result.scenario}: tokens a round, {draft} draft, temperature {result.temperature:g}: "
                        f"measured on {result.prompts} held-out prompts vs predicted from {result.prompts} calibration "
                        f"prompts at K_cal = {result.k_cal} ({result.calibration_rounds} rounds, alpha-hat "
                        f"{result.alpha_hat:.3f})")
    for col in ("K", "rounds", "measured Γ", "± SE", "per-position Γ", "± SE", "err %", "two-state Γ", "± SE",
                "err %", "iid Γ(α̂, K)", "err %"):
        gamma.add_column(col, justify="right")
    for r in result.acceptance_rows:
        gamma.add_row(str(r.k), str(r.rounds), f"{r.measured_gamma:.3f}", f"{r.measured_se:.3f}",
                      f"{r.positional_gamma:.3f}", f"{r.positional_se:.3f}", f"{r.positional_error_pct:+.2f}",
                      f"{r.two_state_gamma:.3f}", f"{r.two_state_se:.3f}", f"{r.two_state_error_pct:+.2f}",
                      f"{r.iid_gamma:.3f}", f"{r.iid_error_pct:+.2f}")
    gamma.caption = (f"K* over 1..{result.k_cal} with c_d {result.draft_ms:g} ms, C {result.compute_ms:g} ms, T_ring "
                     f"{result.t_ring_ms:g} ms: per-position {result.k_star_positional} "
                     f"({result.k_star_positional_tok_s:.2f} tok/s), iid {result.k_star_iid} "
                     f"({result.k_star_iid_tok_s:.2f} tok/s), measured {result.k_star_measured} "
                     f"({result.k_star_measured_tok_s:.2f} tok/s); {result.wall_s:.1f} s")
    vector = Table(title="The positional acceptance vector (calibration set)")
    for col in ("i", "reached", "a_i", "± SE", "S_i", "iid α̂^(i+1)", "a_i after a residual (reached)",
                "a_i after the target's token (reached)"):
        vector.add_column(col, justify="right")
    cell = lambda a, n: "-" if a is None else f"{a:.3f} ({n})"  # noqa: E731
    for p in result.positions:
        vector.add_row(str(p.i), str(p.reached), f"{p.acceptance:.3f}", f"{p.se:.3f}", f"{p.survival:.3f}",
                       f"{p.iid_survival:.3f}", cell(p.after_residual, p.reached_after_residual),
                       cell(p.after_target, p.reached_after_target))
    return [vector, gamma]


def k_stars(vector: Sequence[float], alpha_hat: float, measured_by_k: dict[int, float], draft_s: float,
            compute_s: float, t_ring_s: float) -> tuple[int, float, int, float, int, float]:
    """K* and its rate over the measured K: per position, i.i.d. from alpha_hat, and from the measured Gamma."""
    k_max = max(measured_by_k)
    k_positional, rate_positional = positional.best_k(vector, draft_s, compute_s, t_ring_s, k_max)
    k_iid, rate_iid = physics.best_k(min(alpha_hat, positional.TAIL_CAP), draft_s, compute_s, t_ring_s, k_max)
    rate = lambda k: measured_by_k[k] / physics.spec_round_s(k, draft_s, compute_s, t_ring_s)  # noqa: E731
    k_measured = max(measured_by_k, key=lambda k: (rate(k), -k))
    return k_positional, rate_positional, k_iid, rate_iid, k_measured, rate(k_measured)


def check_options(args: argparse.Namespace) -> None:
    if args.draft not in DRAFTS:
        raise ConfigError(f"expected one of {', '.join(DRAFTS)}, got {args.draft!r}", key="--draft")
    if args.alpha is not None and not 0.0 < args.alpha <= 1.0:
        raise ConfigError(f"expected an acceptance rate in (0, 1], got {args.alpha:g}", key="--alpha")
    if not 1 <= args.k_cal <= 32:
        raise ConfigError(f"expected a calibration K within 1..32, got {args.k_cal}", key="--k-cal")
    if args.tokens < 1:
        raise ConfigError(f"expected tokens a prompt >= 1, got {args.tokens}", key="--tokens")


def run(args: argparse.Namespace, console: Console) -> AcceptanceResult:
    check_options(args)
    scenario = make_scenario(args.scenario, overrides=list(args.overrides))
    ensure_models_on(console)
    alpha = scenario.decode.alpha if args.alpha is None else args.alpha
    return measure(scenario, args.draft, alpha, args.k_cal, args.prompts, args.tokens, args.seed, log_to(console))


def show(result: AcceptanceResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, tables(result))
    write_json(results_path(args, f"acceptance-{result.draft}", args.scenario), result.to_json(indent=2), console)
