"""The report's style: one size, resolution and palette for every study's figures (drawn on Agg), and one way
to write a missing number in its tables."""

from __future__ import annotations

from typing import Final

FIGURE_DPI: Final = 120
FIGURE_SIZE_IN: Final = (9, 5.6)
CURVE_POINTS: Final = 300
WALL_COLOURS: Final = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown")
DASH: Final = "–"  # a table cell with no number


def new_figure(size_in: tuple[float, float] = FIGURE_SIZE_IN):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size_in, layout="constrained")
    FigureCanvasAgg(figure)  # Agg without touching pyplot's global backend
    return figure


def cell(value: float | None, spec: str) -> str:
    """A markdown table cell: the number formatted by `spec`, or DASH when there is none."""
    return DASH if value is None else format(value, spec)
