"""The search study: the best deployment of a model from the machines and regions a user has (issue 53). Every
candidate (which machines, the ring order, the layer split, speculation, the codec, KV local or shipped, TP inside a
region, the batch cap) scored by the closed forms, memory-infeasible ones refused with the reason, the winner and
runner-ups with their breakdown, the Pareto frontier against $/h, and the best few run on virtual time beside their
predictions."""

from __future__ import annotations

import argparse

from netem.select import kinds as shaper_kinds
from testbed.studies.base import Figure, ReportPart, Study, add_budget_option, dilation_arg, results_of
from testbed.studies.search import figures, measure, tables
from testbed.studies.search.spec import EXAMPLES, OBJECTIVES


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help=f"the search file (TOML: machines, regions, model, objective, constraints), or a shipped "
                             f"one: {', '.join(EXAMPLES)} (docs/studies/search.md)")
    parser.add_argument("--objective", choices=OBJECTIVES, help="override the file's objective")
    parser.add_argument("--alpha", type=float, default=None, help="override the draft's stated acceptance rate")
    parser.add_argument("--top", type=int, default=measure.TOP, help=f"candidates printed (default {measure.TOP})")
    parser.add_argument("--confirm", type=int, default=measure.CONFIRM, metavar="N",
                        help=f"run the best N on --shaper and print measured vs predicted (default {measure.CONFIRM}; "
                             "0 = the closed forms only)")
    parser.add_argument("--shaper", choices=shaper_kinds(), default="virtual",
                        help="backend for the confirmations (default virtual: simulated time, exact)")
    parser.add_argument("--verify", nargs="?", const="auto", choices=shaper_kinds(), metavar="SHAPER",
                        help="run the winner on a real backend and print its measured objective beside the predicted "
                             "(default auto: netem where the kernel has it, else the userspace relay; virtual for a "
                             "dry run of the plumbing), at --dilation within --budget-s")
    parser.add_argument("--dilation", type=dilation_arg, default="auto", metavar="D|auto",
                        help="time dilation of the runs on a real backend (default auto)")
    add_budget_option(parser, study=True)
    parser.add_argument("--figure", metavar="PNG", help="draw the Pareto frontier here (also `testbed report`'s "
                                                        "fig12_search_pareto.png from the JSON)")
    parser.add_argument("--json", help="write the result here")


def show(result: measure.SearchResult, args: argparse.Namespace, console) -> None:
    """tables.show, then the Pareto frontier's figure where --figure asks for it."""
    tables.show(result, args, console)
    if args.figure:
        figures.plot_pareto([result], args.figure)
        console.print(f"Figure: {args.figure}")


# No bench row: the search's own figure is its scored count and time, and its confirmation is whatif's decode row
# (testbed bench runs that one).
STUDY = Study("search", "the best deployment from the machines and regions you have: every candidate (machines, ring "
                        "order, layer split, speculation, codec, KV, TP, batch cap) by the closed forms, the Pareto frontier against $/h, the "
                        "best run on virtual time", add_options, measure.run, show, scenario=False,
              report=ReportPart("pareto", "Search", "searches", figures.parse, figures.markdown,
                                (Figure("fig12_search_pareto.png", results_of(figures.plot_pareto)),)))
