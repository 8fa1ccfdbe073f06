"""The search in the report: `testbed search --json` results (told apart by their "search" key) checked, tabled and
drawn as fig12_search_pareto.png: the fastest candidate at each $/h, the Pareto frontier and the winner."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.search.measure import SearchResult
from testbed.studies.search.spec import OBJECTIVES
from testbed.studies.style import FIGURE_DPI, WALL_COLOURS, new_figure
from testbed.studies.base import Sourced


def parse(data: dict, source: str) -> Sourced[SearchResult]:
    """A `testbed search --json` object -> a checked SearchResult; field errors become ConfigError."""
    result = record_from(SearchResult, data, source, "a search result")
    check_text(result.model, source, "model")
    check_text(result.objective, source, "objective", OBJECTIVES)
    check_count(result.scored, 1, source, "scored")
    check_count(result.refused, 0, source, "refused")
    check_number(result.seconds, source, "seconds", minimum=0.0)
    if not isinstance(result.top, tuple) or not result.top:
        raise ConfigError("expected a non-empty list of candidates", source=source, key="top")
    for key in ("top", "pareto"):
        for i, row in enumerate(getattr(result, key)):
            check_number(row.tok_s, source, f"{key}[{i}].tok_s", positive=True)
            check_number(row.cost_hour, source, f"{key}[{i}].cost_hour", minimum=0.0)
    return Sourced(source, result)


def markdown(items: Sequence[Sourced[SearchResult]]) -> list[str]:
    lines = ["Each search: candidates scored by the closed forms (which machines, the ring order of their regions, "
             "the layer split, speculation at K*), memory-infeasible ones refused with the reason; the winner against "
             "the best even split with plain decode on the fewest regions, and the winner run on virtual time (and, "
             "with --verify, on a real backend).", "",
             "| search | model | objective | scored | refused | s | winner | tok/s | $/h | vs baseline | measured "
             "tok/s (err %) | verified tok/s (vs search %, shaper) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for item in items:
        r = item.result
        w = r.top[0]
        versus = f"{w.tok_s / r.baseline.tok_s:.2f}x" if r.baseline else ""
        measured = (f"{r.confirmations[0].measured_tok_s:.3f} ({r.confirmations[0].error_pct:+.2f})"
                    if r.confirmations else "")
        v = r.verification
        verified = f"{v.measured_tok_s:.3f} ({v.vs_search_pct:+.2f}, {v.shaper})" if v is not None else ""
        lines.append(f"| {item.source} | {r.model} | {r.objective} | {r.scored:,} | {r.refused:,} | {r.seconds:.1f} | "
                     f"{w.ring}, {w.split}, {w.decode} | {w.tok_s:.2f} | {w.cost_hour:.2f} | {versus} | {measured} | "
                     f"{verified} |")
    return lines


def plot_pareto(results: Sequence[SearchResult], path: Path | str) -> None:
    """tok/s against $/h: the fastest candidate at each cost (points), the frontier (steps), the winner (star)."""
    figure = new_figure()
    ax = figure.add_subplot()
    for i, r in enumerate(results):
        colour = WALL_COLOURS[i % len(WALL_COLOURS)]
        label = Path(r.search).stem
        ax.scatter([p.cost_hour for p in r.by_cost], [p.tok_s for p in r.by_cost], s=12, color=colour, alpha=0.35,
                   label=f"{label}: the fastest at each $/h")
        ax.step([p.cost_hour for p in r.pareto], [p.tok_s for p in r.pareto], where="post", color=colour,
                label=f"{label}: Pareto frontier")
        w = r.top[0]
        ax.scatter([w.cost_hour], [w.tok_s], marker="*", s=220, color=colour, edgecolor="black", zorder=5,
                   label=f"winner ({r.objective}): {w.decode}, {w.tok_s:.1f} tok/s")
        if r.baseline is not None:
            ax.scatter([r.baseline.cost_hour], [r.baseline.tok_s], marker="s", s=70, facecolor="none",
                       edgecolor=colour, zorder=5, label="best even split, plain, co-located first")
    ax.set_xlabel("$ an hour (the machines taking part)")
    ax.set_ylabel("single-stream decode tok/s (closed form)")
    ax.set_title("Search: rate against cost (testbed search; closed forms, the winner confirmed on virtual time)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=FIGURE_DPI)
