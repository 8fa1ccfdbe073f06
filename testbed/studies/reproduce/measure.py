"""python -m testbed reproduce: the published deployments of ../shared/PUBLISHED.md, each as a ring built from what
its source states (testbed.studies.reproduce.rows), published vs the testbed's prediction vs its measurement."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import trio
from rich.console import Console
from rich.table import Table

from testbed.scenario.config import Scenario, scenario_from_dict
from testbed.core.records import JsonRecord
from testbed.studies.base import ensure_models_on, log_to, plan_runs, print_tables, write_json
from testbed.studies.reproduce.rows import NOT_EXPRESSED, ROWS, PublishedRow
from testbed.studies.whatif import predict

TOKENS = 12  # decode tokens a measured row runs (the rate is the wall's: a few laps measure it)
LARGE_GAP_PCT = 10.0  # a row further apart than this prints what the source's system does that the physics leaves out


@dataclass(frozen=True)
class ReproducedRow(JsonRecord):
    number: int
    system: str
    setup: str
    source: str
    published_tok_s: float
    published_range: tuple[float, float]
    compute_ms: float  # C, per token, from the calibrating rate
    hop_ms: float  # one-way, per hop
    predicted_tok_s: float
    measured_tok_s: float | None
    assumed: str
    why_apart: str  # empty unless the row is more than LARGE_GAP_PCT apart

    @property
    def gap_pct(self) -> float:
        return (self.predicted_tok_s / self.published_tok_s - 1) * 100


@dataclass(frozen=True)
class ReproduceResult(JsonRecord):
    shaper: str
    reproduced_rows: tuple[ReproducedRow, ...]
    not_expressed: tuple[tuple[int, str, str], ...]


def compute_s(row: PublishedRow) -> float:
    """C from the calibrating rate: 1 / rate - its ring's hops at their one-way latency."""
    return 1.0 / row.compute_tok_s - row.compute_hops * row.compute_rtt_ms / 2 / 1e3


def scenario(row: PublishedRow, tokens: int) -> Scenario:
    """The row as a ring: `nodes` stages sharing C, hops at RTT / 2, the stated rate and hidden state."""
    c_ms = compute_s(row) * 1e3
    raw = {"name": f"published-{row.number}", "description": f"{row.system}: {row.setup} ({row.source})",
           "stages": [{"name": f"node{i}", "compute_ms": c_ms / row.nodes} for i in range(row.nodes)],
           "network": {"hops_ms": [row.rtt_ms / 2] * row.nodes if row.nodes > 1 else [],
                       "rate_mbit": row.rate_mbit},
           "decode": {"tokens": tokens, "temperature": 0.0}}
    if row.d_model:  # the source names the model: its hidden state (f32, as llama.cpp ships activations) crosses
        raw["geometry"] = {"d_model": row.d_model, "layers": 22, "heads": 32, "params_b": 1.1, "dtype": "f32",
                           "vocab": 32000}
    return scenario_from_dict(raw, f"PUBLISHED.md row {row.number}")


def reproduce(row: PublishedRow, args: argparse.Namespace) -> ReproducedRow:
    sc = scenario(row, args.tokens)
    predicted = predict.decode_tok_s(sc, 0, 1)  # no [[stages]] hardware: the compute is flat in the context
    measured = None
    if args.measure:
        from testbed.launch.launcher import run_scenario

        summary = trio.run(lambda: run_scenario(sc, args.shaper, log=lambda m: None, dilation=args.dilation))
        measured = summary.measured_tok_s
    gap = abs(predicted / row.published_tok_s - 1) * 100
    within = row.published_range != (0.0, 0.0) and row.published_range[0] <= predicted <= row.published_range[1]
    return ReproducedRow(row.number, row.system, row.setup, row.source, row.published_tok_s, row.published_range,
                         compute_s(row) * 1e3, row.rtt_ms / 2, predicted, measured, row.assumed,
                         row.why_apart if gap > LARGE_GAP_PCT and not within else "")


def run(args: argparse.Namespace, console: Console) -> ReproduceResult:
    if args.measure:
        ensure_models_on(console)
    log = log_to(console)
    rows = []
    plan_runs(len(ROWS))
    for row in ROWS:
        log(f"row {row.number}: {row.system}, {row.setup}")
        rows.append(reproduce(row, args))
    return ReproduceResult(args.shaper if args.measure else "", tuple(rows), NOT_EXPRESSED)


def table(result: ReproduceResult) -> Table:
    out = Table(title="Published deployments (../shared/PUBLISHED.md): published vs the testbed's prediction"
                      + (f" vs its measurement ({result.shaper})" if result.shaper else ""))
    for col in ("#", "system", "setup", "published tok/s", "C ms", "hop ms", "predicted", "gap %", "measured",
                "source"):
        out.add_column(col, justify="right" if col not in ("system", "setup", "source") else "left")
    for r in result.reproduced_rows:
        published = (f"{r.published_range[0]:g}-{r.published_range[1]:g}" if r.published_range != (0.0, 0.0)
                     else f"{r.published_tok_s:g}")
        out.add_row(str(r.number), r.system, r.setup, published, f"{r.compute_ms:.2f}", f"{r.hop_ms:.3f}",
                    f"{r.predicted_tok_s:.2f}", f"{r.gap_pct:+.1f}",
                    "" if r.measured_tok_s is None else f"{r.measured_tok_s:.2f}", r.source)
    return out


def show(result: ReproduceResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result)])
    for r in result.reproduced_rows:
        console.print(f"row {r.number}: assumed: {r.assumed}" + (f"; apart because: {r.why_apart}" if r.why_apart
                                                                  else ""), markup=False, highlight=False)
    for number, what, why in result.not_expressed:
        console.print(f"row {number} ({what}): not expressed: {why}", markup=False, highlight=False)
    if args.json:
        write_json(args.json, result.to_json(indent=2), console)
