"""The report's speculation-at-a-distance section: `testbed dsd` results checked, tabled and drawn.

A DSD result (`dsd SCENARIO --json F`, told apart by its "dsd_rows") becomes fig8_dsd.png: (left) the per-request
latency of co-located SD, synchronous and pipelined DSD and cloud autoregressive decoding vs the edge RTT, measured
points next to predicted lines, the pipelined crossover marked; (right) the capacity of a server verifying only,
aggregate tok/s vs edge clients, next to the co-located server's rate and that rate times 1 + K t_d / t_v. The
tables: latency per RTT with both crossovers, capacity per client count, and synchronous DSD on a jittery link.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from testbed.core.decode import BATCHING
from testbed.core.errors import ConfigError
from testbed.studies.dsd.measure import CapacityRow, DsdResult, DsdRow
from testbed.studies.style import DASH, FIGURE_DPI, FIGURE_SIZE_IN, WALL_COLOURS, cell, new_figure
# one set of number/count/text checks for the report's sections, so their messages read alike
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.base import Sourced

DSD_FIGURE_SIZE_IN: Final = (15.0, FIGURE_SIZE_IN[1])  # two panels side by side
SHARE_MAX: Final = 1.5  # hit rate and server busy are measured shares: timing may put them a little over 1
POSITIVE: Final = {"positive": True}
NON_NEGATIVE: Final = {"minimum": 0.0}
SHARE: Final = {"minimum": 0.0, "maximum": SHARE_MAX}
ACCEPTANCE: Final = {"minimum": 0.0, "maximum": 1.0, "required": False}  # null: no round measured it
# (fields, how each is checked) per record; latencies sit on fig8's axes, the rest are rates, times and shares.
DSD_ROW_NUMBERS: Final = (
    (("colocated_ms", "colocated_predicted_ms", "sync_ms", "sync_predicted_ms", "pipelined_ms",
      "pipelined_predicted_ms", "autoregressive_ms", "autoregressive_predicted_ms"), POSITIVE),
    (("rtt_ms", "draft_ms_per_token", "verify_ms"), NON_NEGATIVE), (("hit_rate",), SHARE),
    (("alpha_hat",), ACCEPTANCE))
CAPACITY_NUMBERS: Final = (
    (("aggregate_tok_s", "predicted_aggregate_tok_s", "per_client_tok_s", "batch_mean", "verify_ms"), NON_NEGATIVE),
    (("server_busy",), SHARE))
JITTER_NUMBERS: Final = (
    (("request_ms", "predicted_request_ms"), POSITIVE),
    (("rtt_ms", "jitter_ms", "draft_ms_per_token", "verify_ms", "round_ms"), NON_NEGATIVE), (("error_pct",), {}),
    (("alpha_hat",), ACCEPTANCE))
RESULT_NUMBERS: Final = (
    (("crossover_predicted_rtt_ms", "colocated_tok_s", "multiplier_predicted", "target_tok_s"), NON_NEGATIVE),
    (("crossover_rtt_ms", "ar_crossover_rtt_ms", "multiplier_measured"), {"minimum": 0.0, "required": False}),
    (("ar_crossover_predicted_rtt_ms",), {}))  # negative: synchronous DSD never beats cloud AR
# fig8's left panel: (DsdRow field prefix, label, colour) per way of serving a request.
MODES: Final = (("colocated", "co-located SD", "tab:green"), ("sync", "synchronous DSD", "tab:orange"),
                ("pipelined", "pipelined DSD", "tab:blue"), ("autoregressive", "cloud AR", "tab:red"))
RESULT_MARKERS: Final = ("o", "s", "^", "v", "P", "X")  # one per DSD result on the latency panel
BATCHED_MARKER: Final = "D"
CROSSOVER_STYLES: Final = (("measured", ":"), ("predicted", "--"))


# ---------------------------------------------------------------- loading and validation


def _check_numbers(record: Any, rules: tuple, source: str, where: str) -> None:
    for keys, how in rules:
        for key in keys:
            check_number(getattr(record, key), source, f"{where}{key}", **how)


def _check_rows(result: DsdResult, key: str, source: str, *, non_empty: bool) -> tuple:
    rows = getattr(result, key)
    if not isinstance(rows, tuple):
        raise ConfigError(f"expected a list of rows, got {rows!r}", source=source, key=key)
    if non_empty and not rows:
        raise ConfigError("expected at least one row", source=source, key=key)
    return rows


def parse_dsd(data: dict, source: str) -> Sourced[DsdResult]:
    """A `testbed dsd` JSON object -> a checked DsdResult; field errors become ConfigError naming the field."""
    result = record_from(DsdResult, data, source, "a DSD result")
    check_text(result.scenario, source, "scenario")
    check_text(result.shaper, source, "shaper", empty_ok=True)
    check_count(result.k, 1, source, "k")
    check_count(result.tokens, 1, source, "tokens")
    _check_numbers(result, RESULT_NUMBERS, source, "")
    for key in ("clients_colocated", "clients_offloaded"):
        check_count(getattr(result, key), 0, source, key)
    for i, row in enumerate(_check_rows(result, "dsd_rows", source, non_empty=True)):
        _check_numbers(row, DSD_ROW_NUMBERS, source, f"dsd_rows[{i}].")
    for i, row in enumerate(_check_rows(result, "capacity", source, non_empty=False)):
        check_count(row.clients, 1, source, f"capacity[{i}].clients")
        check_text(row.batching, source, f"capacity[{i}].batching", BATCHING)
        _check_numbers(row, CAPACITY_NUMBERS, source, f"capacity[{i}].")
    for i, row in enumerate(_check_rows(result, "jitter", source, non_empty=False)):
        _check_numbers(row, JITTER_NUMBERS, source, f"jitter[{i}].")
    return Sourced(source, result)


# ---------------------------------------------------------------- what is drawn, in which order


def dsd_series(result: DsdResult) -> list[DsdRow]:
    """The latency rows by RTT (fig8's x)."""
    return sorted(result.dsd_rows, key=lambda row: row.rtt_ms)


def capacity_series(result: DsdResult) -> dict[str, list[CapacityRow]]:
    """The capacity rows per batching ("none" first, as measured), each by client count (fig8's right x)."""
    series: dict[str, list[CapacityRow]] = {}
    for row in sorted(result.capacity, key=lambda row: row.batching != "none"):
        series.setdefault(row.batching, []).append(row)
    return {batching: sorted(rows, key=lambda row: row.clients) for batching, rows in series.items()}


def crossover_text(measured: float | None, predicted: float) -> str:
    """"measured / predicted" RTT of a crossover; null measured is off the grid, predicted <= 0 is never."""
    left = "not on the grid" if measured is None else f"{measured:.1f} ms"
    return f"{left} / " + (f"never ({predicted:.1f} ms)" if predicted <= 0 else f"{predicted:.1f} ms")


# ---------------------------------------------------------------- markdown


def _pair(measured: float, predicted: float) -> str:
    return f"{measured:.0f} / {predicted:.0f}"


def _latency_rows(item: Sourced[DsdResult]) -> list[str]:
    r = item.result
    lines = ["", f"{item.source}: {r.scenario}, K = {r.k}, {r.tokens} tokens a request, shaper {r.shaper or DASH}.",
             "", "| source | RTT (ms) | co-located (ms) | sync DSD (ms) | pipelined DSD (ms) | cloud AR (ms) | α̂ "
             "| t_d (ms) | t_v (ms) | hit rate |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in dsd_series(r):
        modes = " | ".join(_pair(getattr(row, f"{mode}_ms"), getattr(row, f"{mode}_predicted_ms"))
                           for mode, _, _ in MODES)
        lines.append(f"| {item.source} | {row.rtt_ms:g} | {modes} | {cell(row.alpha_hat, '.3f')} | "
                     f"{row.draft_ms_per_token:.2f} | {row.verify_ms:.2f} | {row.hit_rate:.2f} |")
    return lines + ["", "- crossover RTT (measured / predicted): pipelined DSD beats co-located SD below "
                    f"{crossover_text(r.crossover_rtt_ms, r.crossover_predicted_rtt_ms)}; synchronous DSD beats "
                    f"cloud AR below {crossover_text(r.ar_crossover_rtt_ms, r.ar_crossover_predicted_rtt_ms)}"]


def _capacity_rows(item: Sourced[DsdResult]) -> list[str]:
    r = item.result
    if not r.capacity:
        return ["", f"{item.source}: no capacity runs (`dsd --clients`)."]
    lines = ["", f"{item.source}: capacity, the server verifying only with the drafts on the edge clients "
             f"(co-located server: {r.colocated_tok_s:.1f} tok/s).", "",
             "| source | clients | batching | aggregate (tok/s) meas / pred | per client (tok/s) | server busy "
             "| batch | t_v (ms) |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for row in (row for rows in capacity_series(r).values() for row in rows):
        lines.append(f"| {item.source} | {row.clients} | {row.batching} | {row.aggregate_tok_s:.1f} / "
                     f"{row.predicted_aggregate_tok_s:.1f} | {row.per_client_tok_s:.1f} | {row.server_busy:.0%} | "
                     f"{row.batch_mean:.2f} | {row.verify_ms:.1f} |")
    return lines + ["", f"- multiplier: {cell(r.multiplier_measured, '.2f')} measured (the most clients without "
                    f"batching over the co-located server), 1 + K t_d / t_v = {r.multiplier_predicted:.2f} predicted",
                    f"- clients sustained at {r.target_tok_s:.1f} tok/s a client: {r.clients_colocated} with the "
                    f"server drafting for them, {r.clients_offloaded} with the drafts offloaded (of those measured)"]


def _jitter_rows(item: Sourced[DsdResult]) -> list[str]:
    lines = ["", f"{item.source}: synchronous DSD on a jittery edge link against the jitter-free closed form.", "",
             "| source | RTT (ms) | jitter (ms) | request (ms) meas / pred | error (%) | round (ms) | α̂ | t_d (ms) "
             "| t_v (ms) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in item.result.jitter:
        lines.append(f"| {item.source} | {row.rtt_ms:g} | {row.jitter_ms:g} | "
                     f"{_pair(row.request_ms, row.predicted_request_ms)} | {row.error_pct:+.1f} | {row.round_ms:.1f} "
                     f"| {cell(row.alpha_hat, '.3f')} | {row.draft_ms_per_token:.2f} | {row.verify_ms:.2f} |")
    return lines


def dsd_markdown(items: Sequence[Sourced[DsdResult]]) -> list[str]:
    """The speculation-at-a-distance section's body: what is predicted, then each result's tables."""
    lines = ["Per edge RTT, one request each way, measured / predicted (ms): co-located SD and cloud AR are the "
             "server's own closed forms plus the RTT once; synchronous and pipelined DSD physics.dsd_round_s with "
             "the run's t_d, t_v and hit rate. Capacity: aggregate tok/s of edge clients drafting for one server "
             "verifying, against the co-located server's rate times 1 + K t_d / t_v."]
    for item in items:
        lines += _latency_rows(item) + _capacity_rows(item)
        if item.result.jitter:
            lines += _jitter_rows(item)
    return lines


# ---------------------------------------------------------------- figures


def _plot_latency(axes, results: Sequence[DsdResult]) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour, marker="o", label=label) for _, label, colour in MODES]
    for index, result in enumerate(results):
        rows, marker = dsd_series(result), RESULT_MARKERS[index % len(RESULT_MARKERS)]
        rtts = [row.rtt_ms for row in rows]
        for mode, _, colour in MODES:
            axes.plot(rtts, [getattr(row, f"{mode}_ms") for row in rows], marker, color=colour, markersize=7,
                      zorder=5)
            # a "_" tick on each predicted point keeps a one-RTT sweep's prediction visible
            axes.plot(rtts, [getattr(row, f"{mode}_predicted_ms") for row in rows], "-", marker="_",
                      markersize=14, color=colour, linewidth=1.6)
        if len(results) > 1:
            handles.append(Line2D([], [], color="0.4", marker=marker, linestyle="none", label=result.scenario))
    ticks = sorted({row.rtt_ms for result in results for row in result.dsd_rows})
    if ticks[0] > 0:
        axes.set_xscale("log")
    else:  # symlog: log where the sweep is, linear below its smallest RTT down to an RTT of 0
        axes.set_xscale("symlog", linthresh=min((t for t in ticks if t > 0), default=1.0))
    low, high = axes.get_xlim()  # the sweep's: a crossover far off it would squeeze the sweep into a corner
    for result in results:
        name = f"{result.scenario}: " if len(results) > 1 else ""
        for (what, style), value in zip(CROSSOVER_STYLES, (result.crossover_rtt_ms, result.crossover_predicted_rtt_ms)):
            if value is None or value <= 0:
                continue
            inside = low <= value <= high
            if inside:
                axes.axvline(value, color="tab:blue", linestyle=style, linewidth=1.2)
            handles.append(Line2D([], [], color="tab:blue", linestyle=style, label=f"{name}pipelined crossover "
                                  f"{what}: {value:.1f} ms" + ("" if inside else " (off the RTT axis)")))
    axes.set_xlim(low, high)
    handles += [Line2D([], [], color="0.4", marker="o", linestyle="none", label="measured"),
                Line2D([], [], color="0.4", marker="_", markersize=14, label="predicted")]
    axes.set_xticks(ticks, [f"{t:g}" for t in ticks])
    axes.set_xticks([], minor=True)
    axes.set_xlabel("edge round-trip time (ms, log scale)")
    axes.set_ylabel("per-request latency (ms)")
    axes.set_title("Per-request latency vs edge RTT: measured (points), predicted (lines)", fontsize="medium")
    axes.grid(True, alpha=0.25)
    axes.legend(handles=handles, loc="best", fontsize="x-small")


def _plot_capacity(axes, results: Sequence[DsdResult]) -> None:
    from matplotlib.lines import Line2D

    handles, batched = [], set()
    for index, result in enumerate(results):
        colour = WALL_COLOURS[index % len(WALL_COLOURS)]
        name = f"{result.scenario}: " if len(results) > 1 else ""
        for batching, rows in capacity_series(result).items():
            clients = [row.clients for row in rows]
            if batching == "none":
                axes.plot(clients, [row.aggregate_tok_s for row in rows], "o", color=colour, markersize=7, zorder=5)
                axes.plot(clients, [row.predicted_aggregate_tok_s for row in rows], "-", color=colour, linewidth=1.6)
                continue
            batched.add(batching)
            axes.plot(clients, [row.aggregate_tok_s for row in rows], BATCHED_MARKER, color=colour, markersize=9,
                      markeredgecolor="black", zorder=6)
            axes.plot(clients, [row.predicted_aggregate_tok_s for row in rows], BATCHED_MARKER, color=colour,
                      markerfacecolor="none", markersize=11, zorder=6)
        multiplied = result.colocated_tok_s * result.multiplier_predicted
        axes.axhline(result.colocated_tok_s, color=colour, linestyle="-.", linewidth=1.2)
        axes.axhline(multiplied, color=colour, linestyle="--", linewidth=1.2)
        handles += [Line2D([], [], color=colour, linestyle="-.",
                           label=f"{name}co-located server: {result.colocated_tok_s:.1f} tok/s"),
                    Line2D([], [], color=colour, linestyle="--", label=f"{name}co-located x (1 + K t_d / t_v = "
                           f"{result.multiplier_predicted:.2f}): {multiplied:.1f} tok/s")]
    handles += [Line2D([], [], color="0.4", marker="o", linestyle="none", label="measured, batching none"),
                Line2D([], [], color="0.4", label="predicted, batching none")]
    for batching in sorted(batched):
        handles += [Line2D([], [], color="0.4", marker=BATCHED_MARKER, markeredgecolor="black", linestyle="none",
                           label=f"measured, batching {batching}"),
                    Line2D([], [], color="0.4", marker=BATCHED_MARKER, markerfacecolor="none", linestyle="none",
                           label=f"predicted, batching {batching}")]
    ticks = sorted({row.clients for result in results for row in result.capacity})
    if ticks:
        axes.set_xticks(ticks, [str(t) for t in ticks])
    else:
        axes.text(0.5, 0.5, "no capacity runs (dsd --clients)", ha="center", va="center", transform=axes.transAxes)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("edge clients drafting")
    axes.set_ylabel("aggregate decode (tok/s)")
    axes.set_title("Capacity: one server verifying only, the drafts offloaded", fontsize="medium")
    axes.grid(True, alpha=0.25)
    axes.legend(handles=handles, loc="best", fontsize="x-small")


def plot_dsd(results: Sequence[DsdResult], path: Path) -> None:
    """fig8: (left) per-request latency vs edge RTT per way of serving it, the pipelined crossover measured dotted
    and predicted dashed; (right) aggregate tok/s vs edge clients, the co-located rate and its 1 + K t_d / t_v."""
    figure = new_figure(DSD_FIGURE_SIZE_IN)
    latency, capacity = figure.subplots(1, 2)
    _plot_latency(latency, results)
    _plot_capacity(capacity, results)
    where = ", ".join(dict.fromkeys(f"{r.scenario} (K = {r.k}, {r.tokens} tokens, {r.shaper or DASH})"
                                    for r in results))
    figure.suptitle(f"Speculation at a distance on {where}")
    figure.savefig(path, dpi=FIGURE_DPI)
