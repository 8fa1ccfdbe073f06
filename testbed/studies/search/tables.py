"""The search's printed tables (the candidates, the published case, refusals, confirmations, the verification) and
`show`, which prints a SearchResult as the command does."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from testbed.studies.base import dilation_cell, log_to, print_tables, write_json
from testbed.studies.search.goodput import GoodputCheck
from testbed.studies.search.measure import CandidateRow, Confirmation, PublishedCase, SearchResult
from testbed.studies.search.spec import PER_DOLLAR, SERVING


def candidates_table(title: str, rows: Sequence[CandidateRow], objective: str) -> Table:
    out = Table(title=title)
    serving, per_dollar = objective in SERVING, objective in PER_DOLLAR
    for col in ("#", "ring (entry first)", "layers", "split", "decode", "wire, KV, parallel", "tok/s",
                *(("goodput req/s",) if serving else ()), "$/h",
                *((f"{'req/s' if serving else 'tok/s'} per $/h",) if per_dollar else ()),
                "compute ms", "links ms", "draft ms", "tok/round", "bottleneck"):
        out.add_column(col, justify="right")
    for r in rows:
        out.add_row(str(r.rank) if r.rank else "", f"{r.ring}", "/".join(map(str, r.layers)), r.split, r.decode,
                    r.settings, f"{r.tok_s:.2f}", *((goodput_cell(r),) if serving else ()), f"{r.cost_hour:.2f}",
                    *((f"{r.objective:.3f}",) if per_dollar else ()),
                    f"{r.compute_ms:.1f}", f"{r.propagation_ms + r.serialization_ms + r.codec_ms:.1f}",
                    f"{r.draft_ms:.1f}",
                    f"{r.tokens_per_round:.2f}", r.bottleneck + ("" if r.queue_free else " (queues)"))
    return out


def goodput_cell(r: CandidateRow) -> str:
    return "-" if r.goodput_req_s is None else f"{r.goodput_req_s:.3g}"


def goodput_table(g: GoodputCheck) -> Table:
    out = Table(title=f"The goodput winner served on {g.shaper} at its goodput (--confirm): SLO {g.slo}, measured "
                      "beside the search's queueing model")
    for col in ("ring", "rate req/s", "requests", "attainment % (target)", "TTFT ms (model)", "TPOT ms (model)",
                "shaper"):
        out.add_column(col, justify="right")
    out.add_row(g.ring, f"{g.rate_req_s:g}", str(g.requests), f"{g.measured_pct:.1f} ({g.target_pct:g})",
                f"{g.measured_ttft_ms:.1f} ({g.predicted_ttft_ms:.1f})",
                f"{g.measured_tpot_ms:.1f} ({g.predicted_tpot_ms:.1f})", g.shaper)
    return out


def published_table(p: PublishedCase) -> Table:
    out = Table(title=f"The published deployment ({p.system}{f', PUBLISHED.md row {p.row}' if p.row else ''}: "
                      f"{p.source}) beside the search's best split of the same machines and order")
    for col in ("split", "ring (entry first)", "layers", "stage ms", "compute ms", "links ms", "predicted tok/s",
                "published tok/s", "vs published split"):
        out.add_column(col, justify="right")
    figure = f"{p.figure_tok_s:g}" if p.figure_tok_s else "-"
    for who, r, ms in (("published " + p.theirs.split, p.theirs, p.theirs_stage_ms),
                       ("search " + p.ours.split, p.ours, p.ours_stage_ms)):
        out.add_row(who, r.ring, "/".join(map(str, r.layers)), "/".join(f"{x:.1f}" for x in ms), f"{r.compute_ms:.1f}",
                    f"{r.propagation_ms + r.serialization_ms:.1f}", f"{r.tok_s:.2f}",
                    figure if r is p.theirs else "", f"{r.tok_s / p.theirs.tok_s:.2f}x")
    if p.winner is not None:
        w = p.winner
        out.add_row(f"search winner ({w.split}, {w.decode})", w.ring, "/".join(map(str, w.layers)), "",
                    f"{w.compute_ms:.1f}", f"{w.propagation_ms + w.serialization_ms:.1f}", f"{w.tok_s:.2f}", "",
                    f"{w.tok_s / p.theirs.tok_s:.2f}x")
    return out


def refusals_table(result: SearchResult) -> Table:
    out = Table(title=f"Refused ({result.refused:,} candidates: memory) and ruled out by the constraints")
    for col in ("why", "candidates"):
        out.add_column(col, justify="right")
    for r in result.refusals[:8]:
        out.add_row(r.reason, f"{r.candidates:,}")
    if len(result.refusals) > 8:
        out.add_row(f"... {len(result.refusals) - 8} more reasons", f"{sum(r.candidates for r in result.refusals[8:]):,}")
    for r in result.excluded:
        out.add_row(f"ruled out: {r.reason}", f"{r.candidates:,} machine sets")
    return out


def confirmations_table(result: SearchResult) -> Table:
    out = Table(title="The best candidates run (a scenario each: one stage per machine, its roofline, the matrix's "
                      "hops), measured vs predicted")
    for col in ("#", "ring", "decode", "predicted tok/s", "measured tok/s", "vs search %", "run's own form",
                "error %", "shaper"):
        out.add_column(col, justify="right")
    for c in result.confirmations:
        out.add_row(str(c.rank) if c.rank else "baseline", c.ring, c.decode, f"{c.predicted_tok_s:.3f}", f"{c.measured_tok_s:.3f}",
                    f"{c.vs_search_pct:+.2f}", f"{c.run_predicted_tok_s:.3f}", f"{c.error_pct:+.2f}", c.shaper)
    return out


def verification_table(v: Confirmation) -> Table:
    out = Table(title=f"The winner verified on {v.shaper} (--verify): measured beside predicted, in the scenario's "
                      "time")
    for col in ("ring", "decode", "predicted tok/s", "measured tok/s", "vs search %", "run's own form", "error %",
                "D", "shaper"):
        out.add_column(col, justify="right")
    out.add_row(v.ring, v.decode, f"{v.predicted_tok_s:.3f}", f"{v.measured_tok_s:.3f}", f"{v.vs_search_pct:+.2f}",
                f"{v.run_predicted_tok_s:.3f}", f"{v.error_pct:+.2f}", dilation_cell(v.dilation, v.capped_error_pct),
                v.shaper)
    return out


def show(result: SearchResult, args: argparse.Namespace, console: Console) -> None:
    tables = [candidates_table(f"Search: {result.model}, objective {result.objective}: {result.scored:,} candidates "
                               f"scored in {result.seconds:.2f} s; the best", result.top, result.objective)]
    if result.baseline is not None:
        tables.append(candidates_table("The best even split, plain decode, on the fewest regions that hold the model "
                                       "(co-located first)", [result.baseline], result.objective))
    tables.append(candidates_table("Pareto frontier: tok/s against $/h (none cheaper is as fast)", result.pareto,
                                   result.objective))
    if result.published is not None:
        tables.append(published_table(result.published))
    tables.append(refusals_table(result))
    if result.confirmations:
        tables.append(confirmations_table(result))
    if result.verification is not None:
        tables.append(verification_table(result.verification))
    if result.goodput_check is not None:
        tables.append(goodput_table(result.goodput_check))
    print_tables(console, tables)
    log = log_to(console)
    winner = result.top[0]
    if result.workload:
        log(f"served: {result.workload}; winner {winner.ring} ({winner.settings}): goodput "
            f"{winner.goodput_req_s:.3g} req/s ({winner.tok_s:.2f} tok/s for one stream)")
    if result.baseline is not None:
        log(f"winner {winner.ring} ({winner.split}, {winner.decode}, {winner.settings}): {winner.tok_s:.2f} tok/s at "
            f"${winner.cost_hour:.2f}"
            f"/h, {winner.tok_s / result.baseline.tok_s:.2f}x the best even-split co-located-first configuration "
            f"({result.baseline.ring}: {result.baseline.tok_s:.2f} tok/s at ${result.baseline.cost_hour:.2f}/h)")
    if result.confirmations:
        first = result.confirmations[0]
        log(f"the winner on {first.shaper}: measured {first.measured_tok_s:.3f} tok/s, {first.error_pct:+.2f}% from "
            f"its closed form ({first.vs_search_pct:+.2f}% from the search's, at the stated alpha "
            f"{result.alpha:g})")
    if result.verification is not None:
        v = result.verification
        log(f"verified on {v.shaper} at D {dilation_cell(v.dilation, v.capped_error_pct)}: the winner measured "
            f"{v.measured_tok_s:.3f} tok/s against {v.predicted_tok_s:.3f} predicted ({v.vs_search_pct:+.2f}%; "
            f"{v.error_pct:+.2f}% from the run's own form)")
    if result.published is not None:
        p = result.published
        log(f"published ({p.system}{f', PUBLISHED.md row {p.row}' if p.row else ''}): {p.reason}")
        if p.assumed:
            log(f"published: assumed: {p.assumed}")
    if args.json:
        write_json(args.json, result.to_json(indent=2), console)
