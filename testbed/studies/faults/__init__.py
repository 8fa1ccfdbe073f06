"""The faults study: jitter and loss on every link, each row's mean and p99 lap measured against the model, and
the output against the clean run's (faults delay data, they never corrupt it)."""

from __future__ import annotations

import argparse

from testbed.studies.base import BenchLine, BenchRow, ReportPart, Study
from testbed.studies.faults import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jitters", default="0,1,5,20", help="jitter per link, ms (default 0,1,5,20)")
    parser.add_argument("--losses", default="0,0.1,1,5", help="loss per link, %% (default 0,0.1,1,5)")
    parser.add_argument("--json", help="write the rows here (default results/faults-SCENARIO.json)")
    parser.add_argument("--shapers", help="backends to run the rows on, e.g. userspace,netem (default: --shaper)")


def bench_line(results: list[measure.FaultsResult]) -> BenchLine:
    r = results[0].fault_rows[0]
    return BenchLine(f"mean lap, {r.fault} {r.value:g}", "ms", r.lap_ms, r.predicted_ms, r.dilation, r.capped_error_pct)


STUDY = Study("faults", "jitter and loss on every link: mean and p99 lap measured vs the model, and the output "
                        "against the clean run", add_options, measure.run, measure.show,
              report=ReportPart("fault_rows", "Faults", "faults results", figures.parse_faults,
                                figures.faults_markdown),
              bench=BenchRow(("geo-ring", "--jitters", "2", "--losses", "0"), bench_line))
