"""The whatif study: a deployment named from the catalogues (a model preset on a hardware preset in catalogue
regions), its decode rate, TTFT, speculation at K*, streams and the breakdown of a token's time predicted from the
presets alone, then (--measure) run with the preset's hidden state on the wire and measured next to them."""

from __future__ import annotations

import argparse

from netem.select import kinds as shaper_kinds
from testbed.studies.base import BenchLine, BenchRow, ReportPart, Study, add_budget_option, dilation_arg
from testbed.studies.whatif import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="PRESET", help="a model preset (testbed/deploy/models.toml)")
    parser.add_argument("--hardware", metavar="PRESET[,N]",
                        help="every stage's hardware preset and devices per stage (testbed/deploy/hardware.toml; "
                             "default: h100-sxm, the fewest per stage that hold a stage's share of the model)")
    parser.add_argument("--regions", metavar="A,B,C",
                        help="one stage per region, the ring in this order (testbed/deploy/regions.toml)")
    parser.add_argument("--draft", metavar="PRESET", help="a draft model preset, run whole on the entry's hardware")
    parser.add_argument("--alpha", type=float, default=0.7, help="the draft's acceptance rate (default 0.7)")
    parser.add_argument("--prompt", type=int, default=2048, metavar="P",
                        help="prompt tokens (default 2048; past the tiny model's window the rest is emulated)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens to generate (default 24)")
    parser.add_argument("--streams", type=int, default=16, metavar="M",
                        help="streams for the continuous-batching aggregate (default 16)")
    parser.add_argument("--rate-mbit", type=float, default=None, metavar="W",
                        help="every link's rate, Mbit/s (default: one TCP flow between two regions, the region "
                             "catalogue's flow_rate_mbit: 5,000 on AWS; 0 = unlimited)")
    parser.add_argument("--measure", action="store_true", help="run the deployment and print measured next to "
                                                               "predicted")
    parser.add_argument("--shaper", choices=shaper_kinds(), default="auto", help="backend for --measure")
    parser.add_argument("--dilation", type=dilation_arg, default="auto", metavar="D|auto",
                        help="time dilation for --measure (default auto)")
    add_budget_option(parser, study=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the scenario it builds, e.g. --set decode.prefill_chunk=32")
    parser.add_argument("--json", help="write the result here")


def bench_line(result: measure.WhatifResult) -> BenchLine:
    return BenchLine(f"decode, {result.whatif}", "tok/s", result.measured_tok_s, result.predicted_tok_s, result.dilation)


STUDY = Study("whatif", "a deployment from the catalogues (model, hardware, regions): decode, TTFT, speculation, "
                        "streams and where a token's time goes, predicted, and measured with --measure", add_options,
              measure.run, measure.show, scenario=False,
              report=ReportPart("whatif", "What if", "deployments", figures.parse, figures.markdown),
              bench=BenchRow(("--model", "llama-3.1-70b", "--hardware", "h100-sxm,8", "--regions",
                              "hong-kong,ireland,virginia", "--measure"), bench_line))
