"""python -m testbed sweep SCENARIO --tree-n 1,4,16,64,256: tree speculation's L(n) and T_lap(n) (seed 001).

One run per (codec, link rate, n): the tree mode drafts n nodes a round and the ring verifies them in one lap.
Per n the table holds tokens per lap L(n), the lap, the bytes per hop, and tok/s measured next to
physics.tree_rate with the measured L(n) and compute, the configured links and rates. Per (codec, rate): the
least-squares fit L(n) = a + b ln n; the measured best n; the predicted best n (the grid's argmax of the
prediction); and W*, the width where a lap's serialization, sum_i n s_h / BW_i, equals its latency T_ring:
predicted from the per-node bytes, measured where the lap's ring time passes 2 T_ring (interpolated in n).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, log_to, make_scenario, plan_runs,
                                  print_tables, results_path, write_json)
from agents.modes.tree.settings import MAX_TREE
from testbed.core.decode import CODECS
from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.scenario.validate import listed

TOKENS = 48  # per run
TREE_K = 8  # candidates per node and nodes per best-first draft step
RATES_MBIT = (0.0, 10.0)  # 0 = unlimited


@dataclass(frozen=True)
class TreeRow(JsonRecord):
    codec: str
    rate_mbit: float
    n: float
    rounds: int
    tokens_per_round: float
    lap_ms: float
    draft_ms: float
    compute_ms: float
    ring_ms: float
    serialization_ms: float
    bytes_per_hop: float
    measured_tok_s: float
    predicted_tok_s: float
    error_pct: float
    dilation: float = 1.0
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class TreeFit(JsonRecord):
    codec: str
    rate_mbit: float
    a: float  # L(n) ~ a + b ln n
    b: float
    best_n_measured: float
    best_n_predicted: float
    w_star_predicted: float | None  # None at unlimited rate
    w_star_measured: float | None  # None where the ring time never passed 2 T_ring on the grid


@dataclass(frozen=True)
class TreeSweep(JsonRecord):
    scenario: str
    shaper: str
    t_ring_s: float
    policy: str
    tree_rows: tuple[TreeRow, ...]
    fits: tuple[TreeFit, ...]


def fit(rows: list[TreeRow], t_ring_s: float, hop_rates_bytes_s: list[float]) -> TreeFit:
    ns = np.array([r.n for r in rows])
    a, b = (float(np.mean([r.tokens_per_round for r in rows])), 0.0) if len(rows) < 2 else \
        tuple(float(v) for v in np.polyfit(np.log(ns), [r.tokens_per_round for r in rows], 1)[::-1])
    best_measured = max(rows, key=lambda r: r.measured_tok_s).n
    best_predicted = max(rows, key=lambda r: r.predicted_tok_s).n
    w_pred = w_meas = None
    limited = [bw for bw in hop_rates_bytes_s if not math.isinf(bw)]
    if limited:
        widest = max(rows, key=lambda r: r.n)
        per_node = widest.bytes_per_hop / (widest.n + 1)  # bytes one more node adds on a hop
        w_pred = t_ring_s / sum(per_node / bw for bw in limited)
        over = [(r.n, r.ring_ms / 1e3 - t_ring_s) for r in sorted(rows, key=lambda r: r.n)]  # serialization, measured
        for (n0, s0), (n1, s1) in zip(over, over[1:]):
            if s0 < t_ring_s <= s1:
                frac = (t_ring_s - s0) / (s1 - s0)
                w_meas = n0 + frac * (n1 - n0)  # serialization grows linearly in n
                break
    return TreeFit(rows[0].codec, rows[0].rate_mbit, a, b, best_measured, best_predicted, w_pred, w_meas)


async def measure(args: argparse.Namespace, ns: list[int], rates: list[float], codecs: list[str], log) -> TreeSweep:
    from testbed.launch.launcher import run_scenario
    from agents.modes.tree.summary import hop_rates_bytes_s

    common = list(args.overrides) + ["decode.mode=tree", f"decode.tokens={args.tokens or TOKENS}",
                                   f"decode.tree_k={args.tree_k}"]
    rows, fits, shaper, t_ring, policy = [], [], "?", 0.0, "?"
    plan_runs(len(codecs) * len(rates) * len(ns))
    for codec in codecs:
        for rate in rates:
            group = []
            for n in ns:
                sc = make_scenario(args.scenario, overrides=common + [f"decode.tree_n={n}", f"network.rate_mbit={rate}",
                                                                   f'wire.codec="{codec}"'])
                log(f"{codec}, {rate:g} Mbit/s, n = {n}...")
                summary = await run_scenario(sc, args.shaper, log=lambda m: None, dilation=args.dilation,
                                             compensate=args.compensate)
                t = summary.tree
                if t is None:
                    raise ConfigError("a run decoded no tree round: raise --tokens", key="--tokens")
                shaper, t_ring, policy = summary.shaper, sc.t_ring_s, t.policy
                row = TreeRow(codec, rate, t.n, t.rounds, t.tokens_per_round, t.lap_ms, t.draft_ms, t.compute_ms,
                              t.ring_ms, t.serialization_ms, t.bytes_per_hop, t.measured_tok_s, t.predicted_tok_s,
                              t.error_pct, **dilation_of(summary))
                log(f"      L {row.tokens_per_round:.2f}, lap {row.lap_ms:.1f} ms, {row.bytes_per_hop:.0f} B/hop, "
                    f"{row.measured_tok_s:.2f} tok/s (pred {row.predicted_tok_s:.2f}, {row.error_pct:+.2f}%)")
                group.append(row)
            rows += group
            fits.append(fit(group, t_ring, hop_rates_bytes_s(sc)))
    return TreeSweep(args.scenario, shaper, t_ring, policy, tuple(rows), tuple(fits))


def table(result: TreeSweep) -> Table:
    out = Table(title=f"Tree speculation on {result.scenario} ({result.policy}, T_ring {result.t_ring_s * 1e3:.1f} ms, "
                      f"{result.shaper}): L(n) and tok/s, measured vs physics.tree_rate")
    for col in ("codec", "Mbit/s", "n", "L(n)", "lap ms", "draft ms", "ring ms", "ser. ms", "B/hop",
                "tok/s meas", "tok/s pred", "err %", "D"):
        out.add_column(col, justify="right")
    for r in result.tree_rows:
        out.add_row(r.codec, f"{r.rate_mbit:g}" if r.rate_mbit else "inf", f"{r.n:g}", f"{r.tokens_per_round:.2f}",
                    f"{r.lap_ms:.1f}", f"{r.draft_ms:.1f}", f"{r.ring_ms:.1f}", f"{r.serialization_ms:.1f}",
                    f"{r.bytes_per_hop:.0f}", f"{r.measured_tok_s:.2f}", f"{r.predicted_tok_s:.2f}",
                    f"{r.error_pct:+.2f}", dilation_cell(r.dilation, r.capped_error_pct))
    notes = []
    for f in result.fits:
        w = (f"; W* predicted {f.w_star_predicted:.0f}, measured "
             + (f"{f.w_star_measured:.0f}" if f.w_star_measured else "beyond the grid")) if f.w_star_predicted else ""
        notes.append(f"{f.codec} at {f.rate_mbit:g} Mbit/s: L(n) = {f.a:.2f} + {f.b:.2f} ln n; best n measured "
                     f"{f.best_n_measured:g}, predicted {f.best_n_predicted:g}{w}")
    out.caption = "\n".join(notes)
    return out


def run(args: argparse.Namespace, console: Console) -> TreeSweep:
    ns = listed(args.tree_n, "--tree-n", f"node counts like 1,4,16,64,256 within [1, {MAX_TREE}]", int,
                lambda n: 1 <= n <= MAX_TREE)
    rates = listed(args.rates, "--rates", "link rates in Mbit/s like 0,10 (0 = unlimited)", float,
                   lambda r: 0 <= r <= 100_000)
    codecs = listed(args.codecs, "--codecs", f"codecs from {', '.join(CODECS)}", str, lambda c: c in CODECS)
    ensure_models_on(console)
    return trio.run(measure, args, ns, rates, codecs, log_to(console))


def show(result: TreeSweep, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result)])
    write_json(results_path(args, "tree", result.scenario), result.to_json(indent=2), console)
