"""A study sketched for the study seam's test (one folder plus one line in STUDIES): it runs the scenario on the
virtual backend and reports the wall, measured next to 1/(C + T_ring), as one row."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import trio
from rich.console import Console

from testbed.core.records import JsonRecord
from testbed.studies.base import Sourced, ReportPart, Study, make_scenario, results_path, write_json
from testbed.scenario.validate import check_number, record_from


@dataclass(frozen=True)
class EchoResult(JsonRecord):
    scenario: str
    echo_measured_tok_s: float
    predicted_tok_s: float


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write the result here (default results/echo-SCENARIO.json)")


def run(args: argparse.Namespace, console: Console) -> EchoResult:
    from testbed.launch.launcher import run_scenario

    scenario = make_scenario(args.scenario, tokens=args.tokens, overrides=list(args.overrides))
    summary = trio.run(lambda: run_scenario(scenario, args.shaper, log=lambda m: None))
    return EchoResult(scenario.name, summary.measured_tok_s, summary.predicted_tok_s)


def show(result: EchoResult, args: argparse.Namespace, console: Console) -> None:
    console.print(f"echo: {result.echo_measured_tok_s:.3f} tok/s, predicted {result.predicted_tok_s:.3f}")
    write_json(results_path(args, "echo", args.scenario), result.to_json(indent=2), console)


def parse(data: dict, source: str) -> Sourced[EchoResult]:
    result = record_from(EchoResult, data, source, "an echo result")
    check_number(result.echo_measured_tok_s, source, "echo_measured_tok_s", minimum=0.0)
    return Sourced(source, result)


def markdown(items: Sequence[Sourced[EchoResult]]) -> list[str]:
    return [f"| {item.source} | {item.result.echo_measured_tok_s:.3f} | {item.result.predicted_tok_s:.3f} |"
            for item in items]


STUDY = Study("echo", "the wall, measured vs predicted, as one row (a test study)", add_options, run, show,
              report=ReportPart("echo_measured_tok_s", "Echo", "echo results", parse, markdown))
