"""Text charts of a run summary for the terminal: the wall on a log T_ring axis (braille) and the rate sparkline."""

from __future__ import annotations

import math
from typing import Callable, Final

from rich.console import Group
from rich.text import Text

from testbed.core.physics import wall_rate
from testbed.core.summary import RunSummary

PLOT_T_MIN_MS: Final = 0.1
PLOT_T_MAX_MS: Final = 1000.0
PLOT_MIN_ROWS: Final = 4  # below this the wall plot says nothing; drop it
PLOT_MAX_ROWS: Final = 32
PLOT_Y_GUTTER: Final = 7  # "123.4 ┤"

SPARK_CHARS: Final = "▁▂▃▄▅▆▇█"
SPARK_MIN_COLUMNS: Final = 8
MEASURED_MARK: Final = "●"
DASH: Final = "–"

# Braille cell: dot bit for (row 0..3, column 0..1) inside one character.
_BRAILLE_BITS: Final = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


def _plot_title(summary: RunSummary | None) -> Text:
    title = Text(no_wrap=True, overflow="ellipsis")
    title.append("wall ", style="bold")
    title.append("r = 1/(C + T_ring)", style="cyan")
    if summary is None or summary.compute_s is None or summary.compute_s <= 0:
        title.append("  (waiting for the first laps to measure C)", style="dim")
        return title
    measured = DASH if summary.measured_tok_s is None else f"{summary.measured_tok_s:.2f}"
    title.append(f", C = {summary.compute_s * 1e3:.1f} ms  ", style="dim")
    title.append(MEASURED_MARK, style="bold red")
    kind = "speculative" if summary.is_speculative else "measured"
    title.append(f" {kind} {measured} tok/s @ {summary.t_ring_s * 1e3:.1f} ms", style="dim")
    return title


def wall_plot(summary: RunSummary | None, width: int, rows: int) -> Group:
    """r(T_ring) = 1/(C + T_ring) over hypothetical T_ring (braille curve, log axis), with the run's point on it.

    One no_wrap line each: the title, `rows` plot rows, the axis; only the title until C is measured.
    """
    title = _plot_title(summary)
    if summary is None or summary.compute_s is None or summary.compute_s <= 0:
        return Group(title)
    compute_s, t_ring_s, measured = summary.compute_s, summary.t_ring_s, summary.measured_tok_s

    cols = max(10, width - PLOT_Y_GUTTER - 1)
    px_w, px_h = cols * 2, rows * 4
    log_min, log_max = math.log10(PLOT_T_MIN_MS), math.log10(PLOT_T_MAX_MS)
    y_max = 1.05 * max(wall_rate(compute_s, PLOT_T_MIN_MS / 1e3), measured or 0.0)

    def x_px(t_ms: float) -> int:
        frac = (math.log10(min(max(t_ms, PLOT_T_MIN_MS), PLOT_T_MAX_MS)) - log_min) / (log_max - log_min)
        return round(frac * (px_w - 1))

    def y_px(rate: float) -> int:  # 0 is the top row of dots
        return round((1.0 - min(max(rate / y_max, 0.0), 1.0)) * (px_h - 1))

    cells = [[0] * cols for _ in range(rows)]
    previous_y = None
    for x in range(px_w):
        t_ms = 10 ** (log_min + (log_max - log_min) * x / (px_w - 1))
        y = y_px(wall_rate(compute_s, t_ms / 1e3))
        low, high = (y, y) if previous_y is None else (min(y, previous_y + 1), max(y, previous_y - 1))
        for yy in range(min(low, high), max(low, high) + 1):  # join steep parts so the curve stays unbroken
            cells[yy // 4][x // 2] |= _BRAILLE_BITS[yy % 4][x % 2]
        previous_y = y

    mark = None if measured is None else (min(y_px(measured) // 4, rows - 1), x_px(t_ring_s * 1e3) // 2)

    lines = [title, *(_plot_row(row, rows, cells[row], y_max, px_h, mark) for row in range(rows)),
             _axis_line(cols, x_px, log_min, log_max)]
    return Group(*lines)


def _plot_row(row: int, rows: int, cells: list[int], y_max: float, px_h: int, mark: tuple[int, int] | None) -> Text:
    """One row of the wall plot: its y label (top, middle, bottom), then its braille cells, the mark on its row."""
    if row == 0:
        label = f"{y_max:.3g}"
    elif row == rows - 1:
        label = "0"
    elif row == rows // 2:
        label = f"{y_max * (1 - (row * 4 + 1.5) / (px_h - 1)):.3g}"
    else:
        label = ""
    gutter = f"{label:>{PLOT_Y_GUTTER - 2}} ┤" if label else f"{'':>{PLOT_Y_GUTTER - 2}} │"
    body = "".join(chr(0x2800 + bits) if bits else " " for bits in cells)
    line = Text(gutter, style="dim", no_wrap=True, overflow="crop")
    if mark is not None and mark[0] == row:  # one span per run of cells, not one per cell
        col = mark[1]
        line.append(body[:col], style="cyan")
        line.append(MEASURED_MARK, style="bold red")
        line.append(body[col + 1:], style="cyan")
    else:
        line.append(body, style="cyan")
    return line


def _axis_line(cols: int, x_px: Callable[[float], int], log_min: float, log_max: float) -> Text:
    """The x axis: each decade of T_ring (ms) under its place on the curve."""
    axis = [" "] * (cols + 1)
    for decade in range(math.ceil(log_min), math.floor(log_max) + 1):
        label = f"{10.0 ** decade:g}"
        start = 1 + x_px(10.0 ** decade) // 2 - len(label) // 2
        start = max(0, min(start, cols + 1 - len(label)))
        axis[start:start + len(label)] = label
    return Text(" " * (PLOT_Y_GUTTER - 1) + "".join(axis).rstrip() + " ms", style="dim", no_wrap=True,
                overflow="crop")


def sparkline(summary: RunSummary | None, width: int) -> Text:
    """The recent decode rate over the run (`history`), binned into the columns left after the labels."""
    history = summary.history if summary is not None else ()
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("rate ", style="bold")
    if not history:
        line.append("(no history yet)", style="dim")
        return line
    rates = [rate for _, rate in history]
    tail = (f" now {rates[-1]:.2f} tok/s  min {min(rates):.2f} max {max(rates):.2f}"
            f"  over {history[-1][0] - history[0][0]:.0f} s")
    cols = max(SPARK_MIN_COLUMNS, width - line.cell_len - len(tail))
    values: list[float | None]
    if len(history) > cols:  # average into equal time bins
        t0, t1 = history[0][0], history[-1][0]
        span = (t1 - t0) or 1.0
        bins: list[list[float]] = [[] for _ in range(cols)]
        for t, rate in history:
            bins[min(cols - 1, int((t - t0) / span * cols))].append(rate)
        values = [sum(b) / len(b) if b else None for b in bins]
    else:
        values = list(rates)
    low, high = min(rates), max(rates)
    levels = len(SPARK_CHARS) - 1

    def level(value: float) -> int:  # min..max like any sparkline; a flat history sits mid-height
        return levels // 2 if high - low < 1e-9 else round((value - low) / (high - low) * levels)

    line.append("".join(" " if v is None else SPARK_CHARS[level(v)] for v in values), style="green")
    line.append(tail, style="dim")
    return line
