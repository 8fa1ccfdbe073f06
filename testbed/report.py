"""`testbed report`: figures and a markdown table of measured vs predicted from JSON run summaries."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary, SpecSummary
from testbed.figures import plot_spec, plot_wall

DEFAULT_OUT_DIR: Final = "out/report"
WALL_FIGURE: Final = "fig1_wall.png"
SPEC_FIGURE: Final = "fig2_spec.png"
REPORT_MD: Final = "report.md"
DASH: Final = "–"

# The figures each report reads: a run that lacks one (e.g. no decode lap finished) cannot be reported.
# (name, read it from the summary, minimum); None as the minimum means any finite number.
REQUIRED_FIGURES: Final[tuple[tuple[str, Callable[[RunSummary], Any], float | None], ...]] = (
    ("t_ring_s", lambda s: s.t_ring_s, 0.0),
    ("compute_s", lambda s: s.compute_s, 0.0),
    ("measured_tok_s", lambda s: s.measured_tok_s, 0.0),
    ("predicted_tok_s", lambda s: s.predicted_tok_s, 0.0),
)
OPTIONAL_FIGURES: Final[tuple[tuple[str, Callable[[RunSummary], Any], float | None], ...]] = (
    ("error_pct", lambda s: s.error_pct, None),
    ("overhead_ms_per_hop", lambda s: s.overhead_ms_per_hop, None),
)
SPEC_FIGURES: Final[tuple[tuple[str, Callable[[SpecSummary], Any], float | None], ...]] = (
    ("k", lambda spec: spec.k, 1.0),
    ("alpha", lambda spec: spec.alpha, 0.0),
    ("draft_per_token_s", lambda spec: spec.draft_per_token_s, 0.0),
    ("verify_compute_s", lambda spec: spec.verify_compute_s, 0.0),
    ("gamma_measured", lambda spec: spec.gamma_measured, 0.0),
    ("gamma_predicted", lambda spec: spec.gamma_predicted, 0.0),
    ("predicted_tok_s", lambda spec: spec.predicted_tok_s, 0.0),
    ("plain_predicted_tok_s", lambda spec: spec.plain_predicted_tok_s, 0.0),
    ("k_star", lambda spec: spec.k_star, 1.0),
    ("k_star_tok_s", lambda spec: spec.k_star_tok_s, 0.0),
)


@dataclass(frozen=True)
class SourcedSummary:
    """One run summary and where it came from ("file.json", or "file.json[2]" inside a list)."""

    source: str
    summary: RunSummary


# ---------------------------------------------------------------- loading and validation


def _check_number(value: Any, minimum: float | None, source: str, key: str, *, required: bool = True) -> None:
    if value is None:
        if required:
            raise ConfigError("expected a number, got null (no decode lap measured it)", source=source, key=key)
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"expected a finite number, got {value!r}", source=source, key=key)
    if minimum is not None and value < minimum:
        raise ConfigError(f"expected a number >= {minimum:g}, got {value!r}", source=source, key=key)


def check_reportable(summary: RunSummary, source: str) -> None:
    """The figures a report reads are present and numbers; errors name the source and the key."""
    if not isinstance(summary.scenario, str) or not summary.scenario:
        raise ConfigError(f"expected a non-empty string, got {summary.scenario!r}", source=source, key="scenario")
    for key, read, minimum in REQUIRED_FIGURES:
        _check_number(read(summary), minimum, source, key)
    for key, read, minimum in OPTIONAL_FIGURES:
        _check_number(read(summary), minimum, source, key, required=False)
    if summary.compute_s + summary.t_ring_s <= 0:
        raise ConfigError("compute_s + t_ring_s must be positive", source=source, key="compute_s")
    if summary.is_speculative and summary.spec is None:
        raise ConfigError("mode is 'speculative' but there is no spec object", source=source, key="spec")
    if summary.spec is not None:
        for key, read, minimum in SPEC_FIGURES:
            _check_number(read(summary.spec), minimum, source, f"spec.{key}")
        if summary.spec.alpha > 1.0:
            raise ConfigError(f"expected a number <= 1, got {summary.spec.alpha!r}", source=source, key="spec.alpha")


def parse_summary(data: Any, source: str) -> SourcedSummary:
    """One JSON object -> a checked RunSummary; RunSummary's unknown/missing-field errors become ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object (a run summary), got {type(data).__name__}", source=source)
    try:
        summary = RunSummary.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a run summary: {exc}", source=source) from exc
    check_reportable(summary, source)
    return SourcedSummary(source, summary)


def _json_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if p.is_file())
        if not files:
            raise ConfigError("directory holds no *.json run summaries", source=str(path))
        return files
    if not path.exists():
        raise ConfigError("no such file or directory", source=str(path))
    return [path]


def load_summaries(paths: Iterable[str | Path]) -> list[SourcedSummary]:
    """Every run summary in `paths` (files holding one summary or a list of them, e.g. a sweep, or directories)."""
    loaded: list[SourcedSummary] = []
    for path in paths:
        for file in _json_files(Path(path)):
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read: {exc}", source=str(file)) from exc
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not JSON: {exc}", source=str(file)) from exc
            if isinstance(data, list):
                if not data:
                    raise ConfigError("empty list: no run summaries", source=str(file))
                loaded += [parse_summary(item, f"{file}[{i}]") for i, item in enumerate(data)]
            else:
                loaded.append(parse_summary(data, str(file)))
    if not loaded:
        raise ConfigError("no run summaries given")
    return loaded


# ---------------------------------------------------------------- markdown


def _cell(value: float | None, spec: str) -> str:
    return DASH if value is None else format(value, spec)


def _run_rows(runs: Sequence[SourcedSummary]) -> list[str]:
    lines = [
        "| source | scenario | mode | shaper | T_ring (ms) | C (ms) | laps | measured (tok/s) | predicted (tok/s) "
        "| error (%) | overhead (ms/hop) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run.summary
        lines.append(
            f"| {run.source} | {s.scenario} | {s.mode} | {s.shaper or DASH} | {s.t_ring_s * 1e3:.1f} | "
            f"{s.compute_s * 1e3:.1f} | {s.laps} | {s.measured_tok_s:.2f} | {s.predicted_tok_s:.2f} | "
            f"{_cell(s.error_pct, '+.1f')} | {_cell(s.overhead_ms_per_hop, '.2f')} |")
    return lines


def _spec_rows(runs: Sequence[SourcedSummary]) -> list[str]:
    lines = [
        "| source | T_ring (ms) | C (ms) | K | α | c_d (ms) | Γ measured | Γ predicted | r_spec measured "
        "| r_spec predicted | error (%) | wall 1/(C+T_ring) | K* | r_spec(K*) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s, spec = run.summary, run.summary.spec
        measured = s.measured_tok_s if s.is_speculative else None
        error = s.error_pct if s.is_speculative else None
        lines.append(
            f"| {run.source} | {s.t_ring_s * 1e3:.1f} | {spec.verify_compute_s * 1e3:.1f} | {spec.k:g} | "
            f"{spec.alpha:.2f} | {spec.draft_per_token_s * 1e3:.2f} | {spec.gamma_measured:.2f} | "
            f"{spec.gamma_predicted:.2f} | {_cell(measured, '.2f')} | {spec.predicted_tok_s:.2f} | "
            f"{_cell(error, '+.1f')} | {spec.plain_predicted_tok_s:.2f} | {spec.k_star} | {spec.k_star_tok_s:.2f} |")
    return lines


def _per_k_rows(runs: Sequence[SourcedSummary]) -> list[str]:
    lines = [
        "| source | K | rounds | Γ measured | Γ(α̂, K) | r_spec measured | r_spec predicted | error (%) "
        "| formula Γ(α̂, K)/(K c_d + C + T_ring) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for row in run.summary.spec.per_k:
            error = 100.0 * (row.measured_tok_s / row.predicted_tok_s - 1) if row.predicted_tok_s else None
            lines.append(
                f"| {run.source} | {row.k} | {row.rounds} | {row.gamma_measured:.2f} | {row.gamma_predicted:.2f} | "
                f"{row.measured_tok_s:.2f} | {row.predicted_tok_s:.2f} | {_cell(error, '+.1f')} | "
                f"{row.formula_tok_s:.2f} |")
    lines.append("")
    lines += [f"- {run.source}: K* measured = {_cell(run.summary.spec.k_star_measured, 'd')}, "
              f"K* predicted = {_cell(run.summary.spec.k_star_predicted, 'd')}" for run in runs]
    return lines


def render_markdown(runs: Sequence[SourcedSummary], figures: Sequence[str]) -> str:
    """report.md: the figures, then measured vs predicted per run, per speculative run, per K of a sweep."""
    lines = [
        "# geo-ring report",
        "",
        f"{len(runs)} run summaries. Predicted = each run's own prediction: r = 1/(C + T_ring) with the configured "
        "T_ring and the measured C; for speculation r_spec = Γ / (K c_d + C + T_ring) with the measured Γ and "
        "draft time (Γ predicted = Γ(α̂, K) from the measured acceptance α̂). "
        "Error = (measured - predicted) / predicted.",
        "",
        *(f"![{Path(name).stem}]({name})" for name in figures),
        "",
        "## Measured vs predicted",
        "",
        *_run_rows(runs),
    ]
    spec_runs = [run for run in runs if run.summary.spec is not None]
    if spec_runs:
        lines += ["", "## Speculation", "", *_spec_rows(spec_runs)]
    sweeps = [run for run in spec_runs if run.summary.spec.per_k]
    if sweeps:
        lines += ["", "## K sweeps", "", *_per_k_rows(sweeps)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="testbed report",
        description="Figures (fig1_wall.png, fig2_spec.png) and report.md of measured vs predicted from run summaries.")
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="JSON run summaries (one object or a list per file) or directories of *.json")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, metavar="DIR",
                        help=f"output directory (default: {DEFAULT_OUT_DIR})")
    return parser


def write_report(runs: Sequence[SourcedSummary], out_dir: Path) -> list[Path]:
    """Write the figures and report.md into out_dir; returns the paths written."""
    summaries = [run.summary for run in runs]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / WALL_FIGURE]
    plot_wall(summaries, written[0])
    if any(s.is_speculative for s in summaries):
        written.append(out_dir / SPEC_FIGURE)
        plot_spec(summaries, written[-1])
    markdown = out_dir / REPORT_MD
    markdown.write_text(render_markdown(runs, [p.name for p in written]), encoding="utf-8")
    return [*written, markdown]


def main(argv: list[str]) -> int:
    """`testbed report RESULTS... [--out DIR]`: 0 on success, 2 on bad input (the message names file and key).

        python -m testbed report results/ more.json --out out/report

    writes `fig1_wall.png` (the wall, seed 000 Figure 1, with the measured points), `fig2_spec.png` (r_spec
    vs K per alpha, seed 000 Figure 2, only when speculative runs are present) and `report.md`. Every
    "predicted" figure is the run's own, as its summarizer wrote it into the RunSummary.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage; hand its status back instead of exiting
        return int(exc.code or 0)
    try:
        runs = load_summaries(args.results)
    except ConfigError as exc:
        print(f"testbed report: error: {exc}", file=sys.stderr)
        return 2
    try:
        written = write_report(runs, Path(args.out))
    except OSError as exc:
        print(f"testbed report: error: cannot write into {args.out}: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
