"""The report's tree-speculation and wire-codec sections: `sweep --tree-n` and `codecs` results checked, tabled, drawn.

A tree sweep (`sweep SCENARIO --tree-n ... --json F`, told apart by its "tree_rows") becomes fig7_tree.png, L(n)
vs n with the fit a + b ln n and tok/s vs n measured next to physics.tree_rate with W* marked, and a table per
sweep. A codec table (`codecs SCENARIO --json F`, a list of rows, each told apart by its "greedy_agreement") becomes
one table: bytes on the wire, encode and decode time, and what the codec does to the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from testbed.core.decode import CODECS
from testbed.core.errors import ConfigError
from testbed.figure_checks import check_count as _check_count, check_number as _check_number, check_text as _check_text
from testbed.figures import CURVE_POINTS, FIGURE_DPI, FIGURE_SIZE_IN, WALL_COLOURS, new_figure
from testbed.tree_sweep import TreeFit, TreeRow, TreeSweep

if TYPE_CHECKING:
    from testbed.codecs import CodecRow

DASH: Final = "–"
TREE_FIGURE_SIZE_IN: Final = (15.0, FIGURE_SIZE_IN[1])  # two panels side by side
# TreeRow numbers: n sits on fig7's log axis; the rest are rates, times, bytes and L(n).
TREE_ROW_NON_NEGATIVE: Final = ("rate_mbit", "tokens_per_round", "lap_ms", "draft_ms", "compute_ms", "ring_ms",
                                "serialization_ms", "bytes_per_hop", "measured_tok_s", "predicted_tok_s")
# CodecRow numbers: (field, minimum, maximum); KL has no minimum, as a distribution equal to f32's can come out a
# rounding error below 0.
CODEC_NUMBERS: Final = (("ratio_to_f32", 0.0, None), ("encode_us", 0.0, None), ("decode_us", 0.0, None),
                        ("greedy_agreement", 0.0, 1.0), ("kl_nats", None, None), ("alpha_hat", 0.0, 1.0))
CODEC_COUNTS: Final = (("block", 1), ("token_frame_bytes", 1), ("prompt_frame_bytes", 1))


@dataclass(frozen=True)
class SourcedTree:
    """One tree sweep (`testbed sweep --tree-n ... --json`) and where it came from."""

    source: str
    result: TreeSweep


@dataclass(frozen=True)
class SourcedCodec:
    """One row of a codec table (`testbed codecs --json`, a list) and where it came from ("file.json[2]")."""

    source: str
    row: CodecRow


# ---------------------------------------------------------------- loading and validation


def check_tree_row(row: TreeRow, source: str, where: str) -> None:
    """A row's codec is known and the numbers fig7 and the table read are numbers; errors name the field."""
    _check_text(row.codec, source, f"{where}.codec", CODECS)
    _check_number(row.n, source, f"{where}.n", positive=True)
    _check_count(row.rounds, 1, source, f"{where}.rounds")
    for key in TREE_ROW_NON_NEGATIVE:
        _check_number(getattr(row, key), source, f"{where}.{key}", minimum=0.0)
    _check_number(row.error_pct, source, f"{where}.error_pct")


def check_tree_fit(item: TreeFit, source: str, where: str) -> None:
    """A fit's coefficients are numbers and its widths above 0 (fig7's log axis); errors name the field."""
    _check_text(item.codec, source, f"{where}.codec", CODECS)
    _check_number(item.rate_mbit, source, f"{where}.rate_mbit", minimum=0.0)
    for key in ("a", "b"):
        _check_number(getattr(item, key), source, f"{where}.{key}")
    for key in ("best_n_measured", "best_n_predicted"):
        _check_number(getattr(item, key), source, f"{where}.{key}", positive=True)
    for key in ("w_star_predicted", "w_star_measured"):
        _check_number(getattr(item, key), source, f"{where}.{key}", positive=True, required=False)


def parse_tree(data: dict, source: str) -> SourcedTree:
    """A `testbed sweep --tree-n` JSON object -> a checked TreeSweep; field errors become ConfigError."""
    try:
        result = TreeSweep.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a tree sweep: {exc}", source=source) from exc
    _check_text(result.scenario, source, "scenario")
    _check_text(result.shaper, source, "shaper", empty_ok=True)
    _check_text(result.policy, source, "policy")
    _check_number(result.t_ring_s, source, "t_ring_s", minimum=0.0)
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
    return SourcedTree(source, result)


def parse_codec(data: dict, source: str) -> SourcedCodec:
    """One `testbed codecs --json` row -> a checked CodecRow; field errors become ConfigError."""
    from testbed.codecs import CodecRow  # imports torch: only a report with a codec table pays for it

    try:
        row = CodecRow.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a codec row: {exc}", source=source) from exc
    _check_text(row.codec, source, "codec", CODECS)
    for key, minimum in CODEC_COUNTS:
        _check_count(getattr(row, key), minimum, source, key)
    _check_count(row.bytes_per_hop, 0, source, "bytes_per_hop", required=False)
    for key, minimum, maximum in CODEC_NUMBERS:
        _check_number(getattr(row, key), source, key, minimum=minimum, maximum=maximum)
    for key in ("ttft_measured_s", "ttft_predicted_s"):
        _check_number(getattr(row, key), source, key, minimum=0.0, required=False)
    if (row.ttft_measured_s is None) != (row.ttft_predicted_s is None):
        raise ConfigError("expected TTFT measured and predicted both or neither", source=source,
                          key="ttft_predicted_s" if row.ttft_predicted_s is None else "ttft_measured_s")
    return SourcedCodec(source, row)


# ---------------------------------------------------------------- what is drawn, in which order


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


# ---------------------------------------------------------------- markdown


def _cell(value: float | None, spec: str) -> str:
    return DASH if value is None else format(value, spec)


def _tree_rows(item: SourcedTree) -> list[str]:
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


def _codec_label(row: CodecRow) -> str:
    return f"{row.codec} (block {row.block})" if row.codec == "int8-block" else row.codec


def _codec_rows(items: Sequence[SourcedCodec]) -> list[str]:
    lines = ["| source | codec | 1-token frame (B) | prompt frame (B) | vs f32 | encode (µs) | decode (µs) "
             "| greedy agreement | KL (nats) | α̂ | TTFT measured / predicted (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for item in items:
        row = item.row
        ttft = DASH if row.ttft_measured_s is None else (f"{row.ttft_measured_s * 1e3:.1f} / "
                                                         f"{row.ttft_predicted_s * 1e3:.1f}")
        lines.append(f"| {item.source} | {_codec_label(row)} | {row.token_frame_bytes} | {row.prompt_frame_bytes} | "
                     f"{row.ratio_to_f32:.3f} | {row.encode_us:.0f} | {row.decode_us:.0f} | "
                     f"{row.greedy_agreement:.4f} | {row.kl_nats:.2e} | {row.alpha_hat:.4f} | {ttft} |")
    return lines


def tree_markdown(trees: Sequence[SourcedTree], codecs: Sequence[SourcedCodec]) -> list[str]:
    """The "## Tree speculation" and "## Wire codecs" sections, each only when there is something to table."""
    lines = []
    if trees:
        lines += ["", "## Tree speculation", "",
                  "Per (codec, link rate, n): L(n) tokens per lap, the lap, the bytes per hop; predicted = "
                  "physics.tree_rate, L(n) / (sum_i [l_i + n s_h / BW_i] + compute(n)) with the measured L(n) and "
                  "compute. W* is the width where a lap's serialization equals T_ring; measured where the ring "
                  "time passes 2 T_ring."]
        for item in trees:
            lines += _tree_rows(item)
    if codecs:
        lines += ["", "## Wire codecs", "",
                  "Frames with their header; vs f32 = prompt frame bytes over f32's. Greedy agreement, KL(p_f32 || "
                  "p_codec) and α̂ (the draft against the codec'd target) are teacher-forced with the codec at every "
                  "hop; TTFT (`codecs --measure`) measured vs C_prefill + T_ring + serialization.", "",
                  *_codec_rows(codecs)]
    return lines


# ---------------------------------------------------------------- figures


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
