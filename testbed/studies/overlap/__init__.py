"""The overlap study: overlapped speculation (agents.modes.overlap) against synchronous speculation and plain decode
on a single box, metro, regional and geo ring, each rate measured next to its closed form, and the gain by T_ring."""

from __future__ import annotations

import argparse

from netem.select import kinds as shaper_kinds
from testbed.studies.base import (BenchLine, BenchRow, Figure, ReportPart, Study, add_budget_option, dilation_arg,
                                  results_of)
from testbed.studies.overlap import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rings", default=",".join(name for name, _ in measure.RINGS),
                        help="rings to run, in this order (default single,metro,regional,geo: table2-single-node, "
                             "table2-metro, table2-regional and geo-ring)")
    parser.add_argument("--k", type=int, default=measure.K, help=f"drafts a round, K (default {measure.K})")
    parser.add_argument("--alpha", type=float, default=measure.ALPHA,
                        help=f"the calibrated draft's acceptance rate (default {measure.ALPHA:g})")
    parser.add_argument("--window", default=",".join(str(w) for w in measure.WINDOWS), metavar="W[,W...]",
                        help=f"rounds in flight at most, W; a list runs each, e.g. 1,4,16 (default "
                             f"{','.join(str(w) for w in measure.WINDOWS)})")
    parser.add_argument("--draft-ms", type=float, default=measure.DRAFT_MS,
                        help=f"a draft pass, c_d in ms (default {measure.DRAFT_MS:g})")
    parser.add_argument("--temperature", type=float, default=measure.TEMPERATURE,
                        help=f"sampling temperature (default {measure.TEMPERATURE:g}; 0 = greedy)")
    parser.add_argument("--tokens", type=int, default=measure.TOKENS,
                        help=f"tokens each run decodes (default {measure.TOKENS})")
    parser.add_argument("--shaper", choices=shaper_kinds(), default="virtual",
                        help="network shaping backend (default virtual: exact, fast)")
    parser.add_argument("--dilation", type=dilation_arg, default="auto", metavar="D|auto",
                        help="time dilation on a real backend (default auto)")
    add_budget_option(parser, study=True)
    parser.add_argument("--json", help=f"write the result here (default {measure.JSON_PATH})")


def bench_line(result: measure.OverlapResult) -> BenchLine:
    """The geo ring's overlapped rate against the closed form of its realized runs (docs/measured.md: -0.5% on the
    relay at D 3-4)."""
    r = result.overlap_rows[0]
    return BenchLine(f"{r.ring} overlap K {result.k} W {r.window}", "tok/s", r.overlap_tok_s, r.overlap_predicted_tok_s,
                     r.dilation, r.capped_error_pct)


STUDY = Study("overlap", "overlapped speculation vs synchronous speculation and plain decode by T_ring (single box, "
                         "metro, regional, geo): tok/s measured vs predicted, and the gain", add_options, measure.run,
              measure.show, scenario=False,
              report=ReportPart("overlap_rows", "Overlapped speculation", "overlap studies", figures.parse_overlap,
                                figures.overlap_markdown,
                                (Figure("fig11_overlap.png", results_of(figures.plot_overlap)),)),
              bench=BenchRow(("--rings", "geo"), bench_line))
