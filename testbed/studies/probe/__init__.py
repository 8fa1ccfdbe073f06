"""The probe study: the links between the hosts a user has, measured NetPIPE-style (one-way latency and goodput by
message size) on the box's one clock, beside what the scenario configured; it writes the region matrix and link
table `testbed search` reads (regions = "FILE")."""

from __future__ import annotations

import argparse

from testbed.studies.base import ReportPart, Study
from testbed.studies.probe import links, measure, tables
from testbed.studies.probe.ladder import DEFAULT_PING_SIZES, DEFAULT_SIZES


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, metavar="LADDER",
                        help=f"message sizes: LO..HI (x4 a step, HI included) or a list, in bytes with an optional "
                             f"Ki / Mi suffix (default {DEFAULT_SIZES})")
    parser.add_argument("--samples", type=int, default=measure.SAMPLES, metavar="N",
                        help=f"messages of each size, after a first one alone (default {measure.SAMPLES}; fewer "
                             f"where a size's share of --budget-s holds fewer, {measure.MIN_SAMPLES} at least)")
    parser.add_argument("--ping-sizes", default=DEFAULT_PING_SIZES, metavar="LADDER",
                        help=f"round trips (NetPIPE's ping-pong: a message and a reply of its size) at these sizes, "
                             f"as --sizes reads them, or none (default {DEFAULT_PING_SIZES})")
    parser.add_argument("--out", metavar="TOML", help="write the region matrix and link table here (a search file "
                                                      "reads it: regions = \"FILE\")")
    parser.add_argument("--json", help="write the result here")


# No bench row: a probe's figures are its links' own, checked against the configured ones in its table.
STUDY = Study("probe", "the links between your hosts, measured one-way by message size (latency and goodput, "
                       "NetPIPE-style) beside the scenario's; writes the region matrix `testbed search` reads",
              add_options, measure.run, tables.show, defaults=(("dilation", 1.0),),
              report=ReportPart("probe_links", "Probe", "probes", links.parse, links.markdown))
