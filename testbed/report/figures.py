"""The report's run figures: the wall (seed 000 Figure 1) and r_spec vs K (Figure 2) from RunSummary lists."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from testbed.core.physics import spec_rate, wall_rate
from testbed.core.summary import RunSummary
from testbed.studies.style import CURVE_POINTS, FIGURE_DPI, WALL_COLOURS, new_figure

# Runs whose C differ by less than this (relative) share one predicted wall curve.
COMPUTE_GROUP_REL_TOL: Final = 0.15
# Speculative runs are grouped per alpha in bins of this width (the paper's curves are 0.6, 0.7, ...).
ALPHA_BIN: Final = 0.05
SPEC_MIN_K_AXIS: Final = 24

# Seed 000's stated parameters: Figure 1 ceilings, and Figure 2's 280 ms ring.
PAPER_R0_TOK_S: Final = (30.0, 120.0)
PAPER_COMPUTE_S: Final = 0.033
PAPER_DRAFT_PER_TOKEN_S: Final = 0.005
PAPER_T_RING_S: Final = 0.280
PAPER_ALPHAS: Final = (0.6, 0.7, 0.8, 0.9)
PAPER_T_MIN_MS: Final = 0.1
PAPER_T_MAX_MS: Final = 600.0

SPEC_COLOURS: Final = ("tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:cyan")


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def group_by_compute(summaries: Sequence[RunSummary],
                     rel_tol: float = COMPUTE_GROUP_REL_TOL) -> list[list[RunSummary]]:
    """Runs clustered by C (sorted; a new group starts when C exceeds the group's first by rel_tol)."""
    groups: list[list[RunSummary]] = []
    for summary in sorted(summaries, key=lambda s: s.compute_s):
        if groups and summary.compute_s <= groups[-1][0].compute_s * (1.0 + rel_tol) + 1e-6:
            groups[-1].append(summary)
        else:
            groups.append([summary])
    return groups


def group_spec_runs(summaries: Sequence[RunSummary]) -> list[list[RunSummary]]:
    """Speculative runs per (alpha bin, T_ring to 0.1 ms, C group): one predicted r_spec(K) curve each."""
    spec_runs = [s for s in summaries if s.is_speculative and s.spec is not None]
    groups: list[list[RunSummary]] = []
    for compute_group in group_by_compute(spec_runs):
        keyed: dict[tuple[int, float], list[RunSummary]] = {}
        for run in compute_group:
            keyed.setdefault((round(run.spec.alpha / ALPHA_BIN), round(run.t_ring_s * 1e3, 1)), []).append(run)
        groups += [sorted(keyed[key], key=lambda s: s.spec.k) for key in sorted(keyed)]
    return groups


def measured_k_points(summary: RunSummary) -> list[tuple[float, float]]:
    """(K, measured r_spec) of a speculative run: one point per K of a sweep, else one at its (mean) K."""
    if summary.spec.per_k:
        return [(row.k, row.measured_tok_s) for row in summary.spec.per_k]
    return [(summary.spec.k, summary.measured_tok_s)]


def _log_grid(low: float, high: float, n: int = CURVE_POINTS) -> list[float]:
    a, b = math.log10(low), math.log10(high)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def plot_wall(summaries: Sequence[RunSummary], path: Path) -> None:
    """Figure 1: measured rate vs T_ring over 1/(C + T_ring) per measured C, with the paper's two ceilings.

    The closed forms are evaluated only along a hypothetical T_ring range, to draw the curves; the points
    are the runs' own figures.
    """
    from matplotlib.ticker import FuncFormatter

    figure = new_figure()
    axes = figure.add_subplot()
    t_values_ms = [s.t_ring_s * 1e3 for s in summaries if s.t_ring_s > 0]
    t_min_ms = min([PAPER_T_MIN_MS] + [t / 2 for t in t_values_ms])
    t_max_ms = max([PAPER_T_MAX_MS] + [t * 2 for t in t_values_ms])
    grid_ms = _log_grid(t_min_ms, t_max_ms)

    for r0, style in zip(PAPER_R0_TOK_S, ("--", ":"), strict=True):
        axes.plot(grid_ms, [wall_rate(1.0 / r0, t / 1e3) for t in grid_ms], style, color="0.55", linewidth=1.2,
                  label=f"paper, r0 = {r0:g} tok/s (C = {1e3 / r0:.1f} ms)")

    y_top = max(PAPER_R0_TOK_S) * 1.05
    for index, group in enumerate(group_by_compute(summaries)):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        compute_s = _mean(s.compute_s for s in group)
        axes.plot(grid_ms, [wall_rate(compute_s, t / 1e3) for t in grid_ms], "-", color=colour, linewidth=2,
                  label=f"predicted 1/(C + T_ring), C = {compute_s * 1e3:.1f} ms")
        y_top = max(y_top, wall_rate(compute_s, t_min_ms / 1e3) * 1.05)
        for speculative, marker, fill in ((False, "o", colour), (True, "^", "none")):
            runs = [s for s in group if s.is_speculative == speculative]
            if not runs:
                continue
            label = (f"measured speculative (off the wall), C = {compute_s * 1e3:.1f} ms" if speculative
                     else f"measured, C = {compute_s * 1e3:.1f} ms")
            axes.plot([max(s.t_ring_s * 1e3, t_min_ms) for s in runs], [s.measured_tok_s for s in runs], marker,
                      color=colour, markerfacecolor=fill, markersize=8, markeredgewidth=1.5, linestyle="none",
                      label=label, zorder=5)
            y_top = max(y_top, max(s.measured_tok_s for s in runs) * 1.1)

    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axes.set_xlim(t_min_ms, t_max_ms)
    axes.set_ylim(0, y_top)
    axes.set_xlabel("ring latency T_ring (ms, log scale)")
    axes.set_ylabel("single-stream decode (tok/s)")
    axes.set_title("The wall: r = 1/(C + T_ring), measured vs predicted")
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(loc="upper right", fontsize="small")
    if any(s.t_ring_s == 0 for s in summaries):
        axes.annotate("T_ring = 0 runs drawn at the left edge", xy=(0.01, 0.01), xycoords="axes fraction",
                      fontsize="x-small", color="0.4")
    figure.savefig(path, dpi=FIGURE_DPI)


def _k_star_label(group: Sequence[RunSummary]) -> str:
    stars = sorted({s.spec.k_star for s in group})
    return f"K* = {stars[0]}" if len(stars) == 1 else f"K* = {stars[0]}..{stars[-1]}"


def plot_spec(summaries: Sequence[RunSummary], path: Path) -> None:
    """Figure 2: measured r_spec vs K per alpha over Gamma(a, K) / (K c_d + C + T_ring), each run's K* marked."""
    groups = group_spec_runs(summaries)
    figure = new_figure()
    axes = figure.add_subplot()
    runs = [s for g in groups for s in g]
    k_max = math.ceil(max([SPEC_MIN_K_AXIS, *(k + 4 for s in runs for k, _ in measured_k_points(s)),
                           *(s.spec.k_star + 1 for s in runs)]))
    ks = list(range(1, k_max + 1))

    if any(abs(s.t_ring_s - PAPER_T_RING_S) <= 0.1 * PAPER_T_RING_S for s in runs):
        for alpha in PAPER_ALPHAS:
            axes.plot(ks, [spec_rate(alpha, k, PAPER_DRAFT_PER_TOKEN_S, PAPER_COMPUTE_S, PAPER_T_RING_S) for k in ks],
                      ":", color="0.6", linewidth=1)
        axes.plot([], [], ":", color="0.6", label="paper, α = 0.6..0.9 (280 ms, C 33 ms, c_d 5 ms)")

    walls: dict[float, float] = {}  # each group's no-speculation prediction (the summaries'), by rate
    y_top = 0.0
    for index, group in enumerate(groups):
        colour = SPEC_COLOURS[index % len(SPEC_COLOURS)]
        alpha = _mean(s.spec.alpha for s in group)
        compute_s = _mean(s.spec.verify_compute_s for s in group)
        t_ring_s = _mean(s.t_ring_s for s in group)
        draft_per_token_s = _mean(s.spec.draft_per_token_s for s in group)
        curve = [spec_rate(min(alpha, 1.0), k, draft_per_token_s, compute_s, t_ring_s) for k in ks]
        axes.plot(ks, curve, "-", color=colour, linewidth=2,
                  label=f"predicted α = {alpha:.2f} (T_ring {t_ring_s * 1e3:.0f} ms, C {compute_s * 1e3:.1f} ms, "
                        f"c_d {draft_per_token_s * 1e3:.1f} ms), {_k_star_label(group)}")
        stars = sorted({(s.spec.k_star, s.spec.k_star_tok_s) for s in group})
        axes.plot([k for k, _ in stars], [rate for _, rate in stars], "x", color=colour, markersize=8,
                  linestyle="none")
        points = [point for s in group for point in measured_k_points(s)]
        axes.plot([k for k, _ in points], [rate for _, rate in points], "o", color=colour, markersize=8,
                  linestyle="none", label=f"measured, α ≈ {alpha:.2f}", zorder=5)
        y_top = max(y_top, max(curve), max(rate for _, rate in points), max(rate for _, rate in stars))
        wall = _mean(s.spec.plain_predicted_tok_s for s in group)
        walls[round(wall, 2)] = wall
    for wall in walls.values():
        axes.axhline(wall, color="0.3", linestyle="--", linewidth=1)
        axes.annotate(f"no speculation, 1/(C + T_ring) = {wall:.2f}", xy=(k_max, wall), xytext=(-4, 3),
                      textcoords="offset points", ha="right", fontsize="x-small", color="0.3")

    axes.set_xlim(1, k_max)
    axes.set_ylim(0, y_top * 1.15)
    axes.set_xlabel("draft length K (tokens per round)")
    axes.set_ylabel("effective decode r_spec (tok/s)")
    axes.set_title("Speculation: r_spec = Γ(α, K) / (K c_d + C + T_ring), measured vs predicted")
    axes.grid(True, alpha=0.25)
    axes.legend(loc="upper left", fontsize="x-small")
    figure.savefig(path, dpi=FIGURE_DPI)
