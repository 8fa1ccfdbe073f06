"""The acceptance study: the positional acceptance vector of a draft/target pair, calibrated on one set of prompts,
and the tokens a round yields at each K on held-out prompts, measured next to the per-position and the i.i.d.
predictions. Its measurement imports torch, so it is imported when the study runs."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from testbed.studies.acceptance import figures
from testbed.studies.base import ReportPart, Study

K_CAL = 8  # calibration rounds draw K from 1..K_CAL: every start state and position up to it is observed
CAP = 1  # start states (agents.modes.speculative.positional.StartAcceptance): accepted counts of the round before
PROMPTS = "8"  # prompts a set (calibration, held out); "all": half the text's windows each
TOKENS = 64  # tokens each prompt is continued for, at every K


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", default="geo-ring",
                        help="built-in name or a TOML file: its models, temperature, alpha, c_d, C and T_ring "
                             "(default geo-ring)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set decode.temperature=1")
    parser.add_argument("--draft", default="trained", metavar="trained|calibrated",
                        help="the shipped draft model, or the target dialled to --alpha (default trained)")
    parser.add_argument("--alpha", type=float, metavar="A", help="the calibrated draft's acceptance rate (default "
                                                                 "the scenario's decode.alpha)")
    parser.add_argument("--k-cal", type=int, default=K_CAL, metavar="K",
                        help=f"calibration rounds draw K from 1..K; held-out Gamma is measured at K = 1..K "
                             f"(default {K_CAL})")
    parser.add_argument("--cap", type=int, default=CAP, metavar="M",
                        help=f"start states: the round before accepted 0..M (M: M or more) drafts, all it drafted or "
                             f"not (default {CAP}; 0: after a residual or after the target's token)")
    parser.add_argument("--prompts", default=PROMPTS, metavar="N|all",
                        help=f"prompts in each of the two disjoint sets; all: half the text's windows each "
                             f"(default {PROMPTS})")
    parser.add_argument("--tokens", type=int, default=TOKENS, metavar="T",
                        help=f"tokens each prompt is continued for, at every K (default {TOKENS})")
    parser.add_argument("--seed", type=int, default=0, help="which windows go to which set, and the draws (default 0)")
    parser.add_argument("--json", help="write the result here (default results/acceptance-DRAFT-SCENARIO.json)")


def run(args: argparse.Namespace, console: Console) -> Any:
    from testbed.studies.acceptance import measure

    return measure.run(args, console)


def show(result: Any, args: argparse.Namespace, console: Console) -> None:
    from testbed.studies.acceptance import measure

    measure.show(result, args, console)


# No bench row: the study runs no ring, so there is no testbed overhead to hold to a prediction.
STUDY = Study("acceptance", "acceptance per draft position: the positional vector on calibration prompts, and the "
                            "tokens a round yields at each K on held-out prompts, measured vs per-position and i.i.d. "
                            "predictions", add_options, run, show, scenario=False,
              report=ReportPart("acceptance_rows", "Acceptance per draft position", "acceptance calibrations",
                                figures.parse_acceptance, figures.acceptance_markdown))
