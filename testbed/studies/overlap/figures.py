"""The overlap study in the report: `testbed overlap --json` results (told apart by their "overlap_rows") checked,
tabled and drawn as fig11_overlap.png: tok/s vs T_ring for plain decode, synchronous and overlapped speculation,
measured points on their closed forms."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.overlap.measure import RINGS, OverlapResult, OverlapRow, caption, label
from testbed.studies.style import CURVE_POINTS, FIGURE_DPI, WALL_COLOURS, cell, new_figure
from testbed.studies.base import Sourced

POSITIVE: Final = ("compute_ms", "plain_tok_s", "plain_predicted_tok_s", "sync_tok_s", "sync_predicted_tok_s",
                   "overlap_tok_s", "overlap_predicted_tok_s", "overlap_expected_tok_s", "overlap_bound_tok_s",
                   "gamma", "gain_measured", "gain_predicted", "gain_bound")
SHARES: Final = ("hit_rate", "all_accepted_rate")
PLAIN_COLOUR: Final = "0.35"
SYNC_COLOUR: Final = "tab:orange"
OVERLAP_COLOURS: Final = tuple(c for c in WALL_COLOURS if c != SYNC_COLOUR)  # one per window
MARKERS: Final = ("o", "s", "^", "D")  # one per result on the figure


def check_row(row: OverlapRow, source: str, where: str) -> None:
    """A row's ring is known and its rates, shares and counts are what they say; errors name the field."""
    check_text(row.ring, source, f"{where}.ring", tuple(name for name, _ in RINGS))
    check_text(row.scenario, source, f"{where}.scenario")
    check_number(row.t_ring_ms, source, f"{where}.t_ring_ms", minimum=0.0)
    check_count(row.window, 1, source, f"{where}.window")
    for key in POSITIVE:
        check_number(getattr(row, key), source, f"{where}.{key}", positive=True)
    for key in SHARES:
        check_number(getattr(row, key), source, f"{where}.{key}", minimum=0.0, maximum=1.0)
    check_number(row.guess_rate, source, f"{where}.guess_rate", minimum=0.0, maximum=1.0, required=False)
    check_number(row.error_pct, source, f"{where}.error_pct")
    for key in ("rounds", "runs"):
        check_count(getattr(row, key), 1, source, f"{where}.{key}")
    check_count(row.discarded, 0, source, f"{where}.discarded")
    if not isinstance(row.queue_free, bool):
        raise ConfigError(f"expected true or false, got {row.queue_free!r}", source=source, key=f"{where}.queue_free")


def parse_overlap(data: dict, source: str) -> Sourced[OverlapResult]:
    """A `testbed overlap --json` object -> a checked OverlapResult; field errors become ConfigError."""
    result = record_from(OverlapResult, data, source, "an overlap study")
    check_text(result.shaper, source, "shaper")
    check_count(result.k, 1, source, "k")
    check_count(result.tokens, 1, source, "tokens")
    check_number(result.alpha, source, "alpha", minimum=0.0, maximum=1.0)
    for key in ("draft_ms", "temperature"):
        check_number(getattr(result, key), source, key, minimum=0.0)
    if not isinstance(result.overlap_rows, tuple) or not result.overlap_rows:
        raise ConfigError(f"expected a non-empty list of rows, got {result.overlap_rows!r}", source=source,
                          key="overlap_rows")
    for i, row in enumerate(result.overlap_rows):
        check_row(row, source, f"overlap_rows[{i}]")
    return Sourced(source, result)


def overlap_markdown(items: Sequence[Sourced[OverlapResult]]) -> list[str]:
    """The section's body: what is predicted, then a table per result with its caption."""
    lines = ["Per ring (a shipped scenario's stages and hops, the same prompt, draft and K on each), tok/s measured / "
             "predicted: plain decode 1 / (C + T_ring); synchronous speculation Gamma / (K c_d + C + T_ring) with the "
             "measured Gamma; overlapped speculation physics.overlap_run_s over the run's realized runs, then "
             "physics.overlap_rate with the measured Gamma and h (i.i.d.) and physics.overlap_bound (W without end). "
             "Gain: overlap over synchronous speculation, measured / measured and i.i.d. / r_spec."]
    for item in items:
        r = item.result
        lines += ["", f"{item.source}: K {r.k}, calibrated draft alpha {r.alpha:g}, c_d {r.draft_ms:g} ms, "
                  f"temperature {r.temperature:g}, {r.tokens} tokens a run, shaper {r.shaper}.", "",
                  "| source | ring | T_ring (ms) | C (ms) | plain | sync | W | overlap meas / runs / i.i.d. | bound "
                  "| h | gain measured | gain predicted |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in r.overlap_rows:
            lines.append(f"| {item.source} | {label(row.ring)} | {row.t_ring_ms:g} | {row.compute_ms:.1f} | "
                         f"{row.plain_tok_s:.2f} / {row.plain_predicted_tok_s:.2f} | "
                         f"{row.sync_tok_s:.2f} / {row.sync_predicted_tok_s:.2f} | {row.window} | "
                         f"{row.overlap_tok_s:.2f} / {row.overlap_predicted_tok_s:.2f} / "
                         f"{row.overlap_expected_tok_s:.2f} | {row.overlap_bound_tok_s:.2f} | {row.hit_rate:.2f} | "
                         f"{row.gain_measured:.2f}x | {row.gain_predicted:.2f}x |")
        lines += [""] + [f"- {line}" for line in caption(r).splitlines()]
        guess = [row.guess_rate for row in r.overlap_rows]
        lines.append(f"- all K accepted in {cell(r.overlap_rows[0].all_accepted_rate, '.2f')} of rounds, the guess "
                     f"right in {cell(guess[0], '.2f')} of those")
    return lines


def by_window(result: OverlapResult) -> dict[int, list[OverlapRow]]:
    """A result's rows per window, each by T_ring (the figure's x)."""
    series: dict[int, list[OverlapRow]] = {}
    for row in result.overlap_rows:
        series.setdefault(row.window, []).append(row)
    return {w: sorted(rows, key=lambda row: row.t_ring_ms) for w, rows in sorted(series.items())}


def _curves(rows: list[OverlapRow], k: int, draft_s: float):
    """The closed forms on a T_ring grid through the rows, each row's Gamma, h and C interpolated in T_ring between
    rows (one set of them on every ring when the rings run the same tokens): plain, r_spec, overlap_rate, bound."""
    import numpy as np

    t = np.array([row.t_ring_ms for row in rows])
    low, high = t.min(), t.max()
    grid = np.unique(np.concatenate([np.linspace(low, min(high, 1.0), CURVE_POINTS // 3),
                                     np.geomspace(max(low, 1.0), max(high, 1.0), CURVE_POINTS), t]))
    grid = grid[(grid >= low) & (grid <= high)]
    at = {key: np.interp(grid, t, [getattr(row, key) for row in rows]) for key in ("gamma", "hit_rate", "compute_ms")}
    window = rows[0].window
    curves = {"plain": [], "sync": [], "overlap": [], "bound": []}
    for i, ring_ms in enumerate(grid):
        gamma_k, hit, c, ring = at["gamma"][i], min(at["hit_rate"][i], 1.0), at["compute_ms"][i] / 1e3, ring_ms / 1e3
        curves["plain"].append(physics.wall_rate(c, ring))
        curves["sync"].append(gamma_k / physics.spec_round_s(k, draft_s, c, ring))
        curves["overlap"].append(physics.overlap_rate(gamma_k, hit, k, draft_s, c, ring, window))
        curves["bound"].append(physics.overlap_bound(gamma_k, hit, k, draft_s, c, ring))
    return grid, curves


def plot_overlap(results: Sequence[OverlapResult], path: Path) -> None:
    """fig11: tok/s vs T_ring: plain decode, synchronous speculation and overlapped speculation at each window,
    measured points on their closed forms (lines; the overlap's i.i.d. form), the realized-run forms as ticks and
    the bound as W grows dotted."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    figure = new_figure()
    axes = figure.subplots()
    handles, ticks = [], set()
    windows = sorted({row.window for result in results for row in result.overlap_rows})  # a colour each
    for index, result in enumerate(results):
        marker, name = MARKERS[index % len(MARKERS)], f" ({index + 1})" if len(results) > 1 else ""
        series = by_window(result)
        for n, (window, rows) in enumerate(series.items()):
            t = [row.t_ring_ms for row in rows]
            ticks.update(t)
            grid, curves = _curves(rows, result.k, result.draft_ms / 1e3)
            colour = OVERLAP_COLOURS[windows.index(window) % len(OVERLAP_COLOURS)]
            if n == 0:  # plain and synchronous runs do not depend on W
                for key, measured, tint, what in (("plain", "plain_tok_s", PLAIN_COLOUR, "plain decode"),
                                                 ("sync", "sync_tok_s", SYNC_COLOUR, "synchronous speculation")):
                    axes.plot(grid, curves[key], "-", color=tint, linewidth=1.6)
                    axes.plot(t, [getattr(row, measured) for row in rows], marker, color=tint, markersize=7, zorder=5)
                    handles.append(Line2D([], [], color=tint, marker=marker, label=f"{what}{name}"))
                axes.plot(grid, curves["bound"], ":", color="0.2", linewidth=1.4)
            axes.plot(grid, curves["overlap"], "-", color=colour, linewidth=1.6)
            axes.plot(t, [row.overlap_predicted_tok_s for row in rows], "_", color="black", markersize=16, zorder=6)
            axes.plot(t, [row.overlap_tok_s for row in rows], marker, color=colour, markersize=7, zorder=5)
            gain = max(rows, key=lambda row: row.t_ring_ms)
            handles.append(Line2D([], [], color=colour, marker=marker, label=f"overlapped speculation W {window}{name}"
                                  f": {gain.gain_measured:.2f}x sync at {gain.t_ring_ms:g} ms"))
    handles += [Line2D([], [], color="0.4", marker="o", linestyle="none", label="measured"),
                Line2D([], [], color="0.4", label="predicted: 1/(C+T_ring), r_spec, overlap_rate (i.i.d.)"),
                Line2D([], [], color="black", marker="_", markersize=16, linestyle="none",
                       label="overlap over its realized runs (overlap_run_s)"),
                Line2D([], [], color="0.2", linestyle=":", label="overlap_bound: W without end")]
    positive = sorted(x for x in ticks if x > 0)
    if positive:
        axes.set_xscale("symlog", linthresh=min(1.0, positive[0]))
    axes.set_xticks(sorted(ticks), [f"{x:g}" for x in sorted(ticks)])
    axes.set_xticks([], minor=True)
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    axes.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}" if f"{y:.0e}"[0] in "25" else ""))
    axes.set_xlabel("T_ring (ms, symlog scale)")
    axes.set_ylabel("decode (tok/s, log scale)")
    axes.grid(True, alpha=0.25)
    axes.legend(handles=handles, loc="lower left", fontsize="x-small")
    where = "; ".join(dict.fromkeys(f"K {r.k}, alpha {r.alpha:g}, c_d {r.draft_ms:g} ms, {r.shaper}" for r in results))
    figure.suptitle(f"Overlapped speculation vs T_ring: measured (points) and predicted (lines)\n{where}")
    figure.savefig(path, dpi=FIGURE_DPI)
