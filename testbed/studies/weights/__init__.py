"""The weights study: how long a ring waits for its weights before it can serve. Each stage's shard (its layers of
the scenario's [geometry]) comes from an origin in a named region over one stream, P parallel range streams, or a
chunked swarm among the nodes that need the same shard; simulated chunk by chunk on fluid TCP connections
(testbed.studies.weights.fluid), under transport "tuned" and "kernel", for the geo ring and a co-located one, beside
the closed forms (testbed.core.distribution): per-node rate bounds, the client-server and peer-to-peer bounds."""

from __future__ import annotations

import argparse

from testbed.core.tcp import TRANSPORTS
from testbed.studies.base import ReportPart, Study
from testbed.studies.weights import measure, real, report, tables

DEFAULT_ORIGIN = "virginia"  # the Hugging Face Hub's own region (AWS us-east-1)
DEFAULT_MBIT = 1000.0
DEFAULT_STREAMS = 8  # exo's downloader: 8 files in parallel
DEFAULT_CHUNK_MIB = 64.0
DEFAULT_LOCAL_MS = 0.5  # one way between two hosts of one region (the catalogue's diagonal is 0; AWS: 1-3 ms RTT)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help="built-in name or a TOML file; its [geometry] sizes the shards")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help='override a scenario key, e.g. --set geometry.preset="seed-700b"')
    parser.add_argument("--regions", metavar="A,B,C",
                        help="each stage's region (testbed/deploy/regions.toml; default: the stages' own, or their "
                             "names where the catalogue knows them)")
    parser.add_argument("--origin", default=DEFAULT_ORIGIN, metavar="REGION",
                        help=f"where the origin (a hub mirror) is (default {DEFAULT_ORIGIN})")
    parser.add_argument("--colocate", metavar="REGION", help="the co-located ring's region (default: the origin's)")
    parser.add_argument("--origin-up-mbit", type=float, default=DEFAULT_MBIT, metavar="R",
                        help=f"the origin's uplink, Mbit/s (default {DEFAULT_MBIT:g})")
    parser.add_argument("--down-mbit", type=float, default=DEFAULT_MBIT, metavar="R",
                        help=f"every node's downlink, Mbit/s (default {DEFAULT_MBIT:g})")
    parser.add_argument("--up-mbit", type=float, default=DEFAULT_MBIT, metavar="R",
                        help=f"every node's uplink, Mbit/s (default {DEFAULT_MBIT:g})")
    parser.add_argument("--streams", type=int, default=DEFAULT_STREAMS, metavar="P",
                        help=f"parallel range streams per node (default {DEFAULT_STREAMS}, as exo's downloader)")
    parser.add_argument("--rings", type=int, default=1, metavar="R",
                        help="copies of the ring, in the same regions: a stage's R nodes form a swarm group "
                             "(default 1: distinct shards, where a swarm cannot beat the origin)")
    parser.add_argument("--chunk-mib", type=float, default=DEFAULT_CHUNK_MIB, metavar="MIB",
                        help=f"chunk size (default {DEFAULT_CHUNK_MIB:g} MiB)")
    parser.add_argument("--transport", choices=TRANSPORTS,
                        help="one transport only (default: both, tuned and kernel)")
    parser.add_argument("--local-ms", type=float, default=DEFAULT_LOCAL_MS, metavar="MS",
                        help=f"one-way delay within a region (default {DEFAULT_LOCAL_MS:g})")
    parser.add_argument("--json", help="write the result here (default results/weights-SCENARIO.json)")
    real.add_options(parser)


# No bench row: its figures are simulated on virtual time, each beside its closed form in its own table; with --real,
# a checkpoint's shards also cross the relay's or netem's links as real bytes, each node beside its closed form.
STUDY = Study("weights", "time to a ready ring: every stage's shard from an origin over one stream, parallel streams "
                         "or a swarm, geo vs co-located, tuned vs kernel TCP; simulated beside the closed forms",
              add_options, measure.run, tables.show, scenario=False,
              report=ReportPart("weights_rows", "Weight distribution", "weight distributions", report.parse,
                                report.markdown))
