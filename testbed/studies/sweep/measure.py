"""python -m testbed sweep: speculative K sweeps, measured vs predicted per K, and K* (a rendering of Table 3).

Each acceptance rate is one run: the entry node plays `--rounds` rounds at every K, each K starting from
the same prompt with the same per-position random draws, so the K-dependence is compared, not luck.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import trio
from rich.console import Console
from rich.table import Table

from testbed.scenario.config import Scenario, parse_k_range
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary
from testbed.studies.base import dilation_cell, dilation_of, ensure_models_on, make_scenario, plan_runs, write_json

TABLE3_KS = (4, 8, 16)


def sweep_scenario(name_or_path: str | Scenario, ks: list[int], *, alpha: float | None = None, rounds: int = 30,
                   overrides: list[str] | None = None, **keys: Any) -> Scenario:
    """The scenario of one K sweep: speculative, every K for `rounds` rounds, calibrated at `alpha` if given."""
    items = list(overrides or []) + ["decode.mode=speculative", f"decode.k_sweep={list(ks)}",
                                     f"decode.rounds_per_k={rounds}", f"decode.k_max={max(ks)}"]
    if alpha is not None:
        items += ["decode.draft=calibrated", f"decode.alpha={alpha}"]
    return make_scenario(name_or_path, overrides=items, **keys)


def run_sweep(args: argparse.Namespace, ks: list[int], alpha: float | None, console: Console) -> RunSummary:
    from testbed.launch.launcher import run_scenario

    scenario = sweep_scenario(args.scenario, ks, alpha=alpha, rounds=args.rounds,
                              overrides=list(args.overrides) + ([f"decode.tokens={args.tokens}"] if args.tokens else []))
    label = f"alpha={alpha}" if alpha is not None else f"draft={scenario.decode.draft}"
    console.print(f"sweep {scenario.name} ({label}): K = {ks[0]}..{ks[-1]}, {args.rounds} rounds each, "
                  f"T_ring {scenario.t_ring_s * 1e3:.1f} ms, C {scenario.emulated_compute_s * 1e3:.1f} ms emulated, "
                  f"c_d {scenario.decode.draft_ms:.2f} ms")
    return trio.run(lambda: run_scenario(scenario, args.shaper, log=lambda m: None, dilation=args.dilation,
                                         compensate=args.compensate))


def per_k_table(summary: RunSummary) -> Table:
    spec = summary.spec
    table = Table(title=f"{summary.scenario}: alpha_hat = {spec.alpha:.3f} ({spec.draft} draft), "
                        f"c_d = {spec.draft_per_token_s * 1e3:.2f} ms, C = {spec.verify_compute_s * 1e3:.2f} ms, "
                        f"T_ring = {summary.t_ring_s * 1e3:.1f} ms, D = {sweep_dilation(summary)}")
    for col in ("K", "rounds", "Gamma meas", "Gamma(a,K)", "tok/s meas", "tok/s pred", "err %", "formula tok/s"):
        table.add_column(col, justify="right")
    for row in spec.per_k or ():
        err = (row.measured_tok_s / row.predicted_tok_s - 1) * 100
        table.add_row(str(row.k), str(row.rounds), f"{row.gamma_measured:.2f}", f"{row.gamma_predicted:.2f}",
                      f"{row.measured_tok_s:.2f}", f"{row.predicted_tok_s:.2f}", f"{err:+.2f}",
                      f"{row.formula_tok_s:.2f}")
    table.caption = (f"K* measured = {spec.k_star_measured}, K* predicted = {spec.k_star_predicted} "
                     f"(tok/s pred = Gamma_measured / (K c_d + C + T_ring); formula = Gamma(alpha_hat, K) / (...))")
    return table


def sweep_dilation(summary: RunSummary) -> str:
    """The D a sweep ran at (every K of it: one run), and where the budget capped it the error it leaves."""
    d = dilation_of(summary)
    return dilation_cell(d["dilation"], d["capped_error_pct"])


def table3(results: list[tuple[float, RunSummary]], scale: float) -> Table:
    table = Table(title=f"Seed 000 Table 3, measured (time scale {scale}): measured / predicted")
    table.add_column("alpha", justify="right")
    for k in TABLE3_KS:
        table.add_column(f"K={k} Gamma", justify="right")
        table.add_column(f"K={k} tok/s", justify="right")
    table.add_column("best tok/s (K*)", justify="right")
    table.add_column("D", justify="right")
    for alpha, summary in results:
        spec = summary.spec
        rows = {row.k: row for row in spec.per_k or ()}
        cells = []
        for k in TABLE3_KS:
            row = rows.get(k)
            cells += ([f"{row.gamma_measured:.2f} / {row.gamma_predicted:.2f}",
                       f"{row.measured_tok_s:.1f} / {row.formula_tok_s:.1f}"] if row else ["-", "-"])
        best_meas = rows[spec.k_star_measured].measured_tok_s
        best_pred = rows[spec.k_star_predicted].formula_tok_s
        cells.append(f"{best_meas:.1f} (K={spec.k_star_measured}) / {best_pred:.1f} (K={spec.k_star_predicted})")
        table.add_row(f"{alpha:.2f}", *cells, sweep_dilation(summary))
    return table


def run(args: argparse.Namespace, console: Console) -> list[tuple[float | None, RunSummary]]:
    """One sweep per --alpha (or one with the scenario's draft): (alpha, its summary) each."""
    ks = parse_k_range(args.k)
    if args.rounds < 1:
        raise ConfigError(f"expected --rounds >= 1, got {args.rounds}", key="--rounds")
    alphas: list[float | None] = [None]
    if args.alpha:
        try:
            alphas = [float(a) for a in args.alpha.split(",")]
        except ValueError:
            raise ConfigError(f"expected alphas like 0.6,0.7,0.8,0.9, got {args.alpha!r}", key="--alpha") from None
        if not all(0 < a < 1 for a in alphas):
            raise ConfigError(f"alphas must be in (0, 1), got {args.alpha!r}", key="--alpha")
    ensure_models_on(console)
    plan_runs(len(alphas))
    return [(alpha, run_sweep(args, ks, alpha, console)) for alpha in alphas]


def show(results: list[tuple[float | None, RunSummary]], args: argparse.Namespace, console: Console) -> None:
    ks = parse_k_range(args.k)
    for _alpha, summary in results:
        console.print(per_k_table(summary))
    if args.alpha and all(k in ks for k in TABLE3_KS):
        console.print(table3(results, make_scenario(args.scenario, overrides=args.overrides).scale))
    if args.json:
        write_json(args.json, json.dumps([s.to_dict() for _, s in results], indent=2), console)
