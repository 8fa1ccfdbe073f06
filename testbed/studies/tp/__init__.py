"""The tp study: pipeline vs tensor parallelism on the same links, per-token latency measured vs predicted at
several multiples of the links' delay, and the TP/PP ratio next to Eq. 8's 4L/N."""

from __future__ import annotations

import argparse

from testbed.core.decode import ALLREDUCE
from testbed.studies.base import BenchLine, BenchRow, Figure, ReportPart, Study, results_of
from testbed.studies.tp import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allreduce", choices=ALLREDUCE, default="ring", help="TP's all-reduce (default ring)")
    parser.add_argument("--hop-scale", default="1", metavar="F,F,...",
                        help="run at these multiples of every link's delay (default 1), e.g. 0.25,0.5,1")
    parser.add_argument("--json", help="write the result here (default results/tp-SCENARIO.json)")


def bench_line(result: measure.TpResult) -> BenchLine:
    r = result.tp_rows[0]
    return BenchLine(f"TP per token, links x{r.hop_scale:g}", "ms", r.tp_token_ms, r.tp_predicted_token_ms, r.dilation,
                     r.capped_error_pct)


STUDY = Study("tp", "pipeline vs tensor parallelism on the same links: per-token latency measured vs predicted, the "
                    "TP/PP ratio next to Eq. 8's 4L/N", add_options, measure.run, measure.show,
              report=ReportPart("tp_rows", "PP vs TP", "PP-vs-TP sweeps", figures.parse_tp, figures.tp_markdown,
                                (Figure("fig6_tp.png", results_of(figures.plot_tp)),)),
              bench=BenchRow(("geo-ring", "--hop-scale", "0.25"), bench_line))
