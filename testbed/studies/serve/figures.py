"""The serve study in the report: `testbed serve` results (told apart by their "serve_rows") checked, tabled (every
rate: measured p50 / p99 beside the queueing model's, the model's error) and drawn: p50 and p99 TTFT and TPOT
against the request rate with the SLO targets and the knee (fig9_serve_latency.png), and the SLO attainment
against the rate with its target and the search's answer (fig10_serve_attainment.png)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from agents.modes.serve.slo import Goodput
from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.serve.result import COMPARISONS, ServeResult, ServeRow, ServeVariant
from testbed.studies.style import DASH, FIGURE_DPI, WALL_COLOURS, cell, new_figure
from testbed.studies.base import Sourced

# The numbers the table and the figures read from each row's measured figures (minimum 0, required).
ROW_NUMBERS: Final = tuple(f"{stat}_{latency}_ms" for latency in ("ttft", "tpot", "e2el")
                           for stat in ("median", "p99")) + ("output_throughput", "request_throughput")
PANELS: Final = (("ttft", "time to first token"), ("tpot", "time per output token"))
P99_MARKER: Final = "v"


def parse_serve(data: dict, source: str) -> Sourced[ServeResult]:
    """A `testbed serve` JSON object -> a checked ServeResult; field errors become ConfigError naming the key."""
    result = record_from(ServeResult, data, source, "a serve result")
    check_text(result.scenario, source, "scenario")
    check_count(result.cap, 1, source, "cap")
    for key in ("wall_tpot_ms", "knee_rate_req_s", "attainment_target_pct", "t_ring_s", "compute_s"):
        check_number(getattr(result, key), source, key, minimum=0.0)
    if result.goodput:
        try:
            Goodput.parse(result.goodput)
        except ValueError as exc:
            raise ConfigError(str(exc), source=source, key="goodput") from exc
    if not isinstance(result.serve_rows, tuple) or not result.serve_rows:
        raise ConfigError("expected at least one row", source=source, key="serve_rows")
    for i, row in enumerate(result.serve_rows):
        check_number(row.rate_req_s, source, f"serve_rows[{i}].rate_req_s", positive=True)
        for key in ROW_NUMBERS:
            check_number(getattr(row.measured, key), source, f"serve_rows[{i}].measured.{key}", minimum=0.0)
        check_number(row.measured.slo_attainment_pct, source, f"serve_rows[{i}].measured.slo_attainment_pct",
                     minimum=0.0, maximum=100.0, required=False)
    for i, comparison in enumerate(result.comparisons):
        check_text(comparison.kind, source, f"comparisons[{i}].kind", COMPARISONS)
    return Sourced(source, result)


def caption(result: ServeResult) -> str:
    s = result.settings
    count = f"{s.requests} requests" if s.requests else f"{s.duration_s:g} s of arrivals"
    slo = f"SLO {result.goodput} at {result.attainment_target_pct:g}%" if result.goodput else "no SLO (--goodput)"
    return (f"{result.scenario} serving ({result.stages} stages, C {result.compute_s * 1e3:.1f} ms, T_ring "
            f"{result.t_ring_s * 1e3:.1f} ms, {result.shaper}): {s.arrival} arrivals, prompt {s.prompt} "
            f"{s.prompt_tokens}, output {s.output} {s.output_tokens}, {count}, seed {s.seed}, cap {result.cap}; "
            f"wall TPOT {result.wall_tpot_ms:.1f} ms, solo TTFT {result.light_ttft_ms:.1f} ms, knee "
            f"{result.knee_rate_req_s:.4g} req/s; {slo}. Cells: measured / model (model's error)")


def workload_line(result: ServeResult) -> str:
    """The workload a figure shows, in one line (a benchmark names its workload beside every figure)."""
    s = result.settings
    count = f"{s.requests} requests" if s.requests else f"{s.duration_s:g} s of arrivals"
    return (f"{result.scenario}: {s.arrival} arrivals, prompt {s.prompt_tokens}, output {s.output_tokens}, {count}, "
            f"seed {s.seed}, cap {result.cap}")


def cell_pair(row: ServeRow, percentile: str, latency: str) -> str:
    """"measured / predicted (+e%)" of one percentile of one latency, in ms."""
    measured, predicted = row.figure(percentile, latency), row.figure(percentile, latency, predicted=True)
    error = getattr(row.model_error_pct, f"{percentile}_{latency}") if row.model_error_pct is not None else None
    return (f"{measured:.1f} / {cell(predicted, '.1f')}" + (f" ({error:+.1f}%)" if error is not None else ""))


def search_line(result: ServeResult) -> str:
    s = result.search
    if s is None:
        return ""
    found = f"{s.highest_met_req_s:.4g} req/s" if s.highest_met_req_s is not None else "none"
    return (f"Search: the highest rate with at least {s.target_pct:g}% of requests meeting {result.goodput}: "
            f"{found} ({s.runs} runs from the knee {s.knee_rate_req_s:.4g} req/s; {s.reason}).")


def result_markdown(result: ServeResult, source: str) -> list[str]:
    """One result's caption, its table (a row per rate), its search and its comparisons."""
    lines = [f"{source}: {caption(result)}.", "",
             "| rate (req/s) | done | p50 TTFT (ms) | p99 TTFT (ms) | p50 TPOT (ms) | p99 TPOT (ms) | p50 E2EL (ms) | "
             "p99 E2EL (ms) | output (tok/s) | goodput (req/s) | attainment (%) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result.serve_rows:
        m = row.measured
        pairs = " | ".join(cell_pair(row, pct, lat) for lat in ("ttft", "tpot", "e2el") for pct in ("p50", "p99"))
        lines.append(f"| {row.rate_req_s:.4g} | {m.completed} | {pairs} | {m.output_throughput:.2f} | "
                     f"{cell(m.request_goodput, '.3f')} | {cell(m.slo_attainment_pct, '.1f')} |")
    lines.append("")
    if result.search is not None:
        lines += [search_line(result), ""]
    if result.comparisons:
        lines += ["| comparison | ring | T_ring (ms) | knee (req/s) | highest rate in SLO (req/s) | at (req/s) | "
                  "p50 TTFT (ms) | p50 TPOT (ms) | attainment (%) | note |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for c in result.comparisons:
            if not c.variants:
                lines.append(f"| {c.title} | {DASH} | | | | | | | | {c.note} |")
            lines += [f"| {c.title} | {comparison_cells(v)} | {c.note if i == 0 else ''} |"
                      for i, v in enumerate(c.variants)]
        lines.append("")
    return lines


def comparison_cells(v: ServeVariant) -> str:
    """A comparison's variant: its ring, and the run it is judged by (the search's highest rate meeting the SLO, a
    lower bound "≥" where no rate missed; without a search its one run)."""
    if v.search is None:
        row, found = max(v.rows, key=lambda r: r.rate_req_s, default=None), DASH
    else:
        row = next((r for r in v.rows if r.rate_req_s == v.search.highest_met_req_s), None)
        bound = v.search.lowest_missed_req_s is None and v.search.highest_met_req_s is not None
        found = ("≥ " if bound else "") + cell(v.search.highest_met_req_s, ".4g")
    m = row.measured if row is not None else None
    return (f"{v.label} | {v.t_ring_s * 1e3:.1f} | {v.knee_rate_req_s:.4g} | {found} | "
            f"{cell(row and row.rate_req_s, '.4g')} | {cell(m and m.median_ttft_ms, '.1f')} | "
            f"{cell(m and m.median_tpot_ms, '.1f')} | {cell(m and m.slo_attainment_pct, '.1f')}")


def serve_markdown(items: Sequence[Sourced[ServeResult]]) -> list[str]:
    """The serving section's body: what is measured and predicted, then each result's tables."""
    lines = ["Each rate is one run of a seeded open-loop workload (the serve mode); the figures are vLLM's "
             "(`vllm bench serve`), computed from the requests' records. The model is the queueing model of "
             "agents.modes.serve.queueing; its error is (model / measured - 1) x 100 per percentile.", ""]
    for item in items:
        lines += result_markdown(item.result, item.source)
    return lines


def _targets(result: ServeResult) -> dict[str, float | None]:
    goodput = Goodput.parse(result.goodput) if result.goodput else Goodput()
    return {"ttft": goodput.ttft_ms, "tpot": goodput.tpot_ms}


def plot_latency(results: Sequence[ServeResult], path: Path) -> None:
    """p50 (circles) and p99 (triangles) TTFT (left, log scale: past the knee the queue grows without bound) and
    TPOT (right, around the wall) against the request rate, measured as points, the queueing model's as lines; the
    SLO target as a dashed line where --goodput gave one, the model's knee as a dotted vertical, and on TPOT the
    wall C + T_ring."""
    figure = new_figure()
    panels = dict(zip((name for name, _ in PANELS), figure.subplots(1, 2), strict=True))
    for index, result in enumerate(results):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        rows = sorted(result.serve_rows, key=lambda r: r.rate_req_s)
        rates = [r.rate_req_s for r in rows]
        name = f"{result.scenario}, " if len(results) > 1 else ""
        for latency, axes in panels.items():
            for percentile, marker, style in (("p50", "o", "-"), ("p99", P99_MARKER, "--")):
                axes.plot(rates, [r.figure(percentile, latency) for r in rows], marker, color=colour, markersize=7,
                          linestyle="none", label=f"{name}{percentile} measured", zorder=5)
                model = [(r.rate_req_s, r.figure(percentile, latency, predicted=True)) for r in rows
                         if r.predicted is not None]
                if model:
                    axes.plot(*zip(*model, strict=True), style, color=colour, linewidth=1.5, alpha=0.8,
                              label=f"{name}{percentile} model")
            target = _targets(result)[latency]
            if target is not None:
                axes.axhline(target, color="tab:red", linestyle="--", linewidth=1.2, label=f"{name}SLO {target:g} ms")
            axes.axvline(result.knee_rate_req_s, color=colour, linestyle=":", linewidth=1.2,
                         label=f"{name}knee {result.knee_rate_req_s:.3g} req/s")
        panels["tpot"].axhline(result.wall_tpot_ms, color="0.5", linestyle="-.", linewidth=1,
                               label=f"{name}wall C + T_ring {result.wall_tpot_ms:.0f} ms")
    for (latency, title), axes in zip(PANELS, panels.values(), strict=True):
        axes.set_xlabel("request rate (req/s)")
        axes.set_ylabel(f"{title} (ms{', log scale' if latency == 'ttft' else ''})")
        axes.set_title(title.capitalize(), fontsize="medium")
        axes.grid(True, which="both", alpha=0.25)
        axes.legend(loc="best", fontsize="x-small")
    panels["ttft"].set_yscale("log")
    panels["tpot"].margins(y=0.15)  # near the wall: the convoy's per-token cost and the join wait are a few %
    shapers = ", ".join(sorted({r.shaper for r in results}))
    dilations = sorted({row.dilation for r in results for row in r.serve_rows})
    how = shapers + ("" if dilations == [1.0] else f", D {'/'.join(f'{d:g}' for d in dilations)}")
    workload = f"\n{workload_line(results[0])}" if len(results) == 1 else ""
    figure.suptitle(f"Serving: p50 and p99 latency vs request rate, measured ({how}) vs the queueing model{workload}",
                    fontsize="medium")
    figure.savefig(path, dpi=FIGURE_DPI)


def plot_attainment(results: Sequence[ServeResult], path: Path) -> None:
    """SLO attainment (the share of requests meeting every --goodput target) against the request rate, the target
    share as a dashed line, the knee dotted, and the search's highest rate meeting the target as a star."""
    figure = new_figure()
    axes = figure.add_subplot()
    for index, result in enumerate(results):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        rows = sorted((r for r in result.serve_rows if r.measured.slo_attainment_pct is not None),
                      key=lambda r: r.rate_req_s)
        name = f"{result.scenario}: " if len(results) > 1 else ""
        axes.plot([r.rate_req_s for r in rows], [r.measured.slo_attainment_pct for r in rows], "o-", color=colour,
                  markersize=7, label=f"{name}attainment ({result.goodput})")
        axes.axvline(result.knee_rate_req_s, color=colour, linestyle=":", linewidth=1.2,
                     label=f"{name}knee {result.knee_rate_req_s:.3g} req/s")
        found = result.search.highest_met_req_s if result.search is not None else None
        if found is not None:
            axes.plot([found], [next(r.measured.slo_attainment_pct for r in rows if r.rate_req_s == found)], "*",
                      color="black", markersize=16, zorder=6, label=f"{name}highest rate meeting it: {found:.4g} req/s")
        axes.axhline(result.attainment_target_pct, color="tab:red", linestyle="--", linewidth=1.2,
                     label=f"{name}target {result.attainment_target_pct:g}%")
    axes.set_ylim(-2, 102)
    axes.set_xlabel("request rate (req/s)")
    axes.set_ylabel("SLO attainment (% of requests meeting every target)")
    axes.set_title("SLO attainment vs request rate (DistServe's goodput: the highest rate at the target)"
                   + (f"\n{workload_line(results[0])}" if len(results) == 1 else ""), fontsize="medium")
    axes.grid(True, alpha=0.25)
    axes.legend(loc="best", fontsize="small")
    figure.savefig(path, dpi=FIGURE_DPI)
