"""Pure renderers of a RunSummary (None: nothing measured yet) for the terminal: frame, status line, final table."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from dashboards.overlap import overlap_line, overlap_parts, overlap_table
from dashboards.serve import serve_line, serve_parts, serve_table
from dashboards.streams import streams_line, streams_parts, streams_table
from dashboards.style import error_style as _error_style
from dashboards.style import stage_names as _stage_names
from dashboards.plots import DASH, PLOT_MAX_ROWS, PLOT_MIN_ROWS, sparkline, wall_plot
from testbed.core.summary import RunSummary

WIDE_WIDTH: Final = 120  # from here on: full link names, deltas, the evaluated formula
MIN_WIDTH: Final = 20
TINY_HEIGHT: Final = 8  # below this only the title bar and the rate are worth showing
TABLE_GAP: Final = 3  # columns between the hop and the stage table when they sit side by side
PHASE_STYLES: Final = {"plain": "bold cyan", "speculative": "bold magenta", "done": "bold green"}

# Display order of the sections; they are chosen by priority (list order in render) until the height is used.
# A run has speculation or one mode's own line (streams, serve), never two: they share a place.
ORDER_HEADER, ORDER_RATE, ORDER_SPEC, ORDER_TABLES, ORDER_PLOT, ORDER_SPARKLINE = 0, 1, 2, 3, 8, 9
ORDER_MODE = ORDER_SPEC


class ModeView(NamedTuple):
    """A decode mode's own dashboard parts, each None or empty outside its mode."""

    line: Callable[[RunSummary | None, bool], RenderableType | None]  # the live frame's line: (summary, wide)
    parts: Callable[[RunSummary], list[str]]  # its figures in render_line, as key=value
    table: Callable[[Sequence[RunSummary]], RenderableType | None]  # below the final table


# One entry a mode with parts of its own; render, render_line and render_summary loop over them.
MODE_VIEWS: Final = (ModeView(streams_line, streams_parts, streams_table),
                     ModeView(serve_line, serve_parts, serve_table),
                     ModeView(overlap_line, overlap_parts, overlap_table))


# ---------------------------------------------------------------- formatters


def _fmt(value: float | None, spec: str = ".2f", missing: str = DASH) -> str:
    return missing if value is None else format(value, spec)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _hop_link_name(hop: str, names: Sequence[str]) -> str:
    """'0->1' -> 'hong-kong→dublin' when the stage names are known."""
    try:
        src, dst = (int(part) for part in hop.split("->"))
        return f"{names[src]}→{names[dst]}"
    except (ValueError, IndexError):
        return hop


# ---------------------------------------------------------------- sections


def _title_bar(summary: RunSummary | None, width: int) -> Text:
    phase = summary.phase if summary is not None and summary.phase else "starting"
    title = Text(no_wrap=True, overflow="ellipsis", style="reverse")
    title.append(f" {summary.scenario if summary is not None else '?'} ", style="bold")
    title.append(" phase ")
    title.append(phase, style=PHASE_STYLES.get(phase, "bold yellow"))
    title.append("  shaper ")
    title.append(summary.shaper if summary is not None else "?", style="bold")  # why: said once, before the run
    if summary is not None and summary.dilation is not None:  # every figure below is in scenario time
        title.append("  dilation ")
        title.append(f"x{summary.dilation.factor:g}", style="bold")
        title.append(" (scenario time)")
    title.pad_right(max(0, width - title.cell_len))
    title.truncate(width, overflow="ellipsis")
    return title


def _ring_line(summary: RunSummary | None, detail: bool) -> Text:
    names = _stage_names(summary) if summary is not None else []
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(f"{len(names) or DASH} stages ", style="bold")
    if names:
        line.append("→".join(names) + ("↺" if detail else ""), style="cyan")
    line.append("  T_ring ")
    line.append(f"{_fmt(_ms(summary.t_ring_s if summary else None), '.1f')} ms", style="bold")
    line.append(f" (meas {_fmt(_ms(summary.t_ring_measured_s if summary else None), '.1f')})", style="dim")
    line.append("  C ")
    line.append(f"{_fmt(_ms(summary.compute_s if summary else None), '.1f')} ms", style="bold")
    if detail:
        line.append(f" (real {_fmt(_ms(summary.compute_real_s if summary else None), '.1f')})", style="dim")
    return line


def header(summary: RunSummary | None, width: int) -> Group:
    """Title bar (scenario, phase, shaper) and the ring line (stages, T_ring, C); detail dropped when narrow."""
    ring = _ring_line(summary, detail=True)
    if ring.cell_len > width:
        ring = _ring_line(summary, detail=False)
    return Group(_title_bar(summary, width), ring)


def _wide_rate_details(summary: RunSummary) -> Text:
    details = Text(style="dim")
    wall = summary.wall_predicted_tok_s
    compute_s = summary.spec.verify_compute_s if summary.spec is not None else summary.compute_s
    if wall is not None and compute_s is not None:  # the summarizer's wall, with the C it used
        details.append(f"   r = 1/(C + T_ring) = 1/({compute_s * 1e3:.1f} + {summary.t_ring_s * 1e3:.1f} ms)"
                       f" = {wall:.2f} tok/s")
    if summary.overhead_ms_per_hop is not None:
        details.append(f"   overhead {summary.overhead_ms_per_hop:.2f} ms/hop")
    if summary.ttft is not None:
        details.append(f"   TTFT {summary.ttft.measured_s * 1e3:.0f} ms (pred {summary.ttft.predicted_s * 1e3:.0f})")
    return details


def rate_line(summary: RunSummary | None, width: int) -> Text:
    """Decode rate measured vs predicted and the error; the evaluated wall, overhead and TTFT when wide."""
    measured = summary.measured_tok_s if summary else None
    error = summary.error_pct if summary else None
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("decode ")
    line.append(f"{_fmt(measured)} tok/s", style="bold")
    line.append(" measured  ")
    line.append(_fmt(summary.predicted_tok_s if summary else None), style="bold")
    line.append(" predicted  ")
    line.append(f"error {_fmt(error, '+.1f')}%", style=_error_style(error))
    if summary is None:
        line.append(f"  {DASH} tok {DASH} laps {DASH} s", style="dim")
        return line
    line.append(f"  {summary.tokens} tok {summary.laps} laps {summary.wall_s:.1f} s", style="dim")
    if width >= WIDE_WIDTH:
        line.append_text(_wide_rate_details(summary))
    return line


def spec_line(summary: RunSummary | None, wide: bool) -> Text | None:
    """K, alpha, Gamma and r_spec measured vs predicted; None outside speculation."""
    if summary is None or summary.spec is None:
        return None
    spec = summary.spec
    measured, predicted, error = summary.measured_tok_s, summary.predicted_tok_s, summary.error_pct
    line = Text()
    line.append("spec ", style="bold magenta")
    line.append(f"K={spec.k:g}", style="bold")
    notes = [note for note in ("auto" if spec.k_auto else None,
                               f"K*={spec.k_star}" if spec.k_star else None,
                               f"{spec.draft} draft" if spec.draft and wide else None) if note]
    if notes:
        line.append(f" ({', '.join(notes)})", style="dim")
    line.append("  α ")
    line.append(f"{spec.alpha:.2f}", style="bold")
    if wide:
        line.append("  Γ ")
        line.append(f"{spec.gamma_measured:.2f}", style="bold")
        line.append(f" (pred {spec.gamma_predicted:.2f})")
        line.append("  r_spec ")
        line.append(_fmt(measured), style="bold")
        line.append(f" tok/s (pred {_fmt(predicted)}")
        if error is not None:
            line.append(", ")
            line.append(f"{error:+.1f}%", style=_error_style(error))
        line.append(")")
        rate = measured if measured is not None else predicted
        if rate is not None and spec.plain_predicted_tok_s > 0:
            line.append(f"  = {rate / spec.plain_predicted_tok_s:.1f}× the wall", style="dim")
    else:
        line.append("  meas/pred: ", style="dim")
        line.append("Γ ")
        line.append(f"{spec.gamma_measured:.2f}", style="bold")
        line.append(f"/{spec.gamma_predicted:.2f}")
        line.append("  r_spec ")
        line.append(_fmt(measured), style="bold")
        line.append(f"/{_fmt(predicted)}")
        if error is not None:
            line.append(f" {error:+.1f}%", style=_error_style(error))
    return line


def _section_table(title: str) -> Table:
    return Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold", title=title,
                 title_justify="left", title_style="bold")


def hop_table(summary: RunSummary | None, wide: bool) -> Table | None:
    """Per hop: configured and measured one-way latency (p50, p99), bytes per lap; link names when wide."""
    if summary is None or not summary.per_hop:
        return None
    names = _stage_names(summary)
    table = _section_table("hops (one-way latency, ms)" if wide else "hops, one-way ms")
    table.add_column("hop", no_wrap=True)
    if wide:
        table.add_column("link", no_wrap=True, style="cyan")
    for name in ("cfg", "p50", "p99"):
        table.add_column(name, justify="right")
    if wide:
        table.add_column("Δp50", justify="right")
    table.add_column("B/lap", justify="right")
    for hop in summary.per_hop:
        row: list[RenderableType] = [hop.hop]
        if wide:
            row.append(_hop_link_name(hop.hop, names))
        row += [f"{hop.configured_ms:.1f}", _fmt(hop.measured_ms_p50, ".1f"), _fmt(hop.measured_ms_p99, ".1f")]
        if wide:
            delta = None if hop.measured_ms_p50 is None else hop.measured_ms_p50 - hop.configured_ms
            row.append(Text(_fmt(delta, "+.2f"), style="dim" if delta is None or abs(delta) < 1 else "yellow"))
        row.append(_fmt(hop.bytes_per_lap, ".0f"))
        table.add_row(*row)
    return table


def stage_table(summary: RunSummary | None, wide: bool) -> Table | None:
    """Per stage: emulated, measured and real compute per lap; each stage's share of C when wide."""
    if summary is None or not summary.per_stage:
        return None
    table = _section_table("stages (compute per lap, ms)" if wide else "stages, compute ms/lap")
    table.add_column("stage", no_wrap=True, max_width=None if wide else 12, overflow="ellipsis")
    for name in ("emul", "meas", "real"):
        table.add_column(name, justify="right")
    if wide:
        table.add_column("share of C", justify="right")
    compute_ms = _ms(summary.compute_s)
    for stage in summary.per_stage:
        label = f"{stage.stage} {stage.name}" if stage.name else str(stage.stage)
        row = [label, f"{stage.emulated_ms:.1f}", _fmt(stage.compute_ms_mean), _fmt(stage.real_ms_mean)]
        if wide:
            measured = stage.compute_ms_mean
            row.append(DASH if measured is None or not compute_ms else f"{100 * measured / compute_ms:.0f}%")
        table.add_row(*row)
    return table


# ---------------------------------------------------------------- the frame


def _scratch_console(width: int) -> Console:
    return Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)


def _lines_of(renderable: RenderableType, width: int) -> int:
    if isinstance(renderable, Text) and renderable.no_wrap and "\n" not in renderable.plain:
        return 1
    if isinstance(renderable, Group):
        return sum(_lines_of(part, width) for part in renderable.renderables)
    console = _scratch_console(width)
    return len(console.render_lines(renderable, console.options.update(width=width), pad=False))


def _width_of(renderable: RenderableType, width: int) -> int:
    console = _scratch_console(width)
    return Measurement.get(console, console.options.update(width=width), renderable).maximum


def _table_blocks(summary: RunSummary | None, width: int, wide: bool) -> list[RenderableType]:
    """The hop and stage tables, side by side when both fit the width, else one above the other."""
    tables = [t for t in (hop_table(summary, wide), stage_table(summary, wide)) if t is not None]
    if len(tables) == 2 and sum(_width_of(t, width) for t in tables) + TABLE_GAP <= width:
        grid = Table.grid(padding=(0, TABLE_GAP))
        grid.add_row(*tables)
        return [grid]
    return list(tables)


SCHEDULE_SHOWN = 4  # events around now on the schedule line


def schedule_line(summary: RunSummary | None, width: int) -> Text | None:
    """The link schedule: the last events that happened (marked) and the next ones, with the run's clock."""
    if summary is None or not summary.schedule:
        return None
    done = [e for e in summary.schedule if e[2]]
    shown = (done[-(SCHEDULE_SHOWN // 2):] + [e for e in summary.schedule if not e[2]])[:SCHEDULE_SHOWN]
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("schedule ", style="bold magenta")
    if summary.schedule_elapsed_s is not None:
        line.append(f"t={summary.schedule_elapsed_s:.1f}s ", style="dim")
    for at_s, what, happened in shown:
        line.append(f"{'*' if happened else ' '}{at_s:g}s {what}  ", style="bold" if happened else "dim")
    line.append(f"({len(done)}/{len(summary.schedule)} done)", style="dim")
    line.truncate(width)
    return line


def render(summary: RunSummary | None, width: int = 80, height: int = 24) -> RenderableType:
    """The whole dashboard for a `width` x `height` terminal; drops sections (plot first) when small.

    Every figure shown is read from the summary (its summarizer owns "predicted"); placeholders while None.
    Sections are picked in priority order (header, rate, speculation, tables, sparkline) while they fit;
    the wall plot takes the rows left over. Their heights depend on the content (table rows, wrapping),
    which is why this counts lines instead of giving rich.Layout fixed sizes.
    """
    width, height = max(MIN_WIDTH, int(width)), max(1, int(height))
    wide = width >= WIDE_WIDTH
    top: RenderableType = header(summary, width)
    if height < TINY_HEIGHT:
        top = _title_bar(summary, width)
    candidates: list[tuple[int, RenderableType | None]] = [
        (ORDER_HEADER, top), (ORDER_RATE, rate_line(summary, width)), (ORDER_SPEC, spec_line(summary, wide)),
        *((ORDER_MODE, view.line(summary, wide)) for view in MODE_VIEWS), (ORDER_SPEC, schedule_line(summary, width)),
        *((ORDER_TABLES + i, block) for i, block in enumerate(_table_blocks(summary, width, wide))),
        (ORDER_SPARKLINE, sparkline(summary, width)),
    ]
    chosen: list[tuple[int, RenderableType]] = []
    remaining = height
    for order, renderable in candidates:
        if renderable is None:
            continue
        lines = _lines_of(renderable, width)
        if lines <= remaining:
            chosen.append((order, renderable))
            remaining -= lines
    plot_rows = min(PLOT_MAX_ROWS, remaining - 2)  # title line and axis line
    waiting_for_compute = summary is None or summary.compute_s is None
    if plot_rows >= PLOT_MIN_ROWS or (remaining >= 1 and waiting_for_compute):
        plot = wall_plot(summary, width, max(plot_rows, PLOT_MIN_ROWS))
        if len(plot.renderables) <= remaining:  # one line each: title, rows, axis (all no_wrap)
            chosen.append((ORDER_PLOT, plot))
    return Group(*(renderable for _, renderable in sorted(chosen, key=lambda item: item[0])))


def render_line(summary: RunSummary | None) -> str:
    """One line of plain ASCII for non-terminals (CI logs, pipes)."""
    if summary is None:
        return "? phase=starting (nothing measured yet)"
    parts = [
        summary.scenario, f"phase={summary.phase or '-'}", f"shaper={summary.shaper or '-'}",
        f"dilation={summary.dilation.factor if summary.dilation else 1:g}", f"stages={summary.stages}",
        f"T_ring={summary.t_ring_s * 1e3:.1f}ms", f"C={_fmt(_ms(summary.compute_s), '.1f', '-')}ms",
        f"laps={summary.laps}", f"tokens={summary.tokens}", f"wall={summary.wall_s:.1f}s",
        f"rate={_fmt(summary.measured_tok_s, '.2f', '-')}tok/s",
        f"predicted={_fmt(summary.predicted_tok_s, '.2f', '-')}tok/s", f"error={_fmt(summary.error_pct, '+.1f', '-')}%",
    ]
    if summary.spec is not None:
        spec = summary.spec
        parts += [f"K={spec.k:g}", f"alpha={spec.alpha:.2f}",
                  f"gamma={spec.gamma_measured:.2f}/{spec.gamma_predicted:.2f}",
                  f"wall_predicted={spec.plain_predicted_tok_s:.2f}tok/s"]
    for view in MODE_VIEWS:
        parts += view.parts(summary)
    return " ".join(parts)


def capped_caption(summaries: Sequence[RunSummary]) -> str | None:
    """Where the run-time budget capped auto's D: the error the calibrated overhead leaves, beside the measured."""
    capped = [s for s in summaries if s.dilation is not None and s.dilation.capped
              and s.dilation.expected_error_pct is not None]
    if not capped:
        return None
    return "; ".join(f"{s.mode}: D = {s.dilation.factor:g} capped (wanted {s.dilation.needed:.1f}; run-time budget "
                     f"{s.dilation.budget_s:g} s, --budget-s), so the calibrated overhead leaves an expected error of "
                     f"{s.dilation.expected_error_pct:+.2f}%" for s in capped)


def render_summary(summaries: Sequence[RunSummary]) -> RenderableType:
    """Measured vs predicted, one row per run summary (e.g. the plain and the speculative phase).

    For a speculative run the summary's prediction is r_spec = Gamma / (K c_d + C + T_ring), not the wall; for
    M streams it is the aggregate (physics.streams_rates); each mode's own table follows (MODE_VIEWS: the streams
    runs' per-stream rates, ceiling and busiest stage; the serve runs' figures under vLLM's names).
    """
    any_spec = any(s.spec is not None for s in summaries)
    shapers = sorted({s.shaper for s in summaries if s.shaper})
    title = "measured vs predicted" + (f" (shaper {', '.join(shapers)})" if shapers else "")
    factors = sorted({s.dilation.factor for s in summaries if s.dilation is not None})
    if factors:
        title += f", time dilation x{'/'.join(f'{d:g}' for d in factors)} (figures in scenario time)"
    table = Table(title=title, title_justify="left", title_style="bold", header_style="bold", caption=capped_caption(
                  summaries), caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    table.add_column("phase", no_wrap=True)
    table.add_column("scenario", no_wrap=True, overflow="ellipsis", max_width=24)
    for name in ("T_ring\nms", "C\nms", "laps", "tok/s\nmeas", "tok/s\npred", "error\n%"):
        table.add_column(name, justify="right", no_wrap=True, min_width=4)
    if any_spec:
        for name in ("K", "α", "Γ\nmeas", "Γ\npred"):
            table.add_column(name, justify="right", no_wrap=True)
    for summary in summaries:
        row: list[RenderableType] = [
            "spec" if summary.is_speculative else summary.mode, summary.scenario,
            f"{summary.t_ring_s * 1e3:.1f}", _fmt(_ms(summary.compute_s), ".1f"), str(summary.laps),
            _fmt(summary.measured_tok_s), _fmt(summary.predicted_tok_s),
            Text(_fmt(summary.error_pct, "+.1f"), style=_error_style(summary.error_pct)),
        ]
        if any_spec:
            spec = summary.spec
            row += ([f"{spec.k:g}", f"{spec.alpha:.2f}", f"{spec.gamma_measured:.2f}", f"{spec.gamma_predicted:.2f}"]
                    if spec is not None else [DASH] * 4)
        table.add_row(*row)
    below = [part for view in MODE_VIEWS if (part := view.table(summaries)) is not None]
    return Group(table, *(item for part in below for item in (Text(), part))) if below else table
