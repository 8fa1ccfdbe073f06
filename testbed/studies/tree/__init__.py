"""The tree study: tree speculation swept over nodes per round, link rates and codecs (`sweep SCENARIO --tree-n
1,4,16,64`), L(n) and its fit, tok/s measured vs physics.tree_rate, and W*. Its command is the sweep's."""

from __future__ import annotations

import argparse

from testbed.studies.base import BenchLine, BenchRow, Figure, ReportPart, Study, results_of
from testbed.studies.tree import figures, measure


def add_tree_options(parser: argparse.ArgumentParser) -> None:
    """The tree sweep's options (the sweep command has them too)."""
    parser.add_argument("--tree-n", metavar="N,N,...", help="tree speculation instead: nodes per round to sweep, "
                                                            "e.g. 1,4,16,64,256 (writes results/tree-SCENARIO.json)")
    parser.add_argument("--rates", default="0,10", help="--tree-n: link rates in Mbit/s (default 0,10; 0 = unlimited)")
    parser.add_argument("--codecs", default="f32", help="--tree-n: wire codecs, e.g. f32,int8-block (default f32)")
    parser.add_argument("--tree-k", type=int, default=8, help="--tree-n: candidates per node (default 8)")


def add_options(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
    parser.add_argument("--json", help="write the result here (default results/tree-SCENARIO.json)")


def bench_line(result: measure.TreeSweep) -> BenchLine:
    r = result.tree_rows[0]
    return BenchLine(f"tree n = {r.n:g} at {r.rate_mbit:g} Mbit/s", "tok/s", r.measured_tok_s, r.predicted_tok_s,
                     r.dilation, r.capped_error_pct)


STUDY = Study("tree", "tree speculation: L(n), tok/s vs nodes per round and W*, measured vs predicted (the command is "
                      "`sweep SCENARIO --tree-n N,N,...`)", add_options, measure.run, measure.show, command=False,
              report=ReportPart("tree_rows", "Tree speculation", "tree sweeps", figures.parse_tree,
                                figures.tree_markdown, (Figure("fig7_tree.png", results_of(figures.plot_tree)),)),
              bench=BenchRow(("geo-ring", "--tree-n", "16", "--rates", "10"), bench_line))
