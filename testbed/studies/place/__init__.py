"""The place study: the ring orders of a scenario's regions, best and worst T_ring and rate (every order up to 8
regions, else nearest neighbour + 2-opt); --measure runs both, --head-region adds a separate head."""

from __future__ import annotations

import argparse

from testbed.studies.base import BenchLine, BenchRow, Figure, ReportPart, Study, results_of
from testbed.studies.place import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measure", action="store_true", help="run the best and the worst order")
    parser.add_argument("--head-region", metavar="REGION",
                        help="also the best order with the LM head on its own agent in REGION (placement.head)")
    parser.add_argument("--json", help="write the placements here (testbed report draws them)")


def bench_line(result: measure.PlaceResult) -> BenchLine:
    p = next(p for p in result.placements if p.measured_tok_s is not None)
    return BenchLine(f"{p.label or 'order'}, T_ring {p.t_ring_s * 1e3:.1f} ms", "tok/s", p.measured_tok_s,
                     p.predicted_tok_s, p.dilation or 1.0, p.capped_error_pct)


STUDY = Study("place", "ring orders of a scenario's regions: best and worst T_ring and rate; --measure runs both",
              add_options, measure.run, measure.show,
              report=ReportPart("placements", "Placement", "placement searches", figures.parse_place,
                                figures.placement_markdown, (Figure("fig5_placement.png",
                                                                    results_of(figures.plot_placement)),)),
              bench=BenchRow(("world-8", "--measure", "--head-region", "tokyo"), bench_line))
