"""The bench study: the testbed's own precision and cost (relay release error, per-hop overhead against raw sockets,
Table 2 fidelity per backend, the launcher's cost per lap, scale on real and simulated time, the soak)."""

from __future__ import annotations

import argparse

from testbed.studies.base import ReportPart, Study
from testbed.studies.bench import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="the figures a user checks first, in a few minutes: sections 1-3b (relay release error, "
                             "per-hop overhead against the raw socket, three Table 2 rows undilated and at auto "
                             "dilation, beside virtual), fewer samples; without it every section runs")
    parser.add_argument("--shapers", default="userspace", help="comma-separated backends to compare")
    parser.add_argument("--only", choices=("all", "studies", "hidden", "transport"), default="all",
                        help="studies: only section 8, one row of every study; hidden: only section 3c, the "
                             "hidden-size sweep; transport: only the transport grid, testbed.core.tcp's model "
                             "against the kernel's TCP through netem (inside user-mode-linux where the kernel has "
                             "no sch_netem; --quick: the grid's subset), every point's error and how many are "
                             "within 10%% (default all)")
    parser.add_argument("--json", help="write the figures here")


STUDY = Study("bench", "print relay precision, per-hop overhead and Table 2 fidelity", add_options, measure.run,
              measure.show, scenario=False,
              report=ReportPart("relay", "Testbed precision", "bench runs", figures.parse_bench,
                                figures.bench_markdown))
