"""The tp study in the report: `testbed tp --json` results (told apart by their "tp_rows") checked, tabled and
drawn as fig6_tp.png, per-token latency vs the links' one-way latency, measured next to predicted, with Eq. 8's
bound 4 L / N."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from testbed.core.decode import ALLREDUCE
from testbed.core.errors import ConfigError
from testbed.studies.style import DASH, FIGURE_DPI, WALL_COLOURS, new_figure
from testbed.studies.tp.measure import TpResult, TpRow
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.base import Sourced


TP_ROW_POSITIVE: Final = ("hop_scale", "pp_token_ms", "pp_predicted_token_ms", "tp_token_ms",
                          "tp_predicted_token_ms", "ratio_bound")  # fig6 draws these (times PP) on a log axis

TP_ROW_NON_NEGATIVE: Final = ("mean_link_ms", "ratio_measured", "ratio_predicted", "tp_bytes_per_token",
                              "pp_bytes_per_token")

TP_COLOURS: Final = tuple(zip(WALL_COLOURS[0::2], WALL_COLOURS[1::2]))  # (PP, TP) per sweep


def check_tp_row(row: TpRow, source: str, where: str) -> None:
    """A row's latencies and ratios are numbers (those on fig6's log axis above 0); errors name the field."""
    for key in TP_ROW_POSITIVE:
        check_number(getattr(row, key), source, f"{where}.{key}", positive=True)
    for key in TP_ROW_NON_NEGATIVE:
        check_number(getattr(row, key), source, f"{where}.{key}", minimum=0.0)
    if not isinstance(row.same_tokens, bool):
        raise ConfigError(f"expected true or false, got {row.same_tokens!r}", source=source, key=f"{where}.same_tokens")


def parse_tp(data: dict, source: str) -> Sourced[TpResult]:
    """A `testbed tp --json` object -> a checked TpResult; field errors become ConfigError."""
    result = record_from(TpResult, data, source, "a PP-vs-TP result")
    check_text(result.scenario, source, "scenario")
    check_text(result.shaper, source, "shaper", empty_ok=True)
    check_count(result.ranks, 1, source, "ranks")
    check_count(result.layers, 1, source, "layers")
    check_text(result.allreduce, source, "allreduce", ALLREDUCE)
    if not isinstance(result.tp_rows, tuple) or not result.tp_rows:
        raise ConfigError(f"expected a non-empty list of rows, got {result.tp_rows!r}", source=source, key="tp_rows")
    for i, row in enumerate(result.tp_rows):
        check_tp_row(row, source, f"tp_rows[{i}]")
    return Sourced(source, result)


def tp_series(result: TpResult) -> list[TpRow]:
    """A sweep's rows in order of the mean link latency (fig6's x)."""
    return sorted(result.tp_rows, key=lambda row: row.mean_link_ms)


def _tp_rows(item: Sourced[TpResult]) -> list[str]:
    r = item.result
    lines = [f"{item.source}: {r.scenario}, {r.ranks} agents, {r.layers} layers, {r.allreduce} all-reduce, "
             f"shaper {r.shaper or DASH}.", "",
             "| source | links x | mean link (ms) | PP measured (ms) | PP predicted (ms) | TP measured (ms) "
             "| TP predicted (ms) | TP/PP measured | TP/PP exact | 4L/N | same tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in tp_series(r):
        lines.append(f"| {item.source} | {row.hop_scale:g} | {row.mean_link_ms:.1f} | {row.pp_token_ms:.1f} | "
                     f"{row.pp_predicted_token_ms:.1f} | {row.tp_token_ms:.1f} | {row.tp_predicted_token_ms:.1f} | "
                     f"{row.ratio_measured:.2f} | {row.ratio_predicted:.2f} | {row.ratio_bound:.2f} | "
                     f"{'yes' if row.same_tokens else 'no'} |")
    return lines + [""]


def plot_tp(results: Sequence[TpResult], path: Path) -> None:
    """fig6: per-token latency vs the links' mean one-way latency: PP and TP predicted (lines) and measured
    (points), and Eq. 8's bound 4 L / N times PP's prediction."""
    figure = new_figure()
    axes = figure.add_subplot()
    several = len(results) > 1
    for index, result in enumerate(results):
        pp_colour, tp_colour = TP_COLOURS[index % len(TP_COLOURS)]
        rows = tp_series(result)
        x = [row.mean_link_ms for row in rows]
        name = f"{result.scenario}, " if several else ""
        how = f"{result.allreduce} all-reduce, N = {result.ranks}, L = {result.layers}"
        line = {"marker": "_", "markersize": 14}  # a sweep of one scale still shows its lines, as dashes
        axes.plot(x, [row.pp_predicted_token_ms for row in rows], "-", color=pp_colour, linewidth=2, **line,
                  label=f"{name}PP predicted C + T_ring")
        axes.plot(x, [row.pp_token_ms for row in rows], "o", color=pp_colour, markersize=8, linestyle="none",
                  label=f"{name}PP measured", zorder=5)
        axes.plot(x, [row.tp_predicted_token_ms for row in rows], "-", color=tp_colour, linewidth=2, **line,
                  label=f"{name}TP predicted, {how}")
        axes.plot(x, [row.tp_token_ms for row in rows], "s", color=tp_colour, markersize=8, linestyle="none",
                  label=f"{name}TP measured, {result.allreduce} all-reduce", zorder=5)
        bounds = "/".join(f"{b:g}" for b in sorted({round(row.ratio_bound, 2) for row in rows}))
        axes.plot(x, [row.ratio_bound * row.pp_predicted_token_ms for row in rows], "--", color=tp_colour,
                  linewidth=1.2, **line, label=f"{name}Eq. 8 bound: 4L/N = {bounds} × PP predicted")
    axes.set_yscale("log")
    axes.set_xlim(left=0)
    axes.set_xlabel("mean link one-way latency (ms)")
    axes.set_ylabel("per-token latency (ms, log scale)")
    axes.set_title("PP vs TP on the same links: per-token latency, measured vs predicted")
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(loc="best", fontsize="x-small")
    figure.savefig(path, dpi=FIGURE_DPI)


def tp_markdown(tps: Sequence[Sourced[TpResult]]) -> list[str]:
    """The PP-vs-TP section's body: what is predicted, then a table per sweep."""
    lines = ["PP vs TP per token: PP C + T_ring; TP 2 L all-reduces (physics.tp_token_s). TP/PP exact is the "
             "ratio of the two predictions, 4L/N Eq. 8's bound.", ""]
    for item in tps:
        lines += _tp_rows(item)
    return lines
