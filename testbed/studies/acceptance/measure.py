"""python -m testbed acceptance: acceptance per draft position, calibrated on one set of prompts, checked on another.

The i.i.d. form Gamma(alpha_hat, K) misses the tokens a round of the shipped draft/target pair yields (acceptance is
not i.i.d. across draft positions), and so does one positional vector (a round's acceptance also depends on how the
round before ended, and the mix of ends depends on K). This study calibrates on rounds whose K is drawn afresh from
1..K_cal each round (so every start state and position up to K_cal is observed), predicts Gamma(K) and K* from them
three ways (agents.modes.speculative.positional: the start-state chain StartAcceptance, one vector, i.i.d. from
alpha_hat), then measures Gamma at every K in 1..K_cal on held-out prompts and prints each prediction's error with its
standard error.

Offline, not on a ring: acceptance is a property of the two models, the rule and the text, not of the ring, which
only adds time. So the rounds run in this process with the real models (the scenario's target and the draft a
speculating entry would load: agents.process.shared) and the mode's own parts (agents.modes.speculative.runner's
Drafter, verify, probabilities and PositionRandom), step for step as SpeculativeMode.round takes them: the target
verifies a block [last token] + K drafts with its KV cache, and the same seed gives the same tokens as a ring run
(tests/test_acceptance.py holds the two to each other). Thousands of rounds take seconds here, not hours of ring.

Prompts are windows of the shipped prompt text (agents.zoo.prompts.SOURCE, which synthetic prompts are windows of):
window w is its tokens [64 w, 64 (w + 1)); a seeded shuffle of the windows gives the calibration set and a disjoint
held-out set (--prompts all: every window, half in each). Each prompt is continued for the same number of tokens at
every K, so every K covers the same stretch of text (rounds that stopped at a fixed count would reach further into the
text at a larger K). Random draws are keyed by prompt and position (PositionRandom): the same draws at every K.
Standard errors are the jackknife over prompts (the rounds of one prompt are correlated; prompts are independent);
an error's combines the prediction's and the measurement's.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
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
from testbed.studies.acceptance import CAP
from testbed.studies.acceptance.figures import DRAFTS
from testbed.studies.acceptance.result import AcceptanceResult, AcceptanceRow, PositionRow
from testbed.studies.base import ensure_models_on, log_to, make_scenario, print_tables, results_path, write_json

PROMPT_TOKENS = 64  # each prompt's window of the shipped text
SEED_STRIDE = 100_003  # prompt p of seed s draws with PositionRandom(s * SEED_STRIDE + p): its own draws
K_DRAWS = 7919  # calibration prompt p of seed s draws its rounds' K with random.Random((s SEED_STRIDE + p) K_DRAWS + 1)
BAR_PCT = 2.0  # issue 51's bar on the per-position prediction's error


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


def prompt_sets(n: int | None, seed: int, text_tokens: int) -> tuple[list[int], list[int]]:
    """Calibration and held-out windows (window w: tokens [w P, (w + 1) P) of the text), n each (None: half the
    windows each), disjoint: a seeded shuffle of every whole window."""
    windows = text_tokens // PROMPT_TOKENS
    n = windows // 2 if n is None else n
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
    def continue_prompt(self, prompt: list[int], k: int | Callable[[int], int], tokens: int,
                        rand: PositionRandom) -> tuple[Round, ...]:
        """Rounds at K (or at k(r) drafts in round r) until `tokens` tokens follow the prompt's first (the prefill's)
        token."""
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
            k_round = k(len(rounds)) if callable(k) else k
            context, drafts, qs = list(sequence), [], []
            for _ in range(k_round):
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
            rounds.append(Round(k_round, accepted, tuple(new_tokens),
                                sum(overlap(p[i], qs[i]) for i in range(k_round))))
            generated += accepted + 1
        self.draft_passes += sum(r.k for r in rounds)
        return tuple(rounds)


def measured_gamma(runs: Sequence[PromptRounds]) -> float:
    """Tokens per round over the prompts' rounds (the ratio a run's summary reports)."""
    return sum(r.tokens for r in runs) / sum(len(r.rounds) for r in runs)


def counts_of(runs: Sequence[PromptRounds]) -> PositionalAcceptance:
    return positional_acceptance((r.k, r.accepted) for run in runs for r in run.rounds)


def sequences(runs: Sequence[PromptRounds]) -> list[list[tuple[int, int]]]:
    """Each prompt's rounds as (K, accepted) pairs, in order."""
    return [[(r.k, r.accepted) for r in run.rounds] for run in runs]


def conditional(runs: Sequence[PromptRounds], cap: int) -> positional.StartAcceptance:
    return positional.StartAcceptance.of(sequences(runs), cap)


def alpha_hat_of(runs: Sequence[PromptRounds]) -> float:
    """Mean sum_x min(p, q) over drafted positions: the runner's alpha_hat (KChooser.alpha_hat)."""
    return sum(r.overlap_sum for run in runs for r in run.rounds) / sum(r.k for run in runs for r in run.rounds)


def error_pct(predicted: float, measured: float) -> float:
    return (predicted / measured - 1) * 100


def error_se(predicted: float, predicted_se: float, measured: float, measured_se: float) -> float:
    """The standard error of error_pct, in points: the two sets' prompts are disjoint, so their errors add in
    quadrature (delta method on predicted / measured)."""
    return 100 * math.hypot(predicted_se / measured, predicted * measured_se / measured ** 2)


def met(error: float, se: float) -> str:
    """Whether |error| < BAR_PCT, and how many standard errors the margin to the bar is."""
    margin = (BAR_PCT - abs(error)) / se if se > 0 else math.inf
    return f"{'yes' if abs(error) < BAR_PCT else 'no'} ({margin:+.1f} SE)"


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


def run_windows(speculation: Speculation, text: Sequence[int], windows: list[int], k: int | None, k_cal: int,
                tokens: int, seed: int) -> list[PromptRounds]:
    """Each window continued at K, or (None) with K drawn from 1..K_cal afresh each round."""
    runs = []
    for w in windows:
        key = seed * SEED_STRIDE + w
        draws = random.Random(key * K_DRAWS + 1)
        ks = [draws.randint(1, k_cal) for _ in range(tokens + 1)]  # a round adds >= 1 token: enough rounds
        runs.append(PromptRounds(w, k or 0, speculation.continue_prompt(
            list(text[w * PROMPT_TOKENS:(w + 1) * PROMPT_TOKENS]), k or (lambda r, ks=ks: ks[r]), tokens,
            PositionRandom(key))))
    return runs


def position_rows(counts: PositionalAcceptance, by_start: positional.StartAcceptance,
                  alpha_hat: float) -> tuple[PositionRow, ...]:
    """The calibration vector, position by position, with the vectors after a residual and after the target's token."""
    after_residual, after_target = by_start.pooled(False), by_start.pooled(True)
    split = lambda counts, i: counts.vector[i] if i < len(counts.vector) else None  # noqa: E731
    reached = lambda counts, i: counts.reached[i] if i < len(counts.reached) else 0  # noqa: E731
    return tuple(PositionRow(i, counts.reached[i], a, se, s, alpha_hat ** (i + 1), split(after_residual, i),
                             reached(after_residual, i), split(after_target, i), reached(after_target, i))
                 for i, (a, se, s) in enumerate(zip(counts.vector, counts.standard_errors, counts.survival)))


def measure(scenario: Scenario, draft: str, alpha: float, k_cal: int, prompts: int | None, tokens: int, seed: int,
            log, cap: int = CAP) -> AcceptanceResult:
    with one_thread():
        return _measure(scenario, draft, alpha, k_cal, prompts, tokens, seed, log, cap)


def _measure(scenario: Scenario, draft: str, alpha: float, k_cal: int, prompts: int | None, tokens: int, seed: int,
             log, cap: int) -> AcceptanceResult:
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

    def run_set(windows: list[int], k: int | None) -> list[PromptRounds]:
        return run_windows(speculation, text, windows, k, k_cal, tokens, seed)

    log(f"calibrating with K drawn from 1..{k_cal} each round on {len(calibration)} prompts ({draft} draft)")
    calibrated = run_set(calibration, None)
    counts, by_start = counts_of(calibrated), conditional(calibrated, cap)
    vector, alpha_hat = counts.vector, alpha_hat_of(calibrated)
    if len(vector) < k_cal:
        raise ConfigError(f"no calibration round reached draft position {len(vector)}: more prompts or --tokens",
                          key="--prompts")

    def row(k: int, runs: list[PromptRounds]) -> AcceptanceRow:
        measured, measured_se = measured_gamma(runs), positional.jackknife_se(runs, measured_gamma)
        models = (lambda kept: conditional(kept, cap).gamma(k),
                  lambda kept: positional.predict_gamma(counts_of(kept).vector, k),
                  lambda kept: physics.gamma(min(alpha_hat_of(kept), 1.0), k))
        cells = []
        for model in models:
            gamma, se = model(calibrated), positional.jackknife_se(calibrated, model)
            cells += [gamma, se, error_pct(gamma, measured), error_se(gamma, se, measured, measured_se)]
        return AcceptanceRow(k, sum(len(r.rounds) for r in runs), measured, measured_se, *cells)

    rows, measured_by_k = [], {}
    for k in range(1, k_cal + 1):
        rows.append(row(k, run_set(held_out, k)))
        r = rows[-1]
        measured_by_k[k] = r.measured_gamma
        log(f"held out, K = {k}: Gamma {r.measured_gamma:.3f} measured, {r.conditional_gamma:.3f} conditional, "
            f"{r.positional_gamma:.3f} per position, {r.iid_gamma:.3f} iid")
    draft_s, compute_s, t_ring_s = timings(scenario, speculation)
    positions = position_rows(counts, by_start, alpha_hat)
    return AcceptanceResult(
        scenario.name, draft, alpha if draft == "calibrated" else None, scenario.decode.temperature, scenario.model,
        k_cal, cap, len(calibration), PROMPT_TOKENS, tokens, seed, tuple(calibration), tuple(held_out),
        sum(len(r.rounds) for r in calibrated), alpha_hat, counts.reached, counts.accepted, positions, tuple(rows),
        draft_s * 1e3, compute_s * 1e3, t_ring_s * 1e3,
        *by_start.best_k(draft_s, compute_s, t_ring_s, k_cal),
        *k_stars(vector, alpha_hat, measured_by_k, draft_s, compute_s, t_ring_s), time.perf_counter() - started)


def tables(result: AcceptanceResult) -> list[Table]:
    draft = result.draft + (f" (alpha {result.alpha:g})" if result.alpha is not None else "")
    gamma = Table(title=f"{result.scenario}: tokens a round, {draft} draft, temperature {result.temperature:g}: "
                        f"measured on {result.prompts} held-out prompts ({result.tokens} tokens each) vs predicted "
                        f"from {result.prompts} calibration prompts, K drawn from 1..{result.k_cal} each round "
                        f"({result.calibration_rounds} rounds, alpha-hat {result.alpha_hat:.3f}); errors ± SE in "
                        f"points")
    for col in ("K", "rounds", "measured Γ ± SE", "conditional Γ", "err % ± SE", f"|err| < {BAR_PCT:g}%",
                "per-position Γ", "err % ± SE", "iid Γ(α̂, K)", "err % ± SE"):
        gamma.add_column(col, justify="right")
    for r in result.acceptance_rows:
        gamma.add_row(str(r.k), str(r.rounds), f"{r.measured_gamma:.3f} ± {r.measured_se:.3f}",
                      f"{r.conditional_gamma:.3f}", f"{r.conditional_error_pct:+.2f} ± {r.conditional_error_se:.2f}",
                      met(r.conditional_error_pct, r.conditional_error_se), f"{r.positional_gamma:.3f}",
                      f"{r.positional_error_pct:+.2f} ± {r.positional_error_se:.2f}", f"{r.iid_gamma:.3f}",
                      f"{r.iid_error_pct:+.2f} ± {r.iid_error_se:.2f}")
    gamma.caption = (f"conditional: start states capped at {result.cap} accepted. K* over 1..{result.k_cal} with "
                     f"c_d {result.draft_ms:g} ms, C {result.compute_ms:g} ms, T_ring {result.t_ring_ms:g} ms: "
                     f"conditional {result.k_star_conditional} ({result.k_star_conditional_tok_s:.2f} tok/s), "
                     f"per-position {result.k_star_positional} ({result.k_star_positional_tok_s:.2f} tok/s), iid "
                     f"{result.k_star_iid} ({result.k_star_iid_tok_s:.2f} tok/s), measured {result.k_star_measured} "
                     f"({result.k_star_measured_tok_s:.2f} tok/s); wall time {result.wall_s:.1f} s")
    vector = Table(title="The positional acceptance vector (calibration rounds)")
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
    if args.cap < 0:
        raise ConfigError(f"expected a cap >= 0, got {args.cap}", key="--cap")
    if args.prompts != "all" and not str(args.prompts).isdigit():
        raise ConfigError(f"expected a count or 'all', got {args.prompts!r}", key="--prompts")


def run(args: argparse.Namespace, console: Console) -> AcceptanceResult:
    check_options(args)
    scenario = make_scenario(args.scenario, overrides=list(args.overrides))
    ensure_models_on(console)
    alpha = scenario.decode.alpha if args.alpha is None else args.alpha
    prompts = None if args.prompts == "all" else int(args.prompts)
    return measure(scenario, args.draft, alpha, args.k_cal, prompts, args.tokens, args.seed, log_to(console),
                   args.cap)


def show(result: AcceptanceResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, tables(result))
    write_json(results_path(args, f"acceptance-{result.draft}", args.scenario), result.to_json(indent=2), console)
