"""The dsd study: speculation at a distance (seeds 002/003): co-located SD, synchronous and pipelined edge drafts
and cloud AR across the edge RTT, the crossover, server capacity against edge clients, and jitter."""

from __future__ import annotations

import argparse

from testbed.studies.base import BenchLine, BenchRow, Figure, ReportPart, Study, results_of
from testbed.studies.dsd import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rtts", default=",".join(f"{r:g}" for r in (5, 10, 20, 50, 100, 200)),
                        help="edge round trips in ms (default 5,10,20,50,100,200)")
    parser.add_argument("--clients", default="1,2,4,8", help="edge clients for the capacity table (default 1,2,4,8)")
    parser.add_argument("--jitters", default="0,5,20", help="edge-link jitter (ms, of the round trip) at the largest "
                                                            "RTT, the referee's question (default 0,5,20)")
    parser.add_argument("--target-rate", type=float, help="per-client tok/s for the clients-sustained figure "
                                                          "(default: half the co-located server's rate)")
    parser.add_argument("--json", help="write the result here (default results/dsd-SCENARIO.json)")


def bench_line(result: measure.DsdResult) -> BenchLine:
    r = result.dsd_rows[0]
    return BenchLine(f"synchronous DSD request, RTT {r.rtt_ms:g} ms", "ms", r.sync_ms, r.sync_predicted_ms, r.dilation,
                     r.capped_error_pct)


STUDY = Study("dsd", "speculation at a distance: co-located SD, synchronous and pipelined edge drafts and cloud AR "
                     "across the edge RTT, the crossover, and server capacity", add_options, measure.run, measure.show,
              report=ReportPart("dsd_rows", "Speculation at a distance", "DSD results", figures.parse_dsd,
                                figures.dsd_markdown, (Figure("fig8_dsd.png", results_of(figures.plot_dsd)),)),
              bench=BenchRow(("edge-cloud", "--rtts", "20", "--clients", "1", "--jitters", "0"),
                             bench_line))
