"""`testbed report`: figures and markdown tables of measured vs predicted from JSON run summaries, regime maps,
placement searches, PP-vs-TP sweeps, tree sweeps, codec tables and DSD results."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.core.decode import BATCHING
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary, SpecSummary
from testbed.dsd_figures import SourcedDsd, dsd_markdown, parse_dsd, plot_dsd
from testbed.figures import plot_spec, plot_streams, plot_ttft, plot_wall
from testbed.placement_figures import (SourcedPlace, SourcedTp, parse_place, parse_tp, placement_markdown,
                                       plot_placement, plot_tp)
from testbed.regimes import KINDS, RegimeRow, RegimesResult
from testbed.tree_figures import SourcedCodec, SourcedTree, parse_codec, parse_tree, plot_tree, tree_markdown

DEFAULT_OUT_DIR: Final = "out/report"
WALL_FIGURE: Final = "fig1_wall.png"
SPEC_FIGURE: Final = "fig2_spec.png"
STREAMS_FIGURE: Final = "fig3_streams.png"
TTFT_FIGURE: Final = "fig4_ttft.png"
PLACEMENT_FIGURE: Final = "fig5_placement.png"
TP_FIGURE: Final = "fig6_tp.png"
TREE_FIGURE: Final = "fig7_tree.png"
DSD_FIGURE: Final = "fig8_dsd.png"
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
# What each regime's rows must carry besides measured and predicted (the figures read them).
REGIME_ROW_FIGURES: Final[dict[str, tuple[str, ...]]] = {
    "ttft": ("prompt_tokens", "rate_mbit"), "decode": (), "speculative": (),
    "streams": ("streams", "per_stream_tok_s", "per_stream_predicted_tok_s", "per_stream_min_tok_s", "ceiling_tok_s")}


@dataclass(frozen=True)
class SourcedSummary:
    """One run summary and where it came from ("file.json", or "file.json[2]" inside a list)."""

    source: str
    summary: RunSummary


@dataclass(frozen=True)
class SourcedRegimes:
    """One regime map (`testbed regimes` JSON) and where it came from."""

    source: str
    result: RegimesResult


@dataclass(frozen=True)
class Inputs:
    """Everything a report reads, in order: runs, regimes, placements, PP-vs-TP, tree sweeps, codecs, DSD results."""

    runs: list[SourcedSummary]
    regimes: list[SourcedRegimes]
    placements: list[SourcedPlace]
    tp: list[SourcedTp]
    trees: list[SourcedTree]
    codecs: list[SourcedCodec]
    dsds: list[SourcedDsd]


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


def check_regime_row(row: RegimeRow, source: str, where: str) -> None:
    """A row's regime is known and the numbers its figures read are present; errors name the row's field."""
    if row.regime not in KINDS:
        raise ConfigError(f"expected one of {', '.join(KINDS)}, got {row.regime!r}", source=source,
                          key=f"{where}.regime")
    _check_number(row.measured, 0.0, source, f"{where}.measured")
    _check_number(row.predicted, 0.0, source, f"{where}.predicted")
    _check_number(row.error_pct, None, source, f"{where}.error_pct")
    for key in REGIME_ROW_FIGURES[row.regime]:
        _check_number(getattr(row, key), 0.0, source, f"{where}.{key}")
    if row.regime == "streams" and row.batching not in BATCHING:
        raise ConfigError(f"expected one of {', '.join(BATCHING)}, got {row.batching!r}", source=source,
                          key=f"{where}.batching")


def parse_regimes(data: dict, source: str) -> SourcedRegimes:
    """A `testbed regimes` JSON object -> a checked RegimesResult; field errors become ConfigError."""
    try:
        result = RegimesResult.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a regimes result: {exc}", source=source) from exc
    if not result.rows:
        raise ConfigError("expected at least one row", source=source, key="rows")
    for i, row in enumerate(result.rows):
        check_regime_row(row, source, f"rows[{i}]")
    return SourcedRegimes(source, result)


# (the key that tells a JSON object apart, the Inputs list it joins, its parser), the first key found winning.
PARSERS: Final = (("rows", "regimes", parse_regimes), ("placements", "placements", parse_place),
                  ("tp_rows", "tp", parse_tp), ("tree_rows", "trees", parse_tree),
                  ("greedy_agreement", "codecs", parse_codec), ("dsd_rows", "dsds", parse_dsd))


def _parse(data: Any, source: str, inputs: Inputs) -> None:
    """One JSON object into `inputs`, told apart by PARSERS' keys; anything else must be a run summary."""
    kind, parse = next(((kind, parse) for key, kind, parse in PARSERS if isinstance(data, dict) and key in data),
                       ("runs", parse_summary))
    getattr(inputs, kind).append(parse(data, source))


def _json_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if p.is_file())
        if not files:
            raise ConfigError("directory holds no *.json run summaries", source=str(path))
        return files
    if not path.exists():
        raise ConfigError("no such file or directory", source=str(path))
    return [path]


def load_inputs(paths: Iterable[str | Path]) -> Inputs:
    """Every run summary, regime map, placement search, PP-vs-TP sweep, tree sweep, codec row and DSD result in
    `paths` (files holding one object or a list, e.g. a sweep or a codec table, or directories of them)."""
    loaded = Inputs([], [], [], [], [], [], [])
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
                for i, item in enumerate(data):
                    _parse(item, f"{file}[{i}]", loaded)
            else:
                _parse(data, str(file), loaded)
    if not any(vars(loaded).values()):
        raise ConfigError("no run summaries or results given")
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


def _regime_rows(maps: Sequence[SourcedRegimes]) -> list[str]:
    lines = []
    for item in maps:
        r = item.result
        lines += [
            f"{item.source}: {r.scenario}, {r.stages} stages, C {r.compute_s * 1e3:.1f} ms, "
            f"T_ring {r.t_ring_s * 1e3:.1f} ms, shaper {r.shaper or DASH}.",
            "",
            "| source | regime | point | unit | measured | predicted | error (%) |",
            "|---|---|---|---|---:|---:|---:|",
        ]
        for row in r.rows:
            unit, scale = ("ms", 1e3) if row.unit == "s" else (row.unit, 1.0)
            lines.append(f"| {item.source} | {row.regime} | {row.label} | {unit} | {row.measured * scale:.2f} | "
                         f"{row.predicted * scale:.2f} | {row.error_pct:+.1f} |")
        lines.append("")
    return lines


def render_markdown(inputs: Inputs, figures: Sequence[str]) -> str:
    """report.md: the figures, then measured vs predicted per run, per speculative run, per K of a sweep, every
    point of every regime map, every placement, PP-vs-TP and tree-sweep point, every codec row and DSD table."""
    runs = inputs.runs
    lines = [
        "# geo-ring report", "",
        f"{len(runs)} run summaries, {len(inputs.regimes)} regime maps, {len(inputs.placements)} placement "
        f"searches, {len(inputs.tp)} PP-vs-TP sweeps, {len(inputs.trees)} tree sweeps, {len(inputs.codecs)} "
        f"codec rows, {len(inputs.dsds)} DSD results. Predicted = each run's own prediction: r = 1/(C + T_ring) "
        "with the configured T_ring and the measured C; for speculation r_spec = Γ / (K c_d + C + T_ring) with the "
        "measured Γ and draft time (Γ predicted = Γ(α̂, K) from the measured acceptance α̂); for M streams "
        "physics.streams_rates; for TTFT C_prefill + T_ring + the prompt's serialization. Error = (measured - "
        "predicted) / predicted.",
        "",
        *(f"![{Path(name).stem}]({name})" for name in figures),
    ]
    if runs:
        lines += ["", "## Measured vs predicted", "", *_run_rows(runs)]
    spec_runs = [run for run in runs if run.summary.spec is not None]
    if spec_runs:
        lines += ["", "## Speculation", "", *_spec_rows(spec_runs)]
    sweeps = [run for run in spec_runs if run.summary.spec.per_k]
    if sweeps:
        lines += ["", "## K sweeps", "", *_per_k_rows(sweeps)]
    if inputs.regimes:
        lines += ["", "## Regimes", "", *_regime_rows(inputs.regimes)]
    if inputs.placements or inputs.tp:
        lines += ["", "## Placement", "", *placement_markdown(inputs.placements, inputs.tp)]
    lines += tree_markdown(inputs.trees, inputs.codecs) + dsd_markdown(inputs.dsds)
    return "\n".join(lines).rstrip("\n") + "\n"


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="testbed report",
        description="Figures (fig1_wall.png .. fig8_dsd.png) and report.md of measured vs predicted from run "
                    "summaries, regime maps, placement searches, PP-vs-TP and tree sweeps, codec tables, DSD results.")
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="JSON run summaries or `testbed regimes`, `place`, `tp`, `sweep --tree-n`, `codecs` "
                             "or `dsd` --json results (one object or a list per file) or directories of *.json")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, metavar="DIR",
                        help=f"output directory (default: {DEFAULT_OUT_DIR})")
    return parser


def write_report(inputs: Inputs, out_dir: Path) -> list[Path]:
    """Write the figures and report.md into out_dir; returns the paths written."""
    summaries = [run.summary for run in inputs.runs]
    results = [item.result for item in inputs.regimes]
    rows = [row for result in results for row in result.rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    plans = ((WALL_FIGURE, plot_wall, summaries, bool(summaries)),
             (SPEC_FIGURE, plot_spec, summaries, any(s.is_speculative for s in summaries)),
             (STREAMS_FIGURE, plot_streams, results, any(row.regime == "streams" for row in rows)),
             (TTFT_FIGURE, plot_ttft, results, any(row.regime == "ttft" for row in rows)),
             (PLACEMENT_FIGURE, plot_placement, [item.result for item in inputs.placements], bool(inputs.placements)),
             (TP_FIGURE, plot_tp, [item.result for item in inputs.tp], bool(inputs.tp)),
             (TREE_FIGURE, plot_tree, [item.result for item in inputs.trees], bool(inputs.trees)),
             (DSD_FIGURE, plot_dsd, [item.result for item in inputs.dsds], bool(inputs.dsds)))
    written: list[Path] = []
    for name, plot, data, needed in plans:
        if needed:
            written.append(out_dir / name)
            plot(data, written[-1])
    markdown = out_dir / REPORT_MD
    markdown.write_text(render_markdown(inputs, [p.name for p in written]), encoding="utf-8")
    return [*written, markdown]


def main(argv: list[str]) -> int:
    """`testbed report RESULTS... [--out DIR]`: 0 on success, 2 on bad input (the message names file and key).

        python -m testbed report results/ more.json --out out/report

    writes `report.md` and, from run summaries, `fig1_wall.png` (seed 000 Figure 1, the runs on it) and
    `fig2_spec.png` (r_spec vs K per alpha, Figure 2, for speculative runs); from a regime map ("rows")
    `fig3_streams.png` (rate vs M per batching) and `fig4_ttft.png` (TTFT vs prompt tokens per link rate); from
    `place --json` ("placements") `fig5_placement.png`; from `tp --json` ("tp_rows") `fig6_tp.png` (per-token
    latency vs link latency, Eq. 8's bound); from `sweep --tree-n --json` ("tree_rows") `fig7_tree.png` (L(n), its
    fit, tok/s vs n, W*); `codecs --json` rows ("greedy_agreement") are tabled; from `dsd --json` ("dsd_rows")
    `fig8_dsd.png` (request latency vs edge RTT, capacity vs clients). "Predicted" is each run's own.
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
