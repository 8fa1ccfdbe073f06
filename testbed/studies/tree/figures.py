"""The tree study in the report: `sweep SCENARIO --tree-n ... --json F` results (told apart by their
"tree_rows") checked, tabled and drawn as fig7_tree.png: L(n) vs n with the fit a + b ln n, and tok/s vs n
measured next to physics.tree_rate with W* marked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from testbed.core.decode import CODECS
from testbed.core.errors import ConfigError
from testbed.studies.style import CURVE_POINTS, DASH, FIGURE_DPI, FIGURE_SIZE_IN, WALL_COLOURS, new_figure
from testbed.studies.tree.measure import TreeFit, TreeRow, TreeSweep
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.base import Sourced


TREE_FIGURE_SIZE_IN: Final = (15.0, FIGURE_SIZE_IN[1])  # two panels side by side

# TreeRow numbers: n sits on fig7's log axis; the rest are rates, times, bytes and L(n).
TREE_ROW_NON_NEGATIVE: Final = ("rate_mbit", "tokens_per_round", "lap_ms", "draft_ms", "compute_ms", "ring_ms",
                                "serialization_ms", "bytes_per_hop", "measured_tok_s", "predicted_tok_s")


def check_tree_row(row: TreeRow, source: str, where: str) -> None:
    """A row's codec is known and the numbers fig7 and the table read are numbers; errors name the field."""
    check_text(row.codec, source, f"{where}.codec", CODECS)
    check_number(row.n, source, f"{where}.n", positive=True)
    check_count(row.rounds, 1, source, f"{where}.rounds")
    for key in TREE_ROW_NON_NEGATIVE:
        check_number(getattr(row, key), source, f"{where}.{key}", minimum=0.0)
    check_number(row.error_pct, source, f"{where}.error_pct")


def check_tree_fit(item: TreeFit, source: str, where: str) -> None:
    """A fit's coefficients are numbers and its widths above 0 (fig7's log axis); errors name the field."""
    check_text(item.codec, source, f"{where}.codec", CODECS)
    check_number(item.rate_mbit, source, f"{where}.rate_mbit", minimum=0.0)
    for key in ("a", "b"):
        check_number(getattr(item, key), source, f"{where}.{key}")
    for key in ("best_n_measured", "best_n_predicted"):
        check_number(getattr(item, key), source, f"{where}.{key}", positive=True)
    for key in ("w_star_predicted", "w_star_measured"):
        check_number(getattr(item, key), source, f"{where}.{key}", positive=True, required=False)


def parse_tree(data: dict, source: str) -> Sourced[TreeSweep]:
    """A `testbed sweep --tree-n` JSON object -> a checked TreeSweep; field errors become ConfigError."""
    result = record_from(TreeSweep, data, source, "a tree sweep")
    check_text(result.scenario, source, "scenario")
    check_text(result.shaper, source, "shaper", empty_ok=True)
    check_text(result.policy, source, "policy")
    check_number(result.t_ring_s, source, "t_ring_s", minimum=0.0)
    for key, what in (("tree_rows", "rows"), ("fits", "fits")):
        if not isinstance(getattr(result, key), tuple):
            raise ConfigError(f"expected a list of {what}, got {getattr(result, key)!r}", source=source, key=key)
    if not result.tree_rows:
        raise ConfigError("expected at least one row", source=source, key="tree_rows")
    for i, row in enumerate(result.tree_rows):
        check_tree_row(row, source, f"tree_rows[{i}]")
    series = tree_series(result)
    for i, item in enumerate(result.fits):
        check_tree_fit(item, source, f"fits[{i}]")
        if (item.codec, item.rate_mbit) not in series:
            raise ConfigError(f"no tree_rows at {item.codec}, {rate_label(item.rate_mbit)} to fit", source=source,
                              key=f"fits[{i}]")
    return Sourced(source, result)


def rate_label(rate_mbit: float) -> str:
    return f"{rate_mbit:g} Mbit/s" if rate_mbit > 0 else "unlimited"


def tree_series(result: TreeSweep) -> dict[tuple[str, float], list[TreeRow]]:
    """A sweep's rows per (codec, link rate), in the order the sweep ran them, each by n (fig7's x)."""
    series: dict[tuple[str, float], list[TreeRow]] = {}
    for row in result.tree_rows:
        series.setdefault((row.codec, row.rate_mbit), []).append(row)
    return {key: sorted(rows, key=lambda row: row.n) for key, rows in series.items()}


def fit_of(result: TreeSweep, codec: str, rate_mbit: float) -> TreeFit | None:
    return next((f for f in result.fits if (f.codec, f.rate_mbit) == (codec, rate_mbit)), None)


def _fit_text(item: TreeFit | None) -> str:
    return "no fit" if item is None else f"L(n) = {item.a:.2f} + {item.b:.2f} ln n"


def _w_star_text(item: TreeFit | None) -> str:
    if item is None or item.w_star_predicted is None:
        return ""
    measured = DASH if item.w_star_measured is None else f"{item.w_star_measured:.0f}"
    return f"W* predicted {item.w_star_predicted:.0f}, measured {measured}"


def _tree_rows(item: Sourced[TreeSweep]) -> list[str]:
    r = item.result
    lines = ["", f"{item.source}: {r.scenario}, {r.policy} policy, T_ring {r.t_ring_s * 1e3:.1f} ms, "
             f"shaper {r.shaper or DASH}.", "",
             "| source | codec | Mbit/s | n | L(n) | lap (ms) | B/hop | measured (tok/s) | predicted (tok/s) "
             "| error (%) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    series = tree_series(r)
    for row in (row for rows in series.values() for row in rows):
        rate = f"{row.rate_mbit:g}" if row.rate_mbit > 0 else "unlimited"
        lines.append(f"| {item.source} | {row.codec} | {rate} | {row.n:g} | {row.tokens_per_round:.2f} | "
                     f"{row.lap_ms:.1f} | {row.bytes_per_hop:.0f} | {row.measured_tok_s:.2f} | "
                     f"{row.predicted_tok_s:.2f} | {row.error_pct:+.1f} |")
    lines.append("")
    for (codec, rate), rows in series.items():
        found = fit_of(r, codec, rate)
        best = "" if found is None else (f"; best n measured {found.best_n_measured:g}, predicted "
                                         f"{found.best_n_predicted:g}")
        w_star = _w_star_text(found)
        lines.append(f"- {codec}, {rate_label(rate)}: {_fit_text(found)}{best}" + (f"; {w_star}" if w_star else ""))
    return lines


def tree_markdown(trees: Sequence[Sourced[TreeSweep]]) -> list[str]:
    """The tree speculation section's body: what is predicted, then a table per sweep."""
    lines = ["Per (codec, link rate, n): L(n) tokens per lap, the lap, the bytes per hop; predicted = "
             "physics.tree_rate, L(n) / (sum_i [l_i + n s_h / BW_i] + compute(n)) with the measured L(n) and "
             "compute. W* is the width where a lap's serialization equals T_ring; measured where the ring "
             "time passes 2 T_ring."]
    for item in trees:
        lines += _tree_rows(item)
    return lines


def plot_tree(results: Sequence[TreeSweep], path: Path) -> None:
    """fig7: (left) L(n) vs n, measured points and the fit a + b ln n; (right) tok/s vs n, measured points and
    physics.tree_rate as a line per (codec, rate), W* predicted dashed, W* measured a star on the measured curve."""
    import numpy as np
    from matplotlib.lines import Line2D

    figure = new_figure(TREE_FIGURE_SIZE_IN)
    lengths, rates = figure.subplots(1, 2)
    several = len(results) > 1
    series = [(result, key, rows) for result in results for key, rows in tree_series(result).items()]
    length_handles, rate_handles, any_w_pred, any_w_meas = [], [], False, False
    for index, (result, (codec, rate), rows) in enumerate(series):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        name = (f"{result.scenario}, " if several else "") + f"{codec}, {rate_label(rate)}"
        found = fit_of(result, codec, rate)
        n = np.array([row.n for row in rows])
        measured = [row.measured_tok_s for row in rows]
        lengths.plot(n, [row.tokens_per_round for row in rows], "o", color=colour, markersize=7, zorder=5)
        if found is not None:
            grid = np.geomspace(n.min(), n.max(), CURVE_POINTS)
            lengths.plot(grid, found.a + found.b * np.log(grid), "-", color=colour, linewidth=1.6)
        length_handles.append(Line2D([], [], color=colour, marker="o", label=f"{name}: {_fit_text(found)}"))
        rates.plot(n, measured, "o", color=colour, markersize=7, zorder=5)
        rates.plot(n, [row.predicted_tok_s for row in rows], "-", color=colour, linewidth=1.6)
        if found is not None and found.w_star_predicted is not None:
            rates.axvline(found.w_star_predicted, color=colour, linestyle="--", linewidth=1.2)
            any_w_pred = True
        if found is not None and found.w_star_measured is not None:
            at = float(np.interp(math.log(found.w_star_measured), np.log(n), measured))
            rates.plot(found.w_star_measured, at, "*", color=colour, markeredgecolor="black", markersize=15, zorder=6)
            any_w_meas = True
        w_star = _w_star_text(found)
        rate_handles.append(Line2D([], [], color=colour, marker="o", label=name + (f": {w_star}" if w_star else "")))
    rate_handles += [Line2D([], [], color="0.4", marker="o", linestyle="none", label="measured"),
                     Line2D([], [], color="0.4", label="predicted physics.tree_rate")]
    if any_w_pred:
        rate_handles.append(Line2D([], [], color="0.4", linestyle="--", label="W* predicted: serialization = T_ring"))
    if any_w_meas:
        rate_handles.append(Line2D([], [], color="0.4", marker="*", markersize=12, markeredgecolor="black",
                                   linestyle="none", label="W* measured: ring time = 2 T_ring"))
    ticks = sorted({row.n for _, _, rows in series for row in rows})
    for axes in (lengths, rates):
        axes.set_xscale("log")
        axes.set_xticks(ticks, [f"{n:g}" for n in ticks])
        axes.set_xticks([], minor=True)
        axes.set_xlabel("tree nodes per round n (log scale)")
        axes.grid(True, alpha=0.25)
    lengths.set_ylabel("tokens per lap L(n)")
    lengths.set_title("L(n): measured (points) and the fit a + b ln n (lines)", fontsize="medium")
    lengths.legend(handles=length_handles, loc="best", fontsize="x-small")
    rates.set_ylim(bottom=0)
    rates.set_ylabel("decode (tok/s)")
    rates.set_title("tok/s vs n: measured vs predicted, W* per limited link rate", fontsize="medium")
    rates.legend(handles=rate_handles, loc="best", fontsize="x-small")
    where = ", ".join(dict.fromkeys(f"{r.scenario} (T_ring {r.t_ring_s * 1e3:.1f} ms, {r.policy})" for r in results))
    figure.suptitle(f"Tree speculation on {where}")
    figure.savefig(path, dpi=FIGURE_DPI)
