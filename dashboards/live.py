"""Live terminal dashboard of a run: the task that redraws the latest RunSummary until cancelled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio
from rich.console import Console
from rich.live import Live

from dashboards.plots import MEASURED_MARK
from dashboards.render import render, render_line, render_summary
from testbed.core.summary import RunSummary

__all__ = ["DEFAULT_INTERVAL_S", "LINE_MIN_INTERVAL_S", "MEASURED_MARK", "render", "render_line", "render_summary",
           "run_dashboard"]

DEFAULT_INTERVAL_S: Final = 0.5
LINE_MIN_INTERVAL_S: Final = 2.0  # plain-text status lines at most this often (CI logs, pipes)


async def run_dashboard(
    get_summary: Callable[[], RunSummary | None],
    *,
    console: Console,
    interval_s: float = DEFAULT_INTERVAL_S,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Show the run until cancelled: a live frame on a terminal, a status line now and then elsewhere.

    Only this task refreshes (no rich refresh thread); each get_summary() call is drawn once, and on
    cancellation a final frame or line is drawn from one more call.

        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_dashboard, get_summary, console=Console()))
    """
    task_status.started()
    if console.is_terminal:
        with Live(console=console, auto_refresh=False, screen=False) as live:

            def draw() -> None:
                live.update(render(get_summary(), console.width, console.height), refresh=True)

            await _repeat(draw, interval_s)
    else:

        def draw() -> None:
            console.print(render_line(get_summary()), markup=False, highlight=False, soft_wrap=True)

        await _repeat(draw, max(interval_s, LINE_MIN_INTERVAL_S))


async def _repeat(draw: Callable[[], None], interval_s: float) -> None:
    """draw() every interval_s until cancelled, then once more so the last state stays on screen."""
    try:
        while True:
            draw()
            await trio.sleep(interval_s)
    finally:
        try:
            draw()
        except Exception:  # never let the last frame mask the cancellation or the real error
            pass
