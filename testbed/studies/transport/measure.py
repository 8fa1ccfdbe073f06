"""python -m testbed transport: the flow-level TCP model (testbed.core.tcp) against transfers over each backend.

For each backend asked for (--shapers), every point of the grid (testbed.studies.transport.grid) is one transfer
over one link set up with transport "kernel" (testbed.studies.transport.harness), beside its prediction:

- virtual: the model on simulated time; it must equal the model's own replay to 1e-6 (tests/test_transport_study);
- userspace: the relay paces each connection's chunks as TcpFlow says, in real time: its error is the relay's;
- netem: the kernel's own TCP (Reno, its default buffers) through netem; where the kernel lacks sch_netem, inside
  user-mode-linux (`python -m netem.uml -- python -m testbed transport --shapers netem`).

A real backend's first transfers are its ceiling (no delay, no rate limit, 64 MiB: what the backend itself carries;
inside user-mode-linux the guest's per-byte cost) and its floor (the same, 64 KiB: its own cost a transfer), and a
point whose link is faster than the ceiling, or whose predicted time the floor is over FLOOR_SHARE of, is marked
with that figure, not fitted. A lossy point is --repeats transfers, each over a link with a seed of its own
(grid.draws), and its row holds their mean and standard error beside the model's expectation (its mean over
grid.MODEL_SEEDS seeds, with its standard error), each draw kept beside the model on the same seed. From
the rows: the window's cap (the plateau of one stream at RTT 280 ms between two large sizes, rate x RTT) and slow
start's rounds at small sizes (the time less the one way and the bytes at the rate, in RTTs).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import trio

from netem.select import BACKENDS, kinds
from testbed.core.errors import ConfigError
from testbed.core.tcp import KERNEL_WINDOW_CAP_BYTES, window_limited_rate
from testbed.studies.base import log_to, print_tables, write_json
from testbed.studies.transport import grid as grids
from testbed.studies.transport.grid import (CEILING, FLOOR, SLOW_START_LINK, SLOW_START_SIZES, Point,
                                            aggregate_params, predict, rounds_of)
from testbed.studies.transport.cells import error_cell, measured_cell, predicted_cell
from testbed.studies.transport.harness import measure_link
from testbed.studies.transport.result import BackendFigures, SlowStartRow, TransferRow, TransportResult

DEFAULT_SHAPERS = "virtual,userspace"
CEILING_REPEATS = 3  # the ceiling is the best of this many transfers (a shared box's other work only slows one)


def shaper_list(text: str | Sequence[str]) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip())
    unknown = [n for n in names if n not in kinds()]
    if not names or unknown:
        raise ConfigError(f"expected backends from {', '.join(kinds())}, comma-separated, got {text!r}",
                          key="--shapers")
    return names


def _measure(kind: str, points: Sequence[Point], log) -> tuple[str, list[tuple[Point, int, float]]]:
    backend = BACKENDS.get(kind)
    if backend is not None and backend.simulated:
        from testbed.core import virtual_time

        return virtual_time.run_sync(measure_link, kind, points, log)
    return trio.run(measure_link, kind, points, log)


FLOOR_SHARE = 0.05  # a point whose predicted time the backend's own cost a transfer is over this share of is marked


def _row(backend: str, point: Point, seconds: Sequence[float], ceiling_mbit: float | None,
         floor_s: float | None = None, repeats: int = 1) -> TransferRow:
    """The point's row from its measured draws (one, or `repeats` for a lossy point, in seed order: grid.draws)."""
    prediction = predict(point, repeats)
    limited = ""
    sustained_mbit = window_limited_rate(aggregate_params(point.params, point.connections)) * 8 / 1e6
    if ceiling_mbit is not None and sustained_mbit > ceiling_mbit:
        limited = (f"guest-limited: {sustained_mbit:.0f} Mbit/s is over the {ceiling_mbit:.0f} Mbit/s the backend "
                   "carries")
    elif floor_s is not None and floor_s > FLOOR_SHARE * prediction.predicted_s:
        limited = (f"floor-limited: the backend's own {floor_s * 1e3:.2f} ms a transfer is "
                   f"{floor_s / prediction.predicted_s * 100:.0f}% of the predicted {prediction.predicted_s * 1e3:.1f} ms")
    repeated = len(seconds) > 1
    return TransferRow(backend, point.purpose, point.delay_ms, point.rate_mbit, point.loss_pct, point.size_bytes,
                       point.connections, prediction.predicted_s, prediction.how, prediction.model_s,
                       prediction.mathis_s, sum(seconds) / len(seconds), limited,
                       tuple(seconds) if repeated else (), prediction.model_draws_s if repeated else (),
                       prediction.predicted_se_s)


def _own_figures(kind: str, log) -> tuple[float, float]:
    """A real backend's ceiling (Mbit/s) and floor (s a transfer): the best of CEILING_REPEATS transfers each."""
    log(f"{kind}: the ceiling ({CEILING.size_bytes // 2**20} MiB) and the floor ({FLOOR.size_bytes // 2**10} KiB), "
        f"no delay, no rate limit, the best of {CEILING_REPEATS}")
    _, measured = _measure(kind, [CEILING] * CEILING_REPEATS + [FLOOR] * CEILING_REPEATS, log)
    ceiling = CEILING.size_bytes * 8 / min(s for p, _, s in measured if p.purpose == "ceiling") / 1e6
    return ceiling, min(s for p, _, s in measured if p.purpose == "floor")


def measure_backend(kind: str, points: Sequence[Point], log, repeats: int = 1
                    ) -> tuple[list[TransferRow], BackendFigures]:
    """Every point on one backend (a real one's ceiling and floor first; a lossy point `repeats` times, each draw
    over a link of its own seed: grid.draws), and the figures its rows give."""
    ceiling = floor = None
    if not (BACKENDS.get(kind) and BACKENDS[kind].simulated):
        ceiling, floor = _own_figures(kind, log)
    groups: dict[tuple, list[Point]] = {}
    of: dict[Point, Point] = {}  # each draw's point
    for point in points:
        for draw in grids.draws(point, repeats):
            groups.setdefault((draw.link_key, draw.seed), []).append(draw)
            of[draw] = point
    seconds: dict[Point, list[float]] = {point: [] for point in points}
    name = kind
    for (key, seed), members in groups.items():
        log(f"{kind}: RTT {2 * key[0]:g} ms, {key[1]:g} Mbit/s, loss {key[2]:g}%" + (f", seed {seed}" if seed else ""))
        name, measured = _measure(kind, members, log)
        for draw, _, took in measured:
            seconds[of[draw]].append(took)
    rows = [_row(name, point, seconds[point], ceiling, floor, repeats) for point in points]
    return rows, figures_of(name, rows, ceiling, floor)


def figures_of(backend: str, rows: Sequence[TransferRow], ceiling_mbit: float | None,
               floor_s: float | None = None) -> BackendFigures:
    """The window's cap from the cap rows' plateau, and slow start's rounds at small sizes (see the module doc)."""
    caps = sorted((r for r in rows if r.purpose == "cap"), key=lambda r: r.size_bytes)
    cap = cap_rtt = None
    if len(caps) >= 2 and caps[-1].measured_s > caps[0].measured_s:
        rate = (caps[-1].size_bytes - caps[0].size_bytes) / (caps[-1].measured_s - caps[0].measured_s)
        cap, cap_rtt = rate * caps[0].rtt_ms / 1e3, caps[0].rtt_ms
    slow = []
    for r in rows:
        if (r.delay_ms, r.rate_mbit, r.loss_pct) == SLOW_START_LINK and r.connections == 1 \
                and r.size_bytes in SLOW_START_SIZES:
            point = Point(r.delay_ms, r.rate_mbit, r.loss_pct, r.size_bytes)
            slow.append(SlowStartRow(r.size_bytes, rounds_of(point, r.predicted_s), rounds_of(point, r.measured_s)))
    return BackendFigures(backend, ceiling_mbit, cap, cap_rtt, tuple(sorted(slow, key=lambda s: s.size_bytes)),
                          floor_s)


def run(args: argparse.Namespace, console) -> TransportResult:
    shapers = shaper_list(args.shapers)
    if not isinstance(args.max_point_s, (int, float)) or not args.max_point_s > 0:
        raise ConfigError(f"expected a positive number of seconds, got {args.max_point_s!r}", key="--max-point-s")
    repeats = getattr(args, "repeats", grids.REPEATS)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"expected a whole number of transfers of at least 1, got {repeats!r}", key="--repeats")
    points, left = grids.grid(bool(args.quick), float(args.max_point_s))
    log = log_to(console)
    left_out = tuple(f"{describe(p)}: estimated {grids.estimate_s(p):.1f} s, over --max-point-s" for p in left)
    rows: list[TransferRow] = []
    figures = []
    for kind in shapers:
        backend_rows, backend_figures = measure_backend(kind, points, log, repeats)
        rows += backend_rows
        figures.append(backend_figures)
    return TransportResult(tuple(f.backend for f in figures), bool(args.quick), tuple(rows), tuple(figures),
                           left_out, KERNEL_WINDOW_CAP_BYTES, repeats)


def describe(point: Point) -> str:
    return (f"RTT {2 * point.delay_ms:g} ms, {point.rate_mbit:g} Mbit/s, loss {point.loss_pct:g}%, "
            f"{grids.size_text(point.size_bytes)} on {point.connections}")


# --- printing ------------------------------------------------------------------------------------------------------
def _cell(value: float | None, fmt: str = ".4f") -> str:
    return "" if value is None or not math.isfinite(value) else format(value, fmt)


def backend_table(result: TransportResult, backend: str):
    from rich.table import Table

    table = Table(title=f"transport \"kernel\" on {backend}: a transfer's time, first write to last byte, beside "
                        "testbed.core.tcp (RTT = 2 x one way; S on n connections of S / n; a lossy point: the mean "
                        f"of {result.repeats} draws, each on a seed of its own, \u00b1 its standard error \\[min-max])")
    for col in ("purpose", "RTT ms", "Mbit/s", "loss %", "size", "n", "predicted s", "how", "model s", "Mathis s",
                "measured s", "error %", "vs model %", "note"):
        table.add_column(col, justify="left" if col in ("purpose", "how", "note") else "right")
    for r in result.transport_rows:
        if r.backend == backend:
            table.add_row(r.purpose, f"{r.rtt_ms:g}", f"{r.rate_mbit:g}", f"{r.loss_pct:g}",
                          grids.size_text(r.size_bytes), str(r.connections), predicted_cell(r), r.how,
                          _cell(r.model_s), _cell(r.mathis_s), measured_cell(r), error_cell(r),
                          f"{r.model_error_pct:+.2f}", r.limited)
    return table


def figures_table(result: TransportResult):
    from rich.table import Table

    table = Table(title=f"Per backend: its ceiling, its floor (a 64 KiB transfer, no delay), the window's cap (model: "
                        f"{result.window_cap_model_bytes} B) and slow start's rounds (predicted / measured, by size)")
    for col in ("backend", "ceiling Mbit/s", "floor ms", "window cap B", "cap MiB", "at RTT ms", "slow start rounds"):
        table.add_column(col, justify="right")
    for f in result.figures:
        rounds = ", ".join(f"{grids.size_text(s.size_bytes)} {s.predicted_rounds:.2f}/{s.measured_rounds:.2f}"
                           for s in f.slow_start)
        table.add_row(f.backend, _cell(f.ceiling_mbit, ".0f"), _cell(None if f.floor_s is None else f.floor_s * 1e3, ".2f"),
                      _cell(f.window_cap_bytes, ".0f"),
                      _cell(None if f.window_cap_bytes is None else f.window_cap_bytes / 2**20, ".3f"),
                      _cell(f.cap_rtt_ms, "g"), rounds)
    return table


def show(result: TransportResult, args: argparse.Namespace, console) -> None:
    print_tables(console, [*(backend_table(result, b) for b in result.backends), figures_table(result)])
    log = log_to(console)
    for line in result.left_out:
        log(f"left out: {line}")
    if args.json:
        write_json(args.json, result.to_json(indent=2), console)
