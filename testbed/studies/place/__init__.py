"""The place study: the ring orders of a scenario's regions, best and worst T_ring and rate (every order up to 8
regions, else nearest neighbour + 2-opt); --measure runs both, --head-region adds a separate head."""

from __future__ import annotations

import argparse

from testbed.studies.base import Figure, ReportPart, Study, results_of
from testbed.studies.place import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measure", action="store_true", help="run the best and the worst order")
    parser.add_argument("--head-region", metavar="REGION",
                        help="also the best order with the LM head on its own agent in REGION (placement.head)")
    parser.add_argument("--json", help="write the placements here (testbed report draws them)")


STUDY = Study("place", "ring orders of a scenario's regions: best and worst T_ring and rate; --measure runs both",
              add_options, measure.run, measure.show,
              report=ReportPart("placements", "Placement", "placement searches", figures.parse_place,
                                figures.placement_markdown, (Figure("fig5_placement.png",
                                                                    results_of(figures.plot_placement)),)))
