"""The place study in the report: `testbed place --json` results (told apart by their "placements") checked,
tabled and drawn as fig5_placement.png, the predicted rate 1/(C + T_ring) of each ring order, measured where
--measure ran it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from testbed.core.decode import HEAD_PLACEMENTS
from testbed.core.errors import ConfigError
from testbed.studies.place.measure import Placement, PlaceResult
from testbed.studies.style import DASH, FIGURE_DPI, FIGURE_SIZE_IN, cell, new_figure
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.base import Sourced


# (field, minimum, required): the numbers fig5 and the table read from each placement.
PLACEMENT_NUMBERS: Final = (("t_ring_s", 0.0, True), ("predicted_tok_s", 0.0, True),
                            ("measured_tok_s", 0.0, False), ("error_pct", None, False))

# fig5's bar colour per label; a separate head's bar takes the colour of the order it derives from, hatched.
LABEL_COLOURS: Final = {"as given": "0.6", "best": "tab:green", "worst": "tab:red"}

OTHER_LABEL_COLOUR: Final = "tab:blue"

SEPARATE_HEAD_HATCH: Final = "//"

BAR_GROUP_GAP: Final = 0.5  # extra space between an order (with its separate head) and the next

BAR_HEIGHT_IN: Final = 0.55


def check_placement(placement: Placement, source: str, where: str) -> None:
    """A placement's stages, regions, label, head and numbers are what fig5 reads; errors name the field."""
    for key in ("order", "regions"):
        names = getattr(placement, key)
        if not isinstance(names, tuple) or not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"expected a non-empty list of names, got {names!r}", source=source,
                              key=f"{where}.{key}")
    if len(placement.regions) != len(placement.order):
        raise ConfigError(f"expected one region per stage ({len(placement.order)}), got {len(placement.regions)}",
                          source=source, key=f"{where}.regions")
    check_text(placement.label, source, f"{where}.label")
    check_text(placement.head, source, f"{where}.head", HEAD_PLACEMENTS)
    for key, minimum, required in PLACEMENT_NUMBERS:
        check_number(getattr(placement, key), source, f"{where}.{key}", minimum=minimum, required=required)


def parse_place(data: dict, source: str) -> Sourced[PlaceResult]:
    """A `testbed place --json` object -> a checked PlaceResult; field errors become ConfigError."""
    result = record_from(PlaceResult, data, source, "a placement result")
    check_text(result.scenario, source, "scenario")
    check_text(result.shaper, source, "shaper", empty_ok=True)
    check_count(result.evaluated, 0, source, "evaluated")
    check_number(result.median_t_ring_s, source, "median_t_ring_s", minimum=0.0, required=False)
    if not isinstance(result.placements, tuple) or not result.placements:
        raise ConfigError(f"expected a non-empty list of placements, got {result.placements!r}", source=source,
                          key="placements")
    for i, placement in enumerate(result.placements):
        check_placement(placement, source, f"placements[{i}]")
    return Sourced(source, result)


def _derives_from(separate: Placement, entry: Sequence[Placement]) -> int | None:
    """Index of the entry-head order a separate-head placement adds its head's agent to (the same stages, the
    head appended last); the label breaks ties ("best, head in R" -> "best"), and stands in when no order matches."""
    same = [i for i, p in enumerate(entry) if p.order == separate.order[:-1]]
    named = [i for i, p in enumerate(entry) if separate.label.startswith(f"{p.label},")]
    return next((i for i in same if i in named), same[0] if same else (named[0] if named else None))


def placement_groups(result: PlaceResult) -> list[list[Placement]]:
    """The placements in drawing order: each entry-head order followed by the separate-head placements derived
    from it (the second and later in a group are the separate heads); a head that matches no order comes last."""
    entry = [p for p in result.placements if p.head != "separate"]
    groups: list[list[Placement]] = [[p] for p in entry]
    orphans: list[Placement] = []
    for p in result.placements:
        if p.head == "separate":
            base = _derives_from(p, entry)
            (orphans if base is None else groups[base]).append(p)
    return groups + [[p] for p in orphans]


def _ring(p: Placement) -> str:
    return " -> ".join([f"{name} ({region})" for name, region in zip(p.order, p.regions, strict=True)] + [p.order[0]])


def _search(result: PlaceResult) -> str:
    how = (f"all {result.evaluated} orders searched" if result.evaluated
           else "nearest neighbour + 2-opt (a local optimum)")
    median = "" if result.median_t_ring_s is None else f", median T_ring {result.median_t_ring_s * 1e3:.1f} ms"
    return how + median


def _place_rows(item: Sourced[PlaceResult]) -> list[str]:
    r = item.result
    lines = [f"{item.source}: {r.scenario}, shaper {r.shaper or DASH}, {_search(r)}.", "",
             "| source | placement | ring | T_ring (ms) | predicted (tok/s) | measured (tok/s) | error (%) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for p in (p for group in placement_groups(r) for p in group):
        lines.append(f"| {item.source} | {p.label} | {_ring(p)} | {p.t_ring_s * 1e3:.1f} | {p.predicted_tok_s:.2f} | "
                     f"{cell(p.measured_tok_s, '.2f')} | {cell(p.error_pct, '+.1f')} |")
    return lines + [""]


def plot_placement(results: Sequence[PlaceResult], path: Path) -> None:
    """fig5: the predicted rate of each placement as a bar (label and T_ring on the axis), the measured rate as a
    point on it; a separate head's bar is hatched, right under the order it adds its agent to."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    grouped = [placement_groups(result) for result in results]
    sizes = [sum(len(group) for group in groups) + BAR_GROUP_GAP * len(groups) for groups in grouped]
    figure = new_figure((FIGURE_SIZE_IN[0], max(FIGURE_SIZE_IN[1], 1.5 + BAR_HEIGHT_IN * sum(sizes))))
    for axes, result, groups in zip(figure.subplots(len(results), 1, squeeze=False,
                                                    gridspec_kw={"height_ratios": sizes})[:, 0],
                                    results, grouped, strict=True):
        y, ticks, labels, x_top = 0.0, [], [], 0.0
        for group in groups:
            base, colour = group[0], LABEL_COLOURS.get(group[0].label, OTHER_LABEL_COLOUR)
            for p in group:
                separate = p.head == "separate"
                extra = f" (+{(p.t_ring_s - base.t_ring_s) * 1e3:.1f} ms)" if p is not base else ""
                axes.barh(y, p.predicted_tok_s, height=0.8, color=colour, alpha=0.55 if separate else 0.85,
                          hatch=SEPARATE_HEAD_HATCH if separate else None, edgecolor="0.25")
                text = f"{p.predicted_tok_s:.2f}" + ("" if p.measured_tok_s is None else
                                                     f", measured {p.measured_tok_s:.2f}")
                text += "" if p.error_pct is None else f" ({p.error_pct:+.1f}%)"
                end = max(p.predicted_tok_s, p.measured_tok_s or 0.0)
                axes.annotate(text, xy=(end, y), xytext=(6, 0), textcoords="offset points", va="center",
                              fontsize="x-small")
                if p.measured_tok_s is not None:
                    axes.plot(p.measured_tok_s, y, "o", color="black", markersize=8, zorder=5)
                ticks.append(y)
                labels.append(f"{'└ ' if p is not base else ''}{p.label}\nT_ring {p.t_ring_s * 1e3:.1f} ms{extra}")
                x_top = max(x_top, end)
                y += 1.0
            y += BAR_GROUP_GAP
        axes.set_yticks(ticks, labels, fontsize="small")
        axes.invert_yaxis()
        axes.set_xlim(0, x_top * 1.45 or 1.0)
        axes.set_xlabel("single-stream decode (tok/s)")
        measured = any(p.measured_tok_s is not None for p in result.placements)
        axes.set_title(f"{result.scenario}: {_search(result)}" + (f"; measured with {result.shaper}" if measured
                                                                   else ""), fontsize="medium")
        axes.grid(True, axis="x", alpha=0.25)
        heads = {p.head for p in result.placements}
        handles = [Patch(facecolor="0.7", edgecolor="0.25", label="predicted 1/(C + T_ring), head on the entry")
                   ] if "entry" in heads else []
        if "separate" in heads:
            handles.append(Patch(facecolor="0.7", edgecolor="0.25", alpha=0.55, hatch=SEPARATE_HEAD_HATCH,
                                 label="predicted, head on its own agent (one more hop)"))
        if measured:
            handles.append(Line2D([], [], marker="o", color="black", linestyle="none", label="measured"))
        axes.legend(handles=handles, loc="lower right", fontsize="x-small")
    figure.suptitle("Placement: the ring order sets T_ring, and the rate, measured vs predicted")
    figure.savefig(path, dpi=FIGURE_DPI)


def placement_markdown(places: Sequence[Sourced[PlaceResult]]) -> list[str]:
    """The placement section's body: what is predicted, then a table per placement search."""
    lines = ["Ring orders: predicted r = 1/(C + T_ring) with T_ring the sum of the one-way latencies along the "
             "order (C emulated; for a measured order the run's measured C). A separate head's agent adds one "
             "hop after the last stage.", ""]
    for item in places:
        lines += _place_rows(item)
    return lines
