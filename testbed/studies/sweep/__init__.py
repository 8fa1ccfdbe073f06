"""The K sweep study: `python -m testbed sweep SCENARIO --k 1..16 [--alpha 0.6,0.8]`, measured vs predicted per K and
K* (Table 3); with --tree-n it runs the tree study instead (testbed.studies.tree). Its JSON is a list of run
summaries, which the report's runs section reads."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from testbed.studies import tree
from testbed.studies.base import BenchLine, BenchRow, Study, dilation_of
from testbed.studies.sweep import measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", default="1..16", help="K values: 1..24 or 2,4,8")
    parser.add_argument("--alpha", help="calibrated-draft acceptance rates to sweep, e.g. 0.6,0.7,0.8,0.9")
    parser.add_argument("--rounds", type=int, default=30, help="rounds at each K (default 30)")
    parser.add_argument("--json", help="write all results here")
    tree.add_tree_options(parser)


def run(args: argparse.Namespace, console: Console) -> Any:
    return (tree.STUDY if args.tree_n else measure).run(args, console)


def show(result: Any, args: argparse.Namespace, console: Console) -> None:
    (tree.STUDY if args.tree_n else measure).show(result, args, console)


def bench_line(results: list) -> BenchLine:
    summary = results[0][1]
    row = summary.spec.per_k[0]
    d = dilation_of(summary)
    return BenchLine(f"speculative K = {row.k}, alpha-hat {summary.spec.alpha:.2f}", "tok/s", row.measured_tok_s,
                     row.predicted_tok_s, d["dilation"], d["capped_error_pct"])


STUDY = Study("sweep", "speculative K sweep: measured vs predicted rate per K, and K*", add_options, run, show,
              writes_runs=True, bench=BenchRow(("geo-ring", "--k", "4,8", "--alpha", "0.8", "--rounds", "20"), bench_line))
