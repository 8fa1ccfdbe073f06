"""The regimes study: seed 000's regime map on one ring (TTFT vs prompt and link rate, aggregate and per-stream
rate vs streams in flight, decode, speculation), every point measured next to its prediction."""

from __future__ import annotations

import argparse

from testbed.studies.base import BenchLine, BenchRow, Figure, ReportPart, Study, int_list, results_of
from testbed.studies.regimes import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", help="comma-separated parts: ttft,streams,decode,speculative,cold (default all)")
    parser.add_argument("--streams", type=int_list, metavar="M,M,...",
                        help="stream counts to measure (default 1, 2, N, 2N, 4N and twice the knee)")
    parser.add_argument("--json", help="write the result here (default results/regimes-SCENARIO.json)")


def _has(regime: str):
    return lambda items: any(row.regime == regime for item in items for row in item.result.rows)


def bench_line(result: measure.RegimesResult) -> BenchLine:
    r = result.rows[0]
    return BenchLine(r.label, r.unit, r.measured, r.predicted, r.dilation)


STUDY = Study("regimes", "seed 000's regime map on one ring: TTFT vs prompt and link rate, aggregate and per-stream "
                         "rate vs streams in flight, decode, speculation", add_options, measure.run, measure.show,
              report=ReportPart("rows", "Regimes", "regime maps", figures.parse_regimes, figures.regime_markdown, (
                  Figure("fig3_streams.png", results_of(figures.plot_streams), _has("streams")),
                  Figure("fig4_ttft.png", results_of(figures.plot_ttft), _has("ttft")))),
              bench=BenchRow(("geo-ring", "--only", "decode"), bench_line))
