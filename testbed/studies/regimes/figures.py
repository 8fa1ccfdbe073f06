"""The regimes study in the report: `testbed regimes --json` results (told apart by their "rows") checked, tabled
(every point, measured next to predicted) and drawn: aggregate and per-stream rate vs streams (fig3_streams.png),
TTFT vs prompt per link rate (fig4_ttft.png)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from testbed.core.decode import BATCHING
from testbed.core.errors import ConfigError
from testbed.studies.regimes.measure import KINDS, STREAMS, RegimeRow, RegimesResult
from testbed.studies.style import DASH, FIGURE_DPI, WALL_COLOURS, new_figure
from testbed.scenario.validate import check_number, record_from
from testbed.studies.base import Sourced


# What each regime's rows must carry besides measured and predicted (the figures read them).
REGIME_ROW_FIGURES: Final[dict[str, tuple[str, ...]]] = {
    "ttft": ("prompt_tokens", "rate_mbit"), "cold": ("prompt_tokens", "rate_mbit"), "decode": (), "speculative": (),
    "streams": ("streams", "per_stream_tok_s", "per_stream_predicted_tok_s", "per_stream_min_tok_s", "ceiling_tok_s")}


def check_regime_row(row: RegimeRow, source: str, where: str) -> None:
    """A row's regime is known and the numbers its figures read are present; errors name the row's field."""
    if row.regime not in KINDS:
        raise ConfigError(f"expected one of {', '.join(KINDS)}, got {row.regime!r}", source=source,
                          key=f"{where}.regime")
    check_number(row.measured, source, f"{where}.measured", minimum=0.0)
    check_number(row.predicted, source, f"{where}.predicted", minimum=0.0)
    check_number(row.error_pct, source, f"{where}.error_pct")
    for key in REGIME_ROW_FIGURES[row.regime]:
        check_number(getattr(row, key), source, f"{where}.{key}", minimum=0.0)
    if row.regime == STREAMS and row.batching not in BATCHING:
        raise ConfigError(f"expected one of {', '.join(BATCHING)}, got {row.batching!r}", source=source,
                          key=f"{where}.batching")


def parse_regimes(data: dict, source: str) -> Sourced[RegimesResult]:
    """A `testbed regimes` JSON object -> a checked RegimesResult; field errors become ConfigError."""
    result = record_from(RegimesResult, data, source, "a regimes result")
    if not result.rows:
        raise ConfigError("expected at least one row", source=source, key="rows")
    for i, row in enumerate(result.rows):
        check_regime_row(row, source, f"rows[{i}]")
    return Sourced(source, result)


def regime_markdown(maps: Sequence[Sourced[RegimesResult]]) -> list[str]:
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


def _series_name(result: RegimesResult, what: str, several: bool) -> str:
    return f"{result.scenario}, {what}" if several else what


def streams_series(results: Sequence[RegimesResult]) -> dict[str, list[RegimeRow]]:
    """The streams rows per batching policy (and scenario, when several maps are drawn), sorted by M."""
    series: dict[str, list[RegimeRow]] = {}
    for result in results:
        for row in result.rows:
            if row.regime == STREAMS:
                name = _series_name(result, f"batching {row.batching}", len(results) > 1)
                series.setdefault(name, []).append(row)
    return {name: sorted(rows, key=lambda row: row.streams) for name, rows in series.items()}


def _rate_label(rate_mbit: float) -> str:
    return "W unlimited" if not rate_mbit else f"W = {rate_mbit:g} Mbit/s"


def ttft_series(results: Sequence[RegimesResult]) -> dict[str, list[RegimeRow]]:
    """The TTFT rows per link rate (and scenario, when several maps are drawn), sorted by prompt tokens."""
    series: dict[str, list[RegimeRow]] = {}
    for result in results:
        for row in sorted((r for r in result.rows if r.regime == "ttft"), key=lambda r: r.rate_mbit):
            series.setdefault(_series_name(result, _rate_label(row.rate_mbit), len(results) > 1), []).append(row)
    return {name: sorted(rows, key=lambda row: row.prompt_tokens) for name, rows in series.items()}


def plot_streams(results: Sequence[RegimesResult], path: Path) -> None:
    """Aggregate (left) and per-stream (right) rate vs M streams in flight, one colour per batching policy.

    Lines join each point's own prediction (physics.streams_rates with that run's measured stage costs); the
    ceiling is the most the bottleneck stage lets through. Points are measured (per stream: the median stream,
    and the slowest).
    """
    from matplotlib.ticker import FuncFormatter, NullFormatter

    figure = new_figure()
    aggregate, per_stream = figure.subplots(1, 2)
    ms: set[int] = set()
    for index, (name, rows) in enumerate(streams_series(results).items()):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        m = [row.streams for row in rows]
        ms.update(m)
        aggregate.plot(m, [row.predicted for row in rows], "-", color=colour, linewidth=2, label=f"predicted, {name}")
        aggregate.plot(m, [row.ceiling_tok_s for row in rows], ":", color=colour, linewidth=1.2,
                       label=f"bottleneck ceiling, {name}")
        aggregate.plot(m, [row.measured for row in rows], "o", color=colour, markersize=8, linestyle="none",
                       label=f"measured, {name}", zorder=5)
        per_stream.plot(m, [row.per_stream_predicted_tok_s for row in rows], "-", color=colour, linewidth=2,
                        label=f"predicted, {name}")
        per_stream.plot(m, [row.per_stream_tok_s for row in rows], "o", color=colour, markersize=8,
                        linestyle="none", label=f"measured median stream, {name}", zorder=5)
        per_stream.plot(m, [row.per_stream_min_tok_s for row in rows], "v", color=colour, markerfacecolor="none",
                        markersize=7, markeredgewidth=1.5, linestyle="none", label=f"measured slowest, {name}",
                        zorder=5)
    for axes in (aggregate, per_stream):
        axes.set_xscale("log")
        axes.set_xticks(sorted(ms))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_xlabel("streams in flight M (log scale)")
        axes.grid(True, which="both", alpha=0.25)
        axes.legend(loc="best", fontsize="x-small")
    aggregate.set_yscale("log")
    aggregate.set_ylabel("aggregate decode (tok/s, log scale)")
    aggregate.set_title("Aggregate: all M streams together", fontsize="medium")
    per_stream.set_ylim(bottom=0)
    per_stream.set_ylabel("per-stream decode (tok/s)")
    per_stream.set_title("Per stream: aggregate / M", fontsize="medium")
    figure.suptitle("M streams in flight, measured vs predicted")
    figure.savefig(path, dpi=FIGURE_DPI)


def plot_ttft(results: Sequence[RegimesResult], path: Path) -> None:
    """TTFT vs prompt tokens P, one colour per link rate: lines join each point's own prediction
    C_prefill(P) + T_ring + the prompt's serialization (Eq. 5 with Eq. 1), points are measured."""
    figure = new_figure()
    axes = figure.add_subplot()
    for index, (name, rows) in enumerate(ttft_series(results).items()):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        p = [row.prompt_tokens for row in rows]
        axes.plot(p, [row.predicted * 1e3 for row in rows], "-", color=colour, linewidth=2,
                  label=f"predicted, {name}")
        axes.plot(p, [row.measured * 1e3 for row in rows], "o", color=colour, markersize=8, linestyle="none",
                  label=f"measured, {name}", zorder=5)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("prompt tokens P")
    axes.set_ylabel("time to first token (ms)")
    axes.set_title("TTFT = C_prefill(P) + T_ring + P-token hidden state / W per hop, measured vs predicted")
    axes.grid(True, alpha=0.25)
    axes.legend(loc="upper left", fontsize="small")
    figure.savefig(path, dpi=FIGURE_DPI)
