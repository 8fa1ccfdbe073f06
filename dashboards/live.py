"""Live terminal dashboard of a run: pure render functions of a snapshot dict, and the loop that refreshes them.

A snapshot is the run summary dict (see the launcher); live snapshots carry None where a value is not
known yet, so every field is read with `.get` and shown as a dash until it arrives.

    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(run_dashboard, launcher.snapshot, console=Console()))
"""

from __future__ import annotations

import io
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import trio
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from testbed.core.physics import gamma, spec_rate, wall_rate

DEFAULT_INTERVAL_S: Final = 0.5
LINE_MIN_INTERVAL_S: Final = 2.0  # plain-text status lines at most this often (CI logs, pipes)

PLOT_T_MIN_MS: Final = 0.1
PLOT_T_MAX_MS: Final = 1000.0
PLOT_MIN_ROWS: Final = 4  # below this the wall plot says nothing; drop it
PLOT_MAX_ROWS: Final = 32
PLOT_Y_GUTTER: Final = 7  # "123.4 ┤"
WIDE_WIDTH: Final = 120  # from here on: full link names, deltas, the evaluated formula

SPARK_CHARS: Final = "▁▂▃▄▅▆▇█"
MEASURED_MARK: Final = "●"
DASH: Final = "–"

# Braille cell: dot bit for (row 0..3, column 0..1) inside one character.
_BRAILLE_BITS: Final = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


# ---------------------------------------------------------------- small readers and formatters


def _num(snapshot: Mapping[str, Any] | None, key: str) -> float | None:
    """A finite number at `key`, or None (missing, None, not a number, NaN)."""
    if not snapshot:
        return None
    value = snapshot.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real too
        return None
    return float(value) if math.isfinite(value) else None


def _fmt(value: float | None, spec: str = ".2f", missing: str = DASH) -> str:
    return missing if value is None else format(value, spec)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _error_pct(measured: float | None, predicted: float | None, given: float | None = None) -> float | None:
    if given is not None:
        return given
    if measured is None or predicted is None or predicted == 0:
        return None
    return 100.0 * (measured - predicted) / predicted


def _error_style(error_pct: float | None) -> str:
    if error_pct is None:
        return "dim"
    size = abs(error_pct)
    return "green" if size < 5 else "yellow" if size < 15 else "bold red"


def _spec(snapshot: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = snapshot.get("spec")
    return spec if isinstance(spec, Mapping) else None


def _mode(snapshot: Mapping[str, Any]) -> str:
    mode = snapshot.get("mode")
    if isinstance(mode, str):
        return mode
    return "speculative" if _spec(snapshot) else "plain"


def _predicted_spec_rate(snapshot: Mapping[str, Any]) -> float | None:
    """r_spec as the launcher predicted it, else Gamma / (K c_d + C + T_ring) from the measured inputs."""
    spec = _spec(snapshot)
    if spec is None:
        return None
    given = _num(spec, "predicted_tok_s")
    if given is not None:
        return given
    alpha, k, draft_s = _num(spec, "alpha"), _num(spec, "k"), _num(spec, "draft_s")
    compute_s, t_ring_s = _num(snapshot, "compute_s"), _num(snapshot, "t_ring_s")
    if None in (alpha, k, draft_s, compute_s, t_ring_s) or not k or not 0 <= alpha <= 1:
        return None
    return spec_rate(alpha, int(k), draft_s / k, compute_s, t_ring_s)


def _predicted_gamma(spec: Mapping[str, Any]) -> float | None:
    given = _num(spec, "gamma_predicted")
    if given is not None:
        return given
    alpha, k = _num(spec, "alpha"), _num(spec, "k")
    if alpha is None or k is None or not 0 <= alpha <= 1 or k < 0:
        return None
    return gamma(alpha, int(k))


def _stage_names(snapshot: Mapping[str, Any]) -> list[str]:
    names = snapshot.get("stage_names")
    if isinstance(names, list) and names:
        return [str(name) for name in names]
    stages = _num(snapshot, "stages")
    return [f"stage {i}" for i in range(int(stages))] if stages else []


def _hop_link_name(hop: str, names: Sequence[str]) -> str:
    """'0->1' -> 'hong-kong→dublin' when the stage names are known."""
    try:
        src, dst = (int(part) for part in hop.split("->"))
        return f"{names[src]}→{names[dst]}"
    except (ValueError, IndexError):
        return hop


# ---------------------------------------------------------------- sections


def _header(snapshot: Mapping[str, Any], width: int) -> Group:
    scenario = str(snapshot.get("scenario") or "?")
    phase = str(snapshot.get("phase") or "starting")
    shaper = str(snapshot.get("shaper") or "?")
    reason = snapshot.get("shaper_reason")
    phase_style = {"plain": "bold cyan", "speculative": "bold magenta", "done": "bold green"}.get(phase, "bold yellow")

    title = Text(no_wrap=True, overflow="ellipsis", style="reverse")
    title.append(f" {scenario} ", style="bold")
    title.append(" phase ")
    title.append(phase, style=phase_style)
    title.append("  shaper ")
    title.append(shaper, style="bold")
    if reason:
        title.append(f" ({reason})")
    title.pad_right(max(0, width - title.cell_len))
    title.truncate(width, overflow="ellipsis")

    names = _stage_names(snapshot)
    t_ring_ms = _ms(_num(snapshot, "t_ring_s"))
    t_ring_measured_ms = _ms(_num(snapshot, "t_ring_measured_s"))
    compute_ms = _ms(_num(snapshot, "compute_s"))
    compute_real_ms = _ms(_num(snapshot, "compute_real_s"))

    def ring_line(detail: bool) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{len(names) or DASH} stages ", style="bold")
        if names:
            line.append("→".join(names) + ("↺" if detail else ""), style="cyan")
        line.append("  T_ring ")
        line.append(f"{_fmt(t_ring_ms, '.1f')} ms", style="bold")
        line.append(f" (meas {_fmt(t_ring_measured_ms, '.1f')})", style="dim")
        line.append("  C ")
        line.append(f"{_fmt(compute_ms, '.1f')} ms", style="bold")
        if detail:
            line.append(f" (real {_fmt(compute_real_ms, '.1f')})", style="dim")
        return line

    ring = ring_line(detail=True)
    if ring.cell_len > width:
        ring = ring_line(detail=False)
    return Group(title, ring)


def _rate_line(snapshot: Mapping[str, Any], width: int) -> Text:
    measured = _num(snapshot, "measured_tok_s")
    predicted = _num(snapshot, "predicted_tok_s")
    error = _error_pct(measured, predicted, _num(snapshot, "error_pct"))
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("decode ")
    line.append(f"{_fmt(measured)} tok/s", style="bold")
    line.append(" measured  ")
    line.append(f"{_fmt(predicted)}", style="bold")
    line.append(" predicted  ")
    line.append(f"error {_fmt(error, '+.1f')}%", style=_error_style(error))
    tokens, laps, wall = _num(snapshot, "tokens"), _num(snapshot, "laps"), _num(snapshot, "wall_s")
    line.append(f"  {_fmt(tokens, '.0f')} tok {_fmt(laps, '.0f')} laps {_fmt(wall, '.1f')} s", style="dim")
    if width >= WIDE_WIDTH:
        compute_s, t_ring_s = _num(snapshot, "compute_s"), _num(snapshot, "t_ring_s")
        if compute_s is not None and t_ring_s is not None and compute_s + t_ring_s > 0:
            line.append(
                f"   r = 1/(C + T_ring) = 1/({compute_s * 1e3:.1f} + {t_ring_s * 1e3:.1f} ms)"
                f" = {wall_rate(compute_s, t_ring_s):.2f} tok/s", style="dim")
        overhead = _num(snapshot, "overhead_ms_per_hop")
        if overhead is not None:
            line.append(f"   overhead {overhead:.2f} ms/hop", style="dim")
        ttft = snapshot.get("ttft")
        if isinstance(ttft, Mapping) and _num(ttft, "measured_s") is not None:
            line.append(f"   TTFT {_fmt(_ms(_num(ttft, 'measured_s')), '.0f')} ms"
                        f" (pred {_fmt(_ms(_num(ttft, 'predicted_s')), '.0f')})", style="dim")
    return line


def _spec_line(snapshot: Mapping[str, Any], wide: bool) -> Text | None:
    spec = _spec(snapshot)
    if spec is None:
        return None
    k, k_star = _num(spec, "k"), _num(spec, "k_star")
    alpha = _num(spec, "alpha")
    gamma_measured, gamma_predicted = _num(spec, "gamma_measured"), _predicted_gamma(spec)
    r_spec_measured = _num(snapshot, "measured_tok_s") if _mode(snapshot) == "speculative" else None
    r_spec_predicted = _predicted_spec_rate(snapshot)
    compute_s, t_ring_s = _num(snapshot, "compute_s"), _num(snapshot, "t_ring_s")

    line = Text()
    line.append("spec ", style="bold magenta")
    line.append(f"K={_fmt(k, '.0f')}", style="bold")
    notes = [note for note in (
        "auto" if spec.get("k_auto") else None,
        f"K*={k_star:.0f}" if k_star is not None else None,
        str(spec["draft"]) + " draft" if spec.get("draft") and wide else None,
    ) if note]
    if notes:
        line.append(f" ({', '.join(notes)})", style="dim")
    line.append("  α ")
    line.append(_fmt(alpha), style="bold")
    error = _error_pct(r_spec_measured, r_spec_predicted)
    if wide:
        line.append("  Γ ")
        line.append(_fmt(gamma_measured), style="bold")
        line.append(f" (pred {_fmt(gamma_predicted)})")
        line.append("  r_spec ")
        line.append(_fmt(r_spec_measured), style="bold")
        line.append(f" tok/s (pred {_fmt(r_spec_predicted)}")
        if error is not None:
            line.append(", ")
            line.append(f"{error:+.1f}%", style=_error_style(error))
        line.append(")")
        rate = r_spec_measured if r_spec_measured is not None else r_spec_predicted
        if rate is not None and compute_s is not None and t_ring_s is not None and compute_s + t_ring_s > 0:
            line.append(f"  = {rate / wall_rate(compute_s, t_ring_s):.1f}× the wall", style="dim")
    else:
        line.append("  meas/pred: ", style="dim")
        line.append("Γ ")
        line.append(_fmt(gamma_measured), style="bold")
        line.append(f"/{_fmt(gamma_predicted)}")
        line.append("  r_spec ")
        line.append(_fmt(r_spec_measured), style="bold")
        line.append(f"/{_fmt(r_spec_predicted)}")
        if error is not None:
            line.append(f" {error:+.1f}%", style=_error_style(error))
    return line


def _hop_table(snapshot: Mapping[str, Any], wide: bool) -> Table | None:
    hops = snapshot.get("per_hop")
    if not isinstance(hops, list) or not hops:
        return None
    names = _stage_names(snapshot)
    table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold",
                  title="hops, one-way ms" if not wide else "hops (one-way latency, ms)",
                  title_justify="left", title_style="bold")
    table.add_column("hop", no_wrap=True)
    if wide:
        table.add_column("link", no_wrap=True, style="cyan")
    table.add_column("cfg", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    if wide:
        table.add_column("Δp50", justify="right")
    table.add_column("B/lap", justify="right")
    for hop in hops:
        if not isinstance(hop, Mapping):
            continue
        name = str(hop.get("hop", "?"))
        configured, p50, p99 = (_num(hop, key) for key in ("configured_ms", "measured_ms_p50", "measured_ms_p99"))
        bytes_per_lap = _num(hop, "bytes_per_lap")
        row = [name]
        if wide:
            row.append(_hop_link_name(name, names))
        row += [_fmt(configured, ".1f"), _fmt(p50, ".1f"), _fmt(p99, ".1f")]
        if wide:
            delta = None if p50 is None or configured is None else p50 - configured
            row.append(Text(_fmt(delta, "+.2f"), style="dim" if delta is None or abs(delta) < 1 else "yellow"))
        row.append(_fmt(bytes_per_lap, ".0f"))
        table.add_row(*row)
    return table


def _stage_table(snapshot: Mapping[str, Any], wide: bool) -> Table | None:
    stages = snapshot.get("per_stage")
    if not isinstance(stages, list) or not stages:
        return None
    table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold",
                  title="stages, compute ms/lap" if not wide else "stages (compute per lap, ms)",
                  title_justify="left", title_style="bold")
    table.add_column("stage", no_wrap=True, max_width=None if wide else 12, overflow="ellipsis")
    table.add_column("emul", justify="right")
    table.add_column("meas", justify="right")
    table.add_column("real", justify="right")
    if wide:
        table.add_column("share of C", justify="right")
    compute_ms = _ms(_num(snapshot, "compute_s"))
    for stage in stages:
        if not isinstance(stage, Mapping):
            continue
        index = stage.get("stage", "?")
        label = f"{index} {stage['name']}" if stage.get("name") else str(index)
        measured = _num(stage, "compute_ms_mean")
        row = [label, _fmt(_num(stage, "emulated_ms"), ".1f"), _fmt(measured, ".2f"),
               _fmt(_num(stage, "real_ms_mean"), ".2f")]
        if wide:
            share = None if measured is None or not compute_ms else 100.0 * measured / compute_ms
            row.append(_fmt(share, ".0f") + ("%" if share is not None else ""))
        table.add_row(*row)
    return table


def _wall_plot(snapshot: Mapping[str, Any], width: int, rows: int) -> Group:
    """r(T_ring) = 1/(C + T_ring) on a log T_ring axis (braille curve), with the measured point on it."""
    compute_s = _num(snapshot, "compute_s")
    t_ring_s = _num(snapshot, "t_ring_s")
    if t_ring_s is None:
        t_ring_s = _num(snapshot, "t_ring_measured_s")
    measured = _num(snapshot, "measured_tok_s")
    title = Text(no_wrap=True, overflow="ellipsis")
    title.append("wall ", style="bold")
    title.append("r = 1/(C + T_ring)", style="cyan")
    if compute_s is None or compute_s <= 0:
        title.append("  (waiting for the first laps to measure C)", style="dim")
        return Group(title)
    title.append(f", C = {compute_s * 1e3:.1f} ms  ", style="dim")
    title.append(MEASURED_MARK, style="bold red")
    kind = "speculative" if _mode(snapshot) == "speculative" else "measured"
    title.append(f" {kind} {_fmt(measured)} tok/s @ {_fmt(_ms(t_ring_s), '.1f')} ms", style="dim")

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

    mark = None
    if measured is not None and t_ring_s is not None:
        mark = (min(y_px(measured) // 4, rows - 1), x_px(t_ring_s * 1e3) // 2)

    lines: list[Text] = [title]
    for row in range(rows):
        if row == 0:
            label = f"{y_max:.3g}"
        elif row == rows - 1:
            label = "0"
        elif row == rows // 2:
            label = f"{y_max * (1 - (row * 4 + 1.5) / (px_h - 1)):.3g}"
        else:
            label = ""
        gutter = f"{label:>{PLOT_Y_GUTTER - 2}} ┤" if label else f"{'':>{PLOT_Y_GUTTER - 2}} │"
        body = "".join(chr(0x2800 + bits) if bits else " " for bits in cells[row])
        line = Text(gutter, style="dim", no_wrap=True, overflow="crop")
        if mark is not None and mark[0] == row:  # one span per run of cells, not one per cell
            col = mark[1]
            line.append(body[:col], style="cyan")
            line.append(MEASURED_MARK, style="bold red")
            line.append(body[col + 1:], style="cyan")
        else:
            line.append(body, style="cyan")
        lines.append(line)

    axis = [" "] * (cols + 1)
    for decade in range(math.ceil(log_min), math.floor(log_max) + 1):
        label = f"{10.0 ** decade:g}"
        start = 1 + x_px(10.0 ** decade) // 2 - len(label) // 2
        start = max(0, min(start, cols + 1 - len(label)))
        axis[start:start + len(label)] = label
    unit = " ms"
    lines.append(Text(" " * (PLOT_Y_GUTTER - 1) + "".join(axis).rstrip() + unit, style="dim", no_wrap=True,
                      overflow="crop"))
    return Group(*lines)


def _sparkline(history: Any, width: int) -> Text | None:
    if not isinstance(history, list):
        return None
    points = [(float(p[0]), float(p[1])) for p in history
              if isinstance(p, (list, tuple)) and len(p) == 2
              and all(isinstance(v, numbers.Real) and math.isfinite(v) for v in p)]
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("rate ", style="bold")
    if not points:
        line.append("(no history yet)", style="dim")
        return line
    rates = [rate for _, rate in points]
    tail = f" now {rates[-1]:.2f} tok/s  min {min(rates):.2f} max {max(rates):.2f}  over {points[-1][0] - points[0][0]:.0f} s"
    cols = max(8, width - line.cell_len - len(tail))
    if len(points) > cols:  # average into equal time bins
        t0, t1 = points[0][0], points[-1][0]
        span = (t1 - t0) or 1.0
        bins: list[list[float]] = [[] for _ in range(cols)]
        for t, rate in points:
            bins[min(cols - 1, int((t - t0) / span * cols))].append(rate)
        values: list[float | None] = [sum(b) / len(b) if b else None for b in bins]
    else:
        values = list(rates)
    low, high = min(rates), max(rates)
    levels = len(SPARK_CHARS) - 1

    def level(value: float) -> int:  # min..max like any sparkline; a flat history sits mid-height
        return levels // 2 if high - low < 1e-9 else round((value - low) / (high - low) * levels)

    spark = "".join(" " if v is None else SPARK_CHARS[level(v)] for v in values)
    line.append(spark, style="green")
    line.append(tail, style="dim")
    return line


# ---------------------------------------------------------------- public API


def _lines_of(renderable: RenderableType, width: int) -> int:
    if isinstance(renderable, Text) and renderable.no_wrap and "\n" not in renderable.plain:
        return 1
    if isinstance(renderable, Group):
        return sum(_lines_of(part, width) for part in renderable.renderables)
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    return len(console.render_lines(renderable, console.options.update(width=width), pad=False))


def _width_of(renderable: RenderableType, width: int) -> int:
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    return Measurement.get(console, console.options.update(width=width), renderable).maximum


def render(snapshot: Mapping[str, Any], width: int = 80, height: int = 24) -> RenderableType:
    """The whole dashboard for a `width` x `height` terminal; drops sections (plot first) when small."""
    snapshot = snapshot or {}
    width, height = max(20, int(width)), max(1, int(height))
    wide = width >= WIDE_WIDTH

    header = _header(snapshot, width)
    rate = _rate_line(snapshot, width)
    spec = _spec_line(snapshot, wide)
    tables = [t for t in (_hop_table(snapshot, wide), _stage_table(snapshot, wide)) if t is not None]
    if len(tables) == 2 and sum(_width_of(t, width) for t in tables) + 3 <= width:
        grid = Table.grid(padding=(0, 3))
        grid.add_row(*tables)
        table_blocks: list[RenderableType] = [grid]
    else:
        table_blocks = list(tables)
    spark = _sparkline(snapshot.get("history"), width)

    # (display order, renderable) chosen in priority order until the height is used up.
    chosen: list[tuple[int, RenderableType]] = []
    remaining = height
    if height < 8:  # tiny: a title bar and the rate are all that is worth showing
        header = header.renderables[0]
    candidates: list[tuple[int, RenderableType | None]] = [
        (0, header), (1, rate), (2, spec), *((3 + i, block) for i, block in enumerate(table_blocks)), (9, spark)]
    for order, renderable in candidates:
        if renderable is None:
            continue
        lines = _lines_of(renderable, width)
        if lines <= remaining:
            chosen.append((order, renderable))
            remaining -= lines
    plot_rows = min(PLOT_MAX_ROWS, remaining - 2)  # title line and axis line
    if plot_rows >= PLOT_MIN_ROWS or (remaining >= 1 and _num(snapshot, "compute_s") is None):
        plot = _wall_plot(snapshot, width, max(plot_rows, PLOT_MIN_ROWS))
        if len(plot.renderables) <= remaining:  # one line each: title, rows, axis (all no_wrap)
            chosen.append((8, plot))
    return Group(*(renderable for _, renderable in sorted(chosen, key=lambda item: item[0])))


def render_line(snapshot: Mapping[str, Any]) -> str:
    """One line of plain ASCII for non-terminals (CI logs, pipes)."""
    snapshot = snapshot or {}
    measured, predicted = _num(snapshot, "measured_tok_s"), _num(snapshot, "predicted_tok_s")
    error = _error_pct(measured, predicted, _num(snapshot, "error_pct"))
    parts = [
        str(snapshot.get("scenario") or "?"),
        f"phase={snapshot.get('phase') or '-'}",
        f"shaper={snapshot.get('shaper') or '-'}",
        f"stages={_fmt(_num(snapshot, 'stages'), '.0f', '-')}",
        f"T_ring={_fmt(_ms(_num(snapshot, 't_ring_s')), '.1f', '-')}ms",
        f"C={_fmt(_ms(_num(snapshot, 'compute_s')), '.1f', '-')}ms",
        f"laps={_fmt(_num(snapshot, 'laps'), '.0f', '-')}",
        f"tokens={_fmt(_num(snapshot, 'tokens'), '.0f', '-')}",
        f"wall={_fmt(_num(snapshot, 'wall_s'), '.1f', '-')}s",
        f"rate={_fmt(measured, '.2f', '-')}tok/s",
        f"predicted={_fmt(predicted, '.2f', '-')}tok/s",
        f"error={_fmt(error, '+.1f', '-')}%",
    ]
    spec = _spec(snapshot)
    if spec is not None:
        parts += [
            f"K={_fmt(_num(spec, 'k'), '.0f', '-')}",
            f"alpha={_fmt(_num(spec, 'alpha'), '.2f', '-')}",
            f"gamma={_fmt(_num(spec, 'gamma_measured'), '.2f', '-')}/{_fmt(_predicted_gamma(spec), '.2f', '-')}",
            f"r_spec_predicted={_fmt(_predicted_spec_rate(snapshot), '.2f', '-')}tok/s",
        ]
    return " ".join(parts)


def render_summary(summaries: Sequence[Mapping[str, Any]]) -> Table:
    """Measured vs predicted, one row per run summary (e.g. the plain and the speculative phase).

    For a speculative run the prediction is r_spec = Gamma / (K c_d + C + T_ring), not the plain wall.
    """
    any_spec = any(_spec(s) for s in summaries)
    shapers = sorted({str(s.get("shaper")) for s in summaries if s.get("shaper")})
    title = "measured vs predicted" + (f" (shaper {', '.join(shapers)})" if shapers else "")
    table = Table(title=title, title_justify="left", title_style="bold", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("phase", no_wrap=True)
    table.add_column("scenario", no_wrap=True, overflow="ellipsis", max_width=24)
    for name in ("T_ring\nms", "C\nms", "laps", "tok/s\nmeas", "tok/s\npred", "error\n%"):
        table.add_column(name, justify="right", no_wrap=True, min_width=4)
    if any_spec:
        for name in ("K", "α", "Γ\nmeas", "Γ\npred"):
            table.add_column(name, justify="right", no_wrap=True)
    for summary in summaries:
        spec = _spec(summary)
        measured = _num(summary, "measured_tok_s")
        predicted = _num(summary, "predicted_tok_s")
        if _mode(summary) == "speculative" and spec is not None:
            predicted = _predicted_spec_rate(summary) or predicted
            error = _error_pct(measured, predicted)
        else:
            error = _error_pct(measured, predicted, _num(summary, "error_pct"))
        row: list[RenderableType] = [
            "spec" if _mode(summary) == "speculative" else _mode(summary), str(summary.get("scenario") or "?"),
            _fmt(_ms(_num(summary, "t_ring_s")), ".1f"), _fmt(_ms(_num(summary, "compute_s")), ".1f"),
            _fmt(_num(summary, "laps"), ".0f"), _fmt(measured), _fmt(predicted),
            Text(_fmt(error, "+.1f"), style=_error_style(error)),
        ]
        if any_spec:
            row += ([_fmt(_num(spec, "k"), ".0f"), _fmt(_num(spec, "alpha")), _fmt(_num(spec, "gamma_measured")),
                     _fmt(_predicted_gamma(spec))] if spec else [DASH] * 4)
        table.add_row(*row)
    return table


async def run_dashboard(
    get_snapshot: Callable[[], Mapping[str, Any]],
    *,
    console: Console,
    interval_s: float = DEFAULT_INTERVAL_S,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Show the run until cancelled: a live frame on a terminal, a status line now and then elsewhere.

    Only this task refreshes (no rich refresh thread); on cancellation a final frame or line is drawn.
    """
    task_status.started()
    if console.is_terminal:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            try:
                while True:
                    live.update(render(get_snapshot(), console.width, console.height), refresh=True)
                    await trio.sleep(interval_s)
            finally:
                try:
                    live.update(render(get_snapshot(), console.width, console.height), refresh=True)
                except Exception:  # never let the last frame mask the cancellation or the real error
                    pass
    else:
        line_interval_s = max(interval_s, LINE_MIN_INTERVAL_S)
        try:
            while True:
                console.print(render_line(get_snapshot()), markup=False, highlight=False, soft_wrap=True)
                await trio.sleep(line_interval_s)
        finally:
            try:
                console.print(render_line(get_snapshot()), markup=False, highlight=False, soft_wrap=True)
            except Exception:  # never let the last line mask the cancellation or the real error
                pass
