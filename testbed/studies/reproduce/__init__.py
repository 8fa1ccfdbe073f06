"""The reproduce study: published measurements of real distributed-inference systems (../shared/PUBLISHED.md), each
as a ring built from what its source states, printed as published vs predicted vs measured, with why where apart."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from netem.select import kinds as shaper_kinds
from testbed.studies.base import ReportPart, Study, add_budget_option, dilation_arg
from testbed.studies.reproduce import measure
from testbed.scenario.validate import check_number, record_from


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measure", action="store_true", help="run every row's ring (default: predict only)")
    parser.add_argument("--shaper", choices=shaper_kinds(), default="virtual",
                        help="backend for --measure (default virtual: exact, fast)")
    parser.add_argument("--dilation", type=dilation_arg, default="auto", metavar="D|auto",
                        help="time dilation for --measure on a real backend (default auto)")
    add_budget_option(parser, study=True)
    parser.add_argument("--tokens", type=int, default=measure.TOKENS, help="tokens each measured row decodes")
    parser.add_argument("--json", help="write the result here")


def parse(data: dict, source: str) -> measure.ReproduceResult:
    result = record_from(measure.ReproduceResult, data, source, "a reproduce result")
    for i, row in enumerate(result.reproduced_rows):
        check_number(row.predicted_tok_s, source, f"reproduced_rows[{i}].predicted_tok_s", positive=True)
    return result


def markdown(items: Sequence[measure.ReproduceResult]) -> list[str]:
    lines = ["| # | system | setup | published tok/s | predicted | gap % | measured | why apart | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in items:
        for r in result.reproduced_rows:
            measured = "" if r.measured_tok_s is None else f"{r.measured_tok_s:.2f}"
            lines.append(f"| {r.number} | {r.system} | {r.setup} | {r.published_tok_s:g} | {r.predicted_tok_s:.2f} | "
                         f"{r.gap_pct:+.1f} | {measured} | {r.why_apart} | {r.source} |")
    return lines


# No bench row (Study.bench): its rows are six published deployments, each a run; `reproduce --measure` is the check.
STUDY = Study("reproduce", "published deployments (PUBLISHED.md) as rings built from their sources: published vs "
                           "predicted vs measured", add_options, measure.run, measure.show, scenario=False,
              report=ReportPart("reproduced_rows", "Published deployments", "reproductions", parse, markdown))
