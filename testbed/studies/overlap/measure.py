"""python -m testbed overlap: overlapped speculation against synchronous speculation and plain decode, by T_ring.

Four rings, each a shipped scenario's stages and hops: a single box (table2-single-node, three stages, zero delays),
metro (table2-metro, 3 x 0.7 ms), regional (table2-regional, 3 x 7 ms) and geo (geo-ring, 130 + 40 + 110 ms); C is
3 x 11 ms on each, as those scenarios say. Every ring decodes the same prompt (DecodeConfig's default; the geo ring's
own prompt and min_rounds are set aside) with the same draft, K, c_d, temperature and seed, so every ring runs the
same tokens in the same rounds: Gamma and h are the same on each, and the rates differ by T_ring alone.

Per ring, three ways measured next to their closed forms:
- plain decode (`decode.mode = "plain"`): one token a lap, 1 / (C + T_ring);
- synchronous speculation (`"speculative"`): r_spec = Gamma / (K c_d + C + T_ring) with the measured Gamma;
- overlapped speculation (`"overlap"`) at each window W: physics.overlap_run_s over the run's realized runs (exact
  on virtual time), physics.overlap_rate with the measured Gamma and h (the i.i.d. form), and physics.overlap_bound
  (the same as W grows without end).
Plain and synchronous runs do not depend on W: each is run once a ring and repeated in its rows. The gain is
overlap over synchronous speculation: measured (the two runs' measured rates) and predicted (the i.i.d. form over
r_spec).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Final

import trio
from rich.console import Console
from rich.table import Table

from agents.modes.overlap.settings import MAX_WINDOW
from agents.modes.speculative.settings import K_MAX_BOUND
from testbed.core.decode import DecodeConfig
from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.core.summary import RunSummary
from testbed.scenario.decode import MAX_TOKENS
from testbed.scenario.validate import listed
from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, log_to, make_scenario, plan_runs,
                                  print_tables, write_json)

# (name, the shipped scenario whose stages and hops the ring takes), shortest ring first
RINGS: Final = (("single", "table2-single-node"), ("metro", "table2-metro"), ("regional", "table2-regional"),
                ("geo", "geo-ring"))
LABELS: Final = {"single": "single box"}  # a ring's name in the tables where its option name is short
TOKENS = 160  # a run: ~40 rounds of K 5 at alpha 0.8
K = 5
ALPHA = 0.8
DRAFT_MS = 5.0
TEMPERATURE = 0.7
WINDOWS = (4,)
JSON_PATH = "results/overlap.json"


@dataclass(frozen=True)
class OverlapRow(JsonRecord):
    """One ring at one window: plain, synchronous and overlapped speculation, each measured beside its forms."""

    ring: str
    scenario: str  # the shipped scenario whose stages and hops the ring is
    t_ring_ms: float
    compute_ms: float  # C, the overlap run's verify compute (entry and head included)
    window: int
    plain_tok_s: float
    plain_predicted_tok_s: float  # 1 / (C + T_ring)
    sync_tok_s: float
    sync_predicted_tok_s: float  # Gamma / (K c_d + C + T_ring), the synchronous run's Gamma
    overlap_tok_s: float
    overlap_predicted_tok_s: float  # tokens / sum over the realized runs of physics.overlap_run_s
    overlap_expected_tok_s: float  # physics.overlap_rate(Gamma, h): the i.i.d. form
    overlap_bound_tok_s: float  # physics.overlap_bound: the i.i.d. form as W grows without end
    error_pct: float  # overlap measured against its realized form
    gamma: float  # tokens per verified round (the same tokens in both modes)
    hit_rate: float  # h: all K accepted and the guess right
    all_accepted_rate: float
    guess_rate: float | None  # of the rounds that accepted all K, the share whose guess was right
    rounds: int
    runs: int
    discarded: int  # rounds sent and dropped after a miss
    queue_free: bool  # the realized form holds: every stage's work for a round fits in (K + 1) c_d
    gain_measured: float  # overlap measured / synchronous measured
    gain_predicted: float  # overlap_rate / r_spec
    gain_bound: float  # overlap_bound / r_spec: the most a wider window can give
    dilation: float = 1.0  # the overlap run's
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class OverlapResult(JsonRecord):
    shaper: str
    k: int
    alpha: float
    draft_ms: float
    temperature: float
    tokens: int
    windows: tuple[int, ...]
    overlap_rows: tuple[OverlapRow, ...]


@dataclass(frozen=True)
class Options:
    """The study's options, checked: which rings, which windows, and the draft every run shares."""

    rings: tuple[tuple[str, str], ...]
    windows: tuple[int, ...]
    k: int
    alpha: float
    draft_ms: float
    temperature: float
    tokens: int


def options_of(args: argparse.Namespace) -> Options:
    """The command's options checked; a bad one is a ConfigError naming it and what it expects."""
    names = dict(RINGS)
    rings = listed(args.rings, "--rings", f"ring names from {', '.join(names)}", str, lambda r: r in names)
    windows = listed(str(args.window), "--window", f"windows like 1,4,16 within [1, {MAX_WINDOW}]", int,
                     lambda w: 1 <= w <= MAX_WINDOW)
    checks = (("--k", args.k, 1, K_MAX_BOUND, "an integer"), ("--tokens", args.tokens, 1, MAX_TOKENS, "an integer"),
              ("--alpha", args.alpha, 0.0, 1.0, "a number"), ("--draft-ms", args.draft_ms, 0.0, 60_000.0, "a number"),
              ("--temperature", args.temperature, 0.0, 100.0, "a number"))
    for key, value, low, high, kind in checks:
        if not low <= value <= high:
            raise ConfigError(f"expected {kind} in [{low:g}, {high:g}], got {value:g}", key=key)
    return Options(tuple((r, names[r]) for r in dict.fromkeys(rings)), tuple(dict.fromkeys(windows)), args.k,
                   args.alpha, args.draft_ms, args.temperature, args.tokens)


def decode_overrides(opts: Options) -> list[str]:
    """The [decode] every run shares: the calibrated draft, K, c_d, temperature, the same prompt on every ring."""
    return [f"decode.tokens={opts.tokens}", f"decode.k={opts.k}", 'decode.draft="calibrated"',
            f"decode.alpha={opts.alpha!r}", f"decode.draft_ms={opts.draft_ms!r}",
            f"decode.temperature={opts.temperature!r}", f"decode.prompt={json.dumps(DecodeConfig.prompt)}",
            "decode.min_rounds=0"]


async def measure(args: argparse.Namespace, opts: Options, log) -> OverlapResult:
    from testbed.launch.launcher import run_scenario

    shared = decode_overrides(opts)

    async def run(ring: str, scenario: str, mode: str, extra: tuple[str, ...] = ()) -> RunSummary:
        sc = make_scenario(scenario, overrides=shared + [f"decode.mode={mode}", *extra])
        log(f"{ring} ({scenario}, T_ring {sc.t_ring_s * 1e3:g} ms): {mode}" + (f", {', '.join(extra)}" if extra
                                                                               else "") + "...")
        return await run_scenario(sc, args.shaper, log=lambda m: None, dilation=args.dilation)

    plan_runs(len(opts.rings) * (2 + len(opts.windows)))
    rows, shaper = [], "?"
    for ring, scenario in opts.rings:
        plain = await run(ring, scenario, "plain")
        sync_run = await run(ring, scenario, "speculative")
        sync = sync_run.spec
        if sync is None:
            raise ConfigError("a synchronous run verified no round: raise --tokens", key="--tokens")
        for window in opts.windows:
            whole = await run(ring, scenario, "overlap", (f"decode.window={window}",))
            o = whole.overlap
            if o is None:
                raise ConfigError("an overlapped run verified no round: raise --tokens", key="--tokens")
            shaper = whole.shaper
            row = OverlapRow(
                ring, scenario, whole.t_ring_s * 1e3, o.verify_compute_s * 1e3, window, plain.measured_tok_s,
                plain.predicted_tok_s, sync.measured_tok_s, sync.predicted_tok_s, o.measured_tok_s, o.predicted_tok_s,
                o.expected_tok_s, o.bound_tok_s, o.error_pct, o.gamma_measured, o.hit_rate, o.all_accepted_rate,
                o.guess_rate, o.rounds, o.runs, o.discarded, o.queue_free, o.measured_tok_s / sync.measured_tok_s,
                o.expected_tok_s / sync.predicted_tok_s, o.bound_tok_s / sync.predicted_tok_s, **dilation_of(whole))
            log(f"      plain {row.plain_tok_s:.2f}, sync {row.sync_tok_s:.2f}, overlap W {window} "
                f"{row.overlap_tok_s:.2f} tok/s (pred {row.overlap_predicted_tok_s:.2f}, {row.error_pct:+.2f}%), "
                f"h {row.hit_rate:.2f}, gain {row.gain_measured:.2f}x")
            rows.append(row)
    return OverlapResult(shaper, opts.k, opts.alpha, opts.draft_ms, opts.temperature, opts.tokens, opts.windows,
                         tuple(rows))


def label(ring: str) -> str:
    return LABELS.get(ring, ring)


def caption(result: OverlapResult) -> str:
    """Where overlap cannot help: h small, and the bound as W grows (physics.overlap_bound)."""
    rows = result.overlap_rows
    h = [r.hit_rate for r in rows]
    longest = max(rows, key=lambda r: (r.t_ring_ms, r.window))
    spread = f"{min(h):.2f}" if max(h) - min(h) < 0.005 else f"{min(h):.2f}-{max(h):.2f}"
    ceiling = f"{1 / (1 - max(h)):.2f}x" if max(h) < 1 else "without end"
    lines = [f"h = P(all K accepted and the guess right) = {spread}. Overlap cannot help where h is small (a weak "
             "draft, a long K): h = 0 is synchronous speculation. As W grows it tends to physics.overlap_bound, "
             "Gamma / ((1 - h)(K c_d + C + T_ring) + h (K + 1) c_d): every miss still costs a whole synchronous "
             f"round, so the gain stays below 1 / (1 - h) = {ceiling} (on the {label(longest.ring)} ring, T_ring "
             f"{longest.t_ring_ms:g} ms: at most {longest.gain_bound:.2f}x, W {longest.window} gives "
             f"{longest.gain_predicted:.2f}x). Overlap gains more the longer the ring: a hit saves a whole lap."]
    if not all(r.queue_free for r in rows):
        lines.append("Not queue-free on " + ", ".join(f"{r.ring} W {r.window}" for r in rows if not r.queue_free)
                     + ": a stage's work for a round exceeds (K + 1) c_d, and the realized form does not hold.")
    return "\n".join(lines)


def table(result: OverlapResult) -> Table:
    out = Table(title=f"Overlapped speculation vs synchronous speculation and plain decode by T_ring: K {result.k}, "
                      f"calibrated draft alpha {result.alpha:g}, c_d {result.draft_ms:g} ms, temperature "
                      f"{result.temperature:g}, {result.tokens} tokens ({result.shaper}); tok/s measured / predicted")
    for col in ("ring", "T_ring ms", "C ms", "plain", "sync", "W", "overlap meas / runs / i.i.d.", "bound", "h",
                "gain meas", "gain pred", "D"):
        out.add_column(col, justify="right")
    for r in result.overlap_rows:
        out.add_row(label(r.ring), f"{r.t_ring_ms:g}", f"{r.compute_ms:.1f}",
                    f"{r.plain_tok_s:.2f} / {r.plain_predicted_tok_s:.2f}",
                    f"{r.sync_tok_s:.2f} / {r.sync_predicted_tok_s:.2f}", str(r.window),
                    f"{r.overlap_tok_s:.2f} / {r.overlap_predicted_tok_s:.2f} / {r.overlap_expected_tok_s:.2f}",
                    f"{r.overlap_bound_tok_s:.2f}", f"{r.hit_rate:.2f}", f"{r.gain_measured:.2f}x",
                    f"{r.gain_predicted:.2f}x", dilation_cell(r.dilation, r.capped_error_pct))
    out.caption = caption(result)
    return out


def run(args: argparse.Namespace, console: Console) -> OverlapResult:
    opts = options_of(args)
    ensure_models_on(console)
    return trio.run(measure, args, opts, log_to(console))


def show(result: OverlapResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result)])
    write_json(args.json or JSON_PATH, result.to_json(indent=2), console)
