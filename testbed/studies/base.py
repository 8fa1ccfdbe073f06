"""What a study is: its command's options, its measurement, how it shows and saves its result, and its part of
`testbed report`. The CLI, the API (`testbed.<study>(...)`) and the report read studies from `STUDIES`.

    STUDY = Study("faults", "jitter and loss on every link...", options=add_options, run=run, show=show,
                  report=ReportPart("fault_rows", "Faults", parse, markdown))

`run(args, console) -> result` measures (the API returns its result); `show(result, args, console)` prints the
tables and writes the JSON. A report part tells its JSON objects apart by one key, checks them (a ConfigError
naming the source and the key), writes its section and draws its figures.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from rich.console import Console
from rich.table import Table

from netem.select import kinds as shaper_kinds
from testbed.scenario.config import Scenario, builtin_names, load_scenario
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary
from testbed.launch.budget import STUDY_BUDGET_S, plan_runs, study_budget  # noqa: F401 - plan_runs: for the studies
from testbed.launch.dilation import BUDGET_S, parse_budget, parse_dilation
from testbed.launch.trace import tracing

TABLE_WIDTH = 160  # a study's tables print at least this wide (a piped console is 80 wide and would fold them)


ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class Sourced(Generic[ResultT]):
    """One study's result read back for `testbed report`, and where it came from (a file, or "file.json[2]")."""

    source: str
    result: ResultT


@dataclass(frozen=True)
class Figure:
    """One figure of a report part: its file name, how it is drawn from the part's items, and whether it is."""

    name: str
    draw: Callable[[Sequence[Any], Path], None]
    wanted: Callable[[Sequence[Any]], bool] = bool  # default: whenever the part has an item


@dataclass(frozen=True)
class ReportPart:
    """A study's part of `testbed report`: the key its JSON objects carry, how one is checked, its section."""

    key: str  # a JSON object with this key is this study's (the first part whose key it has wins)
    title: str  # the section's heading in report.md
    noun: str  # what one item is called in the report's opening count, plural ("regime maps")
    parse: Callable[[dict, str], Any]  # (object, source) -> a checked item; ConfigError names source and key
    markdown: Callable[[Sequence[Any]], list[str]]  # the section's body from every item
    figures: tuple[Figure, ...] = ()


DURATION_UNITS = ("s", "ms", "us")  # a BenchLine in these is a time, not a rate


@dataclass(frozen=True)
class BenchLine:
    """A study's line in `testbed bench`'s studies section: one measured figure beside its prediction."""

    what: str  # the row, as the study's own table names it
    unit: str
    measured: float
    predicted: float
    dilation: float = 1.0
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves on the rate

    @property
    def error_pct(self) -> float:
        return (self.measured / self.predicted - 1) * 100

    @property
    def expected_error_pct(self) -> float | None:
        """The capped D's expected error on this line's figure: the overhead lowers a rate by e% and so lengthens a
        duration (a line in s or ms) by 1 / (1 + e) - 1, the opposite sign."""
        return on_duration(self.capped_error_pct) if self.unit in DURATION_UNITS else self.capped_error_pct


@dataclass(frozen=True)
class BenchRow:
    """How `testbed bench` measures one small row of a study: its arguments (the scenario first; the bench adds
    --shaper) and the line its result gives."""

    argv: tuple[str, ...]
    line: Callable[[Any], BenchLine]


@dataclass(frozen=True)
class Study:
    """One study: a command of `python -m testbed`, a function of the API and a section of the report."""

    name: str
    help: str
    options: Callable[[argparse.ArgumentParser], None]  # its own options (after the run options, if it takes them)
    run: Callable[[argparse.Namespace, Console], Any]  # measure; returns the result
    show: Callable[[Any, argparse.Namespace, Console], None]  # print the tables, write the JSON
    report: ReportPart | None = None  # how `testbed report` reads its JSON (None: see writes_runs)
    writes_runs: bool = False  # its JSON is run summaries, which the report's runs section reads
    command: bool = True  # False: reached through another study's command (the tree sweep: `sweep --tree-n`)
    scenario: bool = True  # takes a scenario and the run options
    defaults: tuple[tuple[str, Any], ...] = ()  # option values the command fixes (e.g. dilation=1.0)
    bench: BenchRow | None = None  # its row in `testbed bench`'s studies section (None: none, say why where it is)

    def parser(self, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        """Its options on `parser` (a fresh one named after the study if None)."""
        parser = parser or argparse.ArgumentParser(prog=f"python -m testbed {self.name}", description=self.help)
        if self.scenario:
            add_run_options(parser, study=True)
            add_trace_option(parser)
        self.options(parser)
        parser.set_defaults(**dict(self.defaults))
        return parser

    def measure(self, args: argparse.Namespace, console: Console) -> Any:
        """run(args, console), every run's laps in the --trace timeline when one is asked for, and every run's auto
        dilation from one budget (--budget-s) and one calibration per stages and links (testbed.launch.budget)."""
        budget = getattr(args, "budget_s", None)
        with tracing(getattr(args, "trace", None)), (study_budget(budget) if budget else contextlib.nullcontext()):
            return self.run(args, console)

    def main(self, args: argparse.Namespace, console: Console) -> int:
        self.show(self.measure(args, console), args, console)
        if getattr(args, "trace", None):
            console.print(f"Trace (Perfetto, chrome://tracing): {args.trace}")
        return 0


def dilation_arg(text: str) -> float | str:
    try:
        return parse_dilation(text)
    except ConfigError as exc:  # argparse reports it as a usage error (exit 2) naming the option
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--dilation: ")) from exc


def add_run_options(parser: argparse.ArgumentParser, *, study: bool = False) -> None:
    """The options of every command that runs a scenario: which, on what, with which overrides (a study's budget
    is its runs' together)."""
    parser.add_argument("scenario", help=f"built-in name ({', '.join(builtin_names())}) or a TOML file")
    parser.add_argument("--shaper", choices=shaper_kinds(), default="auto",
                        help="network shaping backend (default: auto = netem where the kernel has it; virtual = "
                             "every agent on simulated time in this process, exact)")
    parser.add_argument("--tokens", type=int, help="tokens to generate (overrides decode.tokens)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key, e.g. --set decode.k=auto --set network.hops_ms=[5,5,5]")
    parser.add_argument("--dilation", type=dilation_arg, default="auto", metavar="D|auto",
                        help="run every delay and compute D times slower, report in the scenario's time (default "
                             "auto: calibrate, then the smallest D that makes the testbed's overhead ~0.3%% of a "
                             "lap, within a run-time budget; 1 = off)")
    add_budget_option(parser, study=study)
    parser.add_argument("--compensate", action="store_true",
                        help="subtract each hop's calibrated base latency from its delay (base-path compensation)")


def add_budget_option(parser: argparse.ArgumentParser, *, study: bool = False) -> None:
    if study:
        parser.add_argument("--budget-s", type=budget_arg, default=STUDY_BUDGET_S, metavar="S",
                            help=f"auto dilation's run-time budget for the whole study: the seconds the dilated decode "
                                 f"of all its runs may take together, an even share a run (default {STUDY_BUDGET_S:g}); "
                                 "where it caps D, the row says so with the error the overhead leaves")
        return
    parser.add_argument("--budget-s", type=budget_arg, default=BUDGET_S, metavar="S",
                        help=f"auto dilation's run-time budget: the seconds a run's dilated decode may take (default "
                             f"{BUDGET_S:g}); where it caps D, the run says so with the error the overhead leaves")


def budget_arg(text: str) -> float:
    try:
        return parse_budget(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--budget-s: ")) from exc


def dilation_of(summary: RunSummary) -> dict[str, Any]:
    """A row's dilation fields from its run: the D it ran at, and where the budget capped D, the error the
    calibrated overhead leaves at it (testbed.core.summary.DilationSummary.expected_error_pct), else None."""
    d = summary.dilation
    capped = d is not None and d.capped and d.expected_error_pct is not None
    return {"dilation": d.factor if d is not None else 1.0,
            "capped_error_pct": d.expected_error_pct if capped else None}


def on_duration(rate_error_pct: float | None) -> float | None:
    """The error an overhead that lowers a rate by `rate_error_pct` leaves on a duration (1 / (1 + e) - 1): a
    capped D's expected error (DilationSummary.expected_error_pct, on the rate) for a row that measures a time."""
    return None if rate_error_pct is None else (100 / (100 + rate_error_pct) - 1) * 100


def dilation_cell(factor: float, capped_error_pct: float | None, duration: bool = False) -> str:
    """The D column: "4", or "2 cap -0.41%" where the budget capped it (the error expected from the overhead, on
    the rate; with `duration`, on the row's time: on_duration)."""
    expected = on_duration(capped_error_pct) if duration else capped_error_pct
    return f"{factor:g}" + (f" cap {expected:+.2f}%" if expected is not None else "")


def add_trace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", metavar="PATH",
                        help="write every lap of every run as a Chrome trace-event timeline (Perfetto, "
                             "chrome://tracing; testbed.launch.trace): a track per stage and per link")


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def log_to(console: Console) -> Callable[[str], None]:
    """A study's progress lines, printed as they are (no markup: they quote scenario names and values)."""
    return lambda message: console.print(message, markup=False, highlight=False)


def print_tables(console: Console, tables: Sequence[Table]) -> None:
    wide = console if console.width >= TABLE_WIDTH else Console(width=TABLE_WIDTH, file=console.file,
                                                                 quiet=console.quiet)
    for table in tables:
        wide.print(table)


def write_json(path: str | Path, text: str, console: Console) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n")
    console.print(f"JSON: {path}")
    return path


def results_path(args: argparse.Namespace, study: str, scenario: str) -> Path:
    """--json, else results/STUDY-SCENARIO.json (a scenario file by its stem)."""
    return Path(getattr(args, "json", None) or f"results/{study}-{Path(scenario).stem}.json")


def make_scenario(name_or_path: str | Scenario, *, tokens: int | None = None, overrides: list[str] | None = None,
             **keys: Any) -> Scenario:
    """A Scenario from a built-in name or TOML path, with `--set`-style overrides and keyword overrides."""
    if isinstance(name_or_path, Scenario):
        if overrides or keys or tokens is not None:
            raise TypeError("overrides apply to a scenario name or path, not to a built Scenario")
        return name_or_path
    items = list(overrides or [])
    items += [f"{key}={_toml(value)}" for key, value in keys.items()]
    if tokens is not None:
        items.append(f"decode.tokens={tokens}")
    return load_scenario(name_or_path, items)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def ensure_models(notify: Callable[[str], None] | None = None) -> dict:
    """Make sure the tiny models exist (trained on first use unless shipped); returns their metadata."""
    from agents.zoo.train import ensure_trained, needs_training

    if notify is not None and needs_training():
        notify("The model recipe differs from the shipped weights: training the tiny models (once)...")
    return ensure_trained()


def ensure_models_on(console: Console) -> dict:
    return ensure_models(lambda message: console.print(f"[bold]{message}"))


def results_of(plot: Callable[[Sequence[Any], Path], None]) -> Callable[[Sequence[Any], Path], None]:
    """A figure drawn from the results of a part's items (each item is a sourced result: `.result`)."""
    return lambda items, path: plot([item.result for item in items], path)
