"""`testbed report`: figures and a markdown table of measured vs predicted from JSON run summaries.

    python -m testbed report results/ more.json --out out/report

writes `fig1_wall.png` (the wall, seed 000 Figure 1, with the measured points), `fig2_spec.png` (r_spec vs
K per alpha, seed 000 Figure 2, only when speculative runs are present) and `report.md`.

"Predicted" is the closed form evaluated with the configured T_ring and the measured C (and the measured
acceptance alpha and draft time for speculation), as everywhere in the testbed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.core.errors import ConfigError
from testbed.core.physics import best_k, gamma, spec_rate, wall_rate

DEFAULT_OUT_DIR: Final = "out/report"
WALL_FIGURE: Final = "fig1_wall.png"
SPEC_FIGURE: Final = "fig2_spec.png"
REPORT_MD: Final = "report.md"
FIGURE_DPI: Final = 120

REQUIRED_KEYS: Final = ("scenario", "t_ring_s", "compute_s", "measured_tok_s", "predicted_tok_s")
SPEC_REQUIRED_KEYS: Final = ("k", "alpha", "draft_s")

# Runs whose C differ by less than this (relative) share one predicted wall curve.
COMPUTE_GROUP_REL_TOL: Final = 0.15
# Speculative runs are grouped per alpha in bins of this width (the paper's curves are 0.6, 0.7, ...).
ALPHA_BIN: Final = 0.05

# Seed 000's stated parameters: Figure 1 ceilings, and Figure 2's 280 ms ring.
PAPER_R0_TOK_S: Final = (30.0, 120.0)
PAPER_COMPUTE_S: Final = 0.033
PAPER_DRAFT_PER_TOKEN_S: Final = 0.005
PAPER_T_RING_S: Final = 0.280
PAPER_ALPHAS: Final = (0.6, 0.7, 0.8, 0.9)
PAPER_T_MIN_MS: Final = 0.1
PAPER_T_MAX_MS: Final = 600.0


@dataclass(frozen=True)
class SpecResult:
    """The speculation part of one run summary."""

    k: int
    alpha: float
    draft_s: float  # per round: K draft steps
    gamma_measured: float | None
    gamma_predicted: float
    predicted_tok_s: float

    @property
    def draft_per_token_s(self) -> float:
        return self.draft_s / self.k


@dataclass(frozen=True)
class RunResult:
    """One validated run summary (one phase of a run)."""

    source: str
    scenario: str
    mode: str
    shaper: str | None
    t_ring_s: float
    compute_s: float
    measured_tok_s: float
    predicted_tok_s: float  # the closed form this run is judged against (r_spec for speculation)
    laps: int | None
    overhead_ms_per_hop: float | None
    spec: SpecResult | None

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.measured_tok_s - self.predicted_tok_s) / self.predicted_tok_s

    @property
    def wall_tok_s(self) -> float:
        return wall_rate(self.compute_s, self.t_ring_s)


# ---------------------------------------------------------------- loading and validation


def _number(obj: Mapping[str, Any], key: str, source: str, prefix: str = "", *, required: bool = True,
            minimum: float | None = None, maximum: float | None = None) -> float | None:
    name = prefix + key
    if key not in obj or obj[key] is None:
        if required:
            raise ConfigError("missing key (expected a number)", source=source, key=name)
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"expected a finite number, got {value!r}", source=source, key=name)
    if minimum is not None and value < minimum:
        raise ConfigError(f"expected a number >= {minimum:g}, got {value!r}", source=source, key=name)
    if maximum is not None and value > maximum:
        raise ConfigError(f"expected a number <= {maximum:g}, got {value!r}", source=source, key=name)
    return float(value)


def parse_summary(summary: Any, source: str) -> RunResult:
    """Validate one summary dict; errors name the source and the key."""
    if not isinstance(summary, Mapping):
        raise ConfigError(f"expected a JSON object (a run summary), got {type(summary).__name__}", source=source)
    for key in REQUIRED_KEYS:
        if key not in summary or summary[key] is None:
            raise ConfigError("missing key", source=source, key=key)
    scenario = summary["scenario"]
    if not isinstance(scenario, str) or not scenario:
        raise ConfigError(f"expected a non-empty string, got {scenario!r}", source=source, key="scenario")
    t_ring_s = _number(summary, "t_ring_s", source, minimum=0.0)
    compute_s = _number(summary, "compute_s", source, minimum=0.0)
    if t_ring_s + compute_s <= 0:
        raise ConfigError("compute_s + t_ring_s must be positive", source=source, key="compute_s")
    measured = _number(summary, "measured_tok_s", source, minimum=0.0)
    predicted = _number(summary, "predicted_tok_s", source, minimum=0.0)
    laps = _number(summary, "laps", source, required=False, minimum=0.0)
    overhead = _number(summary, "overhead_ms_per_hop", source, required=False)

    raw_spec = summary.get("spec")
    mode = summary.get("mode") or ("speculative" if raw_spec else "plain")
    if mode not in ("plain", "speculative"):
        raise ConfigError(f"expected 'plain' or 'speculative', got {mode!r}", source=source, key="mode")
    spec = None
    if raw_spec is not None:
        if not isinstance(raw_spec, Mapping):
            raise ConfigError(f"expected an object or null, got {raw_spec!r}", source=source, key="spec")
        for key in SPEC_REQUIRED_KEYS:
            if key not in raw_spec or raw_spec[key] is None:
                raise ConfigError("missing key", source=source, key=f"spec.{key}")
        k = _number(raw_spec, "k", source, "spec.", minimum=1)
        if k != int(k):  # K varied during the run (decode.k = "auto"): the summary holds its mean
            k = round(k)
        alpha = _number(raw_spec, "alpha", source, "spec.", minimum=0.0, maximum=1.0)
        draft_s = _number(raw_spec, "draft_s", source, "spec.", minimum=0.0)
        k = int(k)
        gamma_predicted = _number(raw_spec, "gamma_predicted", source, "spec.", required=False, minimum=0.0)
        spec_predicted = _number(raw_spec, "predicted_tok_s", source, "spec.", required=False, minimum=0.0)
        spec = SpecResult(
            k=k, alpha=alpha, draft_s=draft_s,
            gamma_measured=_number(raw_spec, "gamma_measured", source, "spec.", required=False, minimum=0.0),
            gamma_predicted=gamma_predicted if gamma_predicted is not None else gamma(alpha, k),
            predicted_tok_s=spec_predicted if spec_predicted is not None
            else spec_rate(alpha, k, draft_s / k, compute_s, t_ring_s),
        )
    elif mode == "speculative":
        raise ConfigError("mode is 'speculative' but there is no spec object", source=source, key="spec")
    if mode == "speculative":
        predicted = spec.predicted_tok_s
    if predicted <= 0:
        raise ConfigError("predicted rate must be positive", source=source, key="predicted_tok_s")
    shaper = summary.get("shaper")
    return RunResult(
        source=source, scenario=scenario, mode=mode, shaper=str(shaper) if shaper else None,
        t_ring_s=t_ring_s, compute_s=compute_s, measured_tok_s=measured, predicted_tok_s=predicted,
        laps=int(laps) if laps is not None else None, overhead_ms_per_hop=overhead, spec=spec,
    )


def _json_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if p.is_file())
        if not files:
            raise ConfigError("directory holds no *.json run summaries", source=str(path))
        return files
    if not path.exists():
        raise ConfigError("no such file or directory", source=str(path))
    return [path]


def load_results(paths: Iterable[str | Path]) -> list[RunResult]:
    """Every run summary in `paths` (files holding one summary or a list of them, or directories of *.json)."""
    results: list[RunResult] = []
    for path in paths:
        for file in _json_files(Path(path)):
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read: {exc}", source=str(file)) from exc
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not JSON: {exc}", source=str(file)) from exc
            if isinstance(data, list):
                if not data:
                    raise ConfigError("empty list: no run summaries", source=str(file))
                results += [parse_summary(item, f"{file}[{i}]") for i, item in enumerate(data)]
            else:
                results.append(parse_summary(data, str(file)))
    if not results:
        raise ConfigError("no run summaries given")
    return results


# ---------------------------------------------------------------- grouping


def group_by_compute(results: Sequence[RunResult], rel_tol: float = COMPUTE_GROUP_REL_TOL) -> list[list[RunResult]]:
    """Runs clustered by C (sorted; a new group starts when C exceeds the group's first by rel_tol)."""
    groups: list[list[RunResult]] = []
    for result in sorted(results, key=lambda r: r.compute_s):
        if groups and result.compute_s <= groups[-1][0].compute_s * (1.0 + rel_tol) + 1e-6:
            groups[-1].append(result)
        else:
            groups.append([result])
    return groups


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def group_spec_runs(results: Sequence[RunResult]) -> list[list[RunResult]]:
    """Speculative runs per (alpha bin, T_ring to 0.1 ms, C group): one predicted r_spec(K) curve each."""
    spec_runs = [r for r in results if r.mode == "speculative" and r.spec is not None]
    groups: list[list[RunResult]] = []
    for compute_group in group_by_compute(spec_runs):
        keyed: dict[tuple[int, float], list[RunResult]] = {}
        for run in compute_group:
            key = (round(run.spec.alpha / ALPHA_BIN), round(run.t_ring_s * 1e3, 1))
            keyed.setdefault(key, []).append(run)
        groups += [sorted(keyed[key], key=lambda r: r.spec.k) for key in sorted(keyed)]
    return groups


# ---------------------------------------------------------------- figures


def _new_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.6), layout="constrained")
    FigureCanvasAgg(figure)  # Agg without touching pyplot's global backend
    return figure


def _log_grid(low: float, high: float, n: int = 300) -> list[float]:
    a, b = math.log10(low), math.log10(high)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def plot_wall(results: Sequence[RunResult], path: Path) -> None:
    """Figure 1: measured rate vs T_ring over 1/(C + T_ring) per measured C, with the paper's two ceilings."""
    figure = _new_figure()
    axes = figure.add_subplot()
    t_values_ms = [r.t_ring_s * 1e3 for r in results if r.t_ring_s > 0]
    t_min_ms = min([PAPER_T_MIN_MS] + [t / 2 for t in t_values_ms])
    t_max_ms = max([PAPER_T_MAX_MS] + [t * 2 for t in t_values_ms])
    grid_ms = _log_grid(t_min_ms, t_max_ms)

    for r0, style in zip(PAPER_R0_TOK_S, ("--", ":"), strict=True):
        axes.plot(grid_ms, [wall_rate(1.0 / r0, t / 1e3) for t in grid_ms], style, color="0.55", linewidth=1.2,
                  label=f"paper, r0 = {r0:g} tok/s (C = {1e3 / r0:.1f} ms)")

    colours = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
    y_top = max(PAPER_R0_TOK_S) * 1.05
    for index, group in enumerate(group_by_compute(results)):
        colour = colours[index % len(colours)]
        compute_s = _mean(r.compute_s for r in group)
        axes.plot(grid_ms, [wall_rate(compute_s, t / 1e3) for t in grid_ms], "-", color=colour, linewidth=2,
                  label=f"predicted 1/(C + T_ring), C = {compute_s * 1e3:.1f} ms")
        y_top = max(y_top, wall_rate(compute_s, t_min_ms / 1e3) * 1.05)
        for mode, marker, fill in (("plain", "o", colour), ("speculative", "^", "none")):
            runs = [r for r in group if r.mode == mode]
            if not runs:
                continue
            label = (f"measured, C = {compute_s * 1e3:.1f} ms" if mode == "plain"
                     else f"measured speculative (off the wall), C = {compute_s * 1e3:.1f} ms")
            axes.plot([max(r.t_ring_s * 1e3, t_min_ms) for r in runs], [r.measured_tok_s for r in runs], marker,
                      color=colour, markerfacecolor=fill, markersize=8, markeredgewidth=1.5, linestyle="none",
                      label=label, zorder=5)
            y_top = max(y_top, max(r.measured_tok_s for r in runs) * 1.1)

    from matplotlib.ticker import FuncFormatter

    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axes.set_xlim(t_min_ms, t_max_ms)
    axes.set_ylim(0, y_top)
    axes.set_xlabel("ring latency T_ring (ms, log scale)")
    axes.set_ylabel("single-stream decode (tok/s)")
    axes.set_title("The wall: r = 1/(C + T_ring), measured vs predicted")
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(loc="upper right", fontsize="small")
    if any(r.t_ring_s == 0 for r in results):
        axes.annotate("T_ring = 0 runs drawn at the left edge", xy=(0.01, 0.01), xycoords="axes fraction",
                      fontsize="x-small", color="0.4")
    figure.savefig(path, dpi=FIGURE_DPI)


def plot_spec(results: Sequence[RunResult], path: Path) -> None:
    """Figure 2: measured r_spec vs K per alpha over Gamma(a, K) / (K c_d + C + T_ring)."""
    groups = group_spec_runs(results)
    figure = _new_figure()
    axes = figure.add_subplot()
    k_max = max(24, max(r.spec.k for g in groups for r in g) + 4)
    ks = list(range(1, k_max + 1))

    if any(abs(r.t_ring_s - PAPER_T_RING_S) <= 0.1 * PAPER_T_RING_S for g in groups for r in g):
        for alpha in PAPER_ALPHAS:
            axes.plot(ks, [spec_rate(alpha, k, PAPER_DRAFT_PER_TOKEN_S, PAPER_COMPUTE_S, PAPER_T_RING_S) for k in ks],
                      ":", color="0.6", linewidth=1)
        axes.plot([], [], ":", color="0.6", label="paper, α = 0.6..0.9 (280 ms, C 33 ms, c_d 5 ms)")

    colours = ["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:cyan"]
    baselines: set[tuple[float, float]] = set()
    y_top = 0.0
    for index, group in enumerate(groups):
        colour = colours[index % len(colours)]
        alpha = _mean(r.spec.alpha for r in group)
        compute_s = _mean(r.compute_s for r in group)
        t_ring_s = _mean(r.t_ring_s for r in group)
        draft_per_token_s = _mean(r.spec.draft_per_token_s for r in group)
        curve = [spec_rate(alpha, k, draft_per_token_s, compute_s, t_ring_s) for k in ks]
        k_star, r_star = best_k(alpha, draft_per_token_s, compute_s, t_ring_s, k_max=k_max)
        axes.plot(ks, curve, "-", color=colour, linewidth=2,
                  label=f"predicted α = {alpha:.2f} (T_ring {t_ring_s * 1e3:.0f} ms, C {compute_s * 1e3:.1f} ms, "
                        f"c_d {draft_per_token_s * 1e3:.1f} ms), K* = {k_star}")
        axes.plot([k_star], [r_star], "x", color=colour, markersize=8)
        axes.plot([r.spec.k for r in group], [r.measured_tok_s for r in group], "o", color=colour, markersize=8,
                  linestyle="none", label=f"measured, α ≈ {alpha:.2f}", zorder=5)
        y_top = max(y_top, max(curve), max(r.measured_tok_s for r in group))
        baselines.add((round(compute_s, 4), round(t_ring_s, 4)))
    for compute_s, t_ring_s in sorted(baselines):
        baseline = wall_rate(compute_s, t_ring_s)
        axes.axhline(baseline, color="0.3", linestyle="--", linewidth=1)
        axes.annotate(f"no speculation, 1/(C + T_ring) = {baseline:.2f}", xy=(k_max, baseline), xytext=(-4, 3),
                      textcoords="offset points", ha="right", fontsize="x-small", color="0.3")

    axes.set_xlim(1, k_max)
    axes.set_ylim(0, y_top * 1.15)
    axes.set_xlabel("draft length K (tokens per round)")
    axes.set_ylabel("effective decode r_spec (tok/s)")
    axes.set_title("Speculation: r_spec = Γ(α, K) / (K c_d + C + T_ring), measured vs predicted")
    axes.grid(True, alpha=0.25)
    axes.legend(loc="upper left", fontsize="x-small")
    figure.savefig(path, dpi=FIGURE_DPI)


# ---------------------------------------------------------------- markdown


def _cell(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def render_markdown(results: Sequence[RunResult], figures: Sequence[str]) -> str:
    lines = [
        "# geo-ring report",
        "",
        f"{len(results)} run summaries. Predicted = the closed form with the configured T_ring and the measured C: "
        "r = 1/(C + T_ring); for speculation r_spec = Γ(α, K) / (K c_d + C + T_ring) with the measured α and "
        "draft time. Error = (measured - predicted) / predicted.",
        "",
    ]
    lines += [f"![{Path(name).stem}]({name})" for name in figures]
    lines += [
        "",
        "## Measured vs predicted",
        "",
        "| source | scenario | mode | shaper | T_ring (ms) | C (ms) | laps | measured (tok/s) | predicted (tok/s) "
        "| error (%) | overhead (ms/hop) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.source} | {r.scenario} | {r.mode} | {r.shaper or '–'} | {r.t_ring_s * 1e3:.1f} | "
            f"{r.compute_s * 1e3:.1f} | {r.laps if r.laps is not None else '–'} | {r.measured_tok_s:.2f} | "
            f"{r.predicted_tok_s:.2f} | {r.error_pct:+.1f} | {_cell(r.overhead_ms_per_hop, '.2f')} |")
    spec_runs = [r for r in results if r.spec is not None]
    if spec_runs:
        lines += [
            "",
            "## Speculation",
            "",
            "| source | T_ring (ms) | C (ms) | K | α | c_d (ms) | Γ measured | Γ predicted | r_spec measured "
            "| r_spec predicted | error (%) | wall 1/(C+T_ring) | K* | r_spec(K*) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in spec_runs:
            s = r.spec
            k_star, r_star = best_k(s.alpha, s.draft_per_token_s, r.compute_s, r.t_ring_s)
            measured = r.measured_tok_s if r.mode == "speculative" else None
            error = None if measured is None else 100.0 * (measured - s.predicted_tok_s) / s.predicted_tok_s
            lines.append(
                f"| {r.source} | {r.t_ring_s * 1e3:.1f} | {r.compute_s * 1e3:.1f} | {s.k} | {s.alpha:.2f} | "
                f"{s.draft_per_token_s * 1e3:.2f} | {_cell(s.gamma_measured, '.2f')} | {s.gamma_predicted:.2f} | "
                f"{_cell(measured, '.2f')} | {s.predicted_tok_s:.2f} | {_cell(error, '+.1f')} | "
                f"{r.wall_tok_s:.2f} | {k_star} | {r_star:.2f} |")
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


def write_report(results: Sequence[RunResult], out_dir: Path) -> list[Path]:
    """Write the figures and report.md into out_dir; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / WALL_FIGURE]
    plot_wall(results, written[0])
    if any(r.mode == "speculative" for r in results):
        written.append(out_dir / SPEC_FIGURE)
        plot_spec(results, written[-1])
    markdown = out_dir / REPORT_MD
    markdown.write_text(render_markdown(results, [p.name for p in written]), encoding="utf-8")
    return [*written, markdown]


def main(argv: list[str]) -> int:
    """`testbed report RESULTS... [--out DIR]`: 0 on success, 2 on bad input (the message names file and key)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage; hand its status back instead of exiting
        return int(exc.code or 0)
    try:
        results = load_results(args.results)
    except ConfigError as exc:
        print(f"testbed report: error: {exc}", file=sys.stderr)
        return 2
    try:
        written = write_report(results, Path(args.out))
    except OSError as exc:
        print(f"testbed report: error: cannot write into {args.out}: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
