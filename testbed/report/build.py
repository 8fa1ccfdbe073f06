"""`testbed report`: figures and report.md of measured vs predicted from JSON results, every study's read through
its report part (testbed.studies.STUDIES) and run summaries through the runs section (testbed.report.runs)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from testbed.core.errors import ConfigError
from testbed.report import runs
from testbed.report.figures import plot_spec, plot_wall
from testbed.report.timeline import Timeline, parse_timeline, plot_timeline, timeline_markdown
from testbed.studies import STUDIES
from testbed.studies.base import Figure, ReportPart

DEFAULT_OUT_DIR: Final = "out/report"
REPORT_MD: Final = "report.md"
# The runs section's figures: seed 000's Figure 1 (the wall) and Figure 2 (r_spec vs K).
RUN_FIGURES: Final = (
    Figure("fig1_wall.png", lambda items, path: plot_wall([item.summary for item in items], path)),
    Figure("fig2_spec.png", lambda items, path: plot_spec([item.summary for item in items], path),
           lambda items: any(item.summary.is_speculative for item in items)))
TRACE_KEY: Final = "traceEvents"  # a JSON object with it is a --trace timeline (testbed.launch.trace)
TIMELINE_FIGURE: Final = Figure("timeline.png", plot_timeline)


def report_parts() -> dict[str, ReportPart]:
    """Every study's report part by study name, in the registry's order."""
    return {name: study.report for name, study in STUDIES.items() if study.report is not None}


@dataclass
class Inputs:
    """Everything a report reads, in order: run summaries, and each study's items by study name."""

    runs: list[runs.SourcedSummary] = field(default_factory=list)
    studies: dict[str, list[Any]] = field(default_factory=lambda: {name: [] for name in report_parts()})
    timelines: list[Timeline] = field(default_factory=list)

    def of(self, study: str) -> list[Any]:
        return self.studies[study]

    def __bool__(self) -> bool:
        return bool(self.runs) or any(self.studies.values()) or bool(self.timelines)


def _parse(data: Any, source: str, inputs: Inputs) -> None:
    """One JSON object into `inputs`, told apart by the first report part whose key it has; anything else must be a
    run summary."""
    if isinstance(data, dict) and TRACE_KEY in data:
        inputs.timelines.append(parse_timeline(data, source))
        return
    if isinstance(data, dict):
        for name, part in report_parts().items():
            if part.key in data:
                inputs.of(name).append(part.parse(data, source))
                return
    inputs.runs.append(runs.parse_summary(data, source))


def _json_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if p.is_file())
        if not files:
            raise ConfigError("directory holds no *.json run summaries", source=str(path))
        return files
    if not path.exists():
        raise ConfigError("no such file or directory", source=str(path))
    return [path]


def _read(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", source=str(file)) from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc}", source=str(file)) from exc


def load_inputs(paths: Iterable[str | Path]) -> Inputs:
    """Every run summary and study result in `paths` (files holding one object or a list, e.g. a sweep or a codec
    table, or directories of them)."""
    loaded = Inputs()
    for path in paths:
        for file in _json_files(Path(path)):
            data = _read(file)
            if isinstance(data, list):
                if not data:
                    raise ConfigError("empty list: no run summaries", source=str(file))
                for i, item in enumerate(data):
                    _parse(item, f"{file}[{i}]", loaded)
            else:
                _parse(data, str(file), loaded)
    if not loaded:
        raise ConfigError("no run summaries or results given")
    return loaded


def render_markdown(inputs: Inputs, figures: list[str]) -> str:
    """report.md: the figures, then the runs' sections, then each study's section that has items."""
    parts = report_parts()
    counts = [f"{len(inputs.runs)} run summaries"] + [f"{len(inputs.of(name))} {part.noun}"
                                                      for name, part in parts.items()]
    if inputs.timelines:
        counts.append(f"{len(inputs.timelines)} timelines")
    lines = ["# geo-ring report", "", ", ".join(counts) + ". " + runs.PREAMBLE, "",
             *(f"![{Path(name).stem}]({name})" for name in figures)]
    lines += runs.run_markdown(inputs.runs)
    for name, part in parts.items():
        if inputs.of(name):
            lines += ["", f"## {part.title}", "", *part.markdown(inputs.of(name))]
    if inputs.timelines:
        lines += ["", "## Timeline", "", *timeline_markdown(inputs.timelines)]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_report(inputs: Inputs, out_dir: Path) -> list[Path]:
    """Write the figures and report.md into out_dir; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = [(figure, inputs.runs) for figure in RUN_FIGURES]
    drawn += [(figure, inputs.of(name)) for name, part in report_parts().items() for figure in part.figures]
    drawn.append((TIMELINE_FIGURE, inputs.timelines))
    written: list[Path] = []
    for figure, items in drawn:
        if items and figure.wanted(items):
            written.append(out_dir / figure.name)
            figure.draw(items, written[-1])
    markdown = out_dir / REPORT_MD
    markdown.write_text(render_markdown(inputs, [p.name for p in written]), encoding="utf-8")
    return [*written, markdown]


def build_parser() -> argparse.ArgumentParser:
    parts = report_parts()
    figures = ([figure.name for figure in RUN_FIGURES] + [f.name for part in parts.values() for f in part.figures]
               + [TIMELINE_FIGURE.name])
    parser = argparse.ArgumentParser(
        prog="testbed report",
        description=f"Figures ({', '.join(figures)}) and report.md of measured vs predicted from run summaries and "
                    f"the results of {', '.join(parts)}.")
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="JSON run summaries, study results (--json of " + ", ".join(parts) + "; one object "
                             "or a list per file) or --trace timelines, or directories of *.json")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, metavar="DIR",
                        help=f"output directory (default: {DEFAULT_OUT_DIR})")
    return parser


def main(argv: list[str]) -> int:
    """`testbed report RESULTS... [--out DIR]`: 0 on success, 2 on bad input (the message names file and key).

        python -m testbed report results/ more.json --out out/report

    A JSON object is a study's when it has that study's report key (regimes "rows", place "placements", tp
    "tp_rows", tree "tree_rows", codecs "greedy_agreement", dsd "dsd_rows", faults "fault_rows", bench "relay"),
    else a run summary. "Predicted" is each run's own.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage; hand its status back instead of exiting
        return int(exc.code or 0)
    try:
        inputs = load_inputs(args.results)
    except ConfigError as exc:
        print(f"testbed report: error: {exc}", file=sys.stderr)
        return 2
    try:
        written = write_report(inputs, Path(args.out))
    except OSError as exc:
        print(f"testbed report: error: cannot write into {args.out}: {exc}", file=sys.stderr)
        return 1
    print(*written, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
