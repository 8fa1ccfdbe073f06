"""The box's one clock (CLOCK_MONOTONIC, shared by every process) and precise waits on it."""

from __future__ import annotations

import time

import trio

# Trio's epoll timeouts round up to whole milliseconds (measured here: trio.sleep is 0.3-1.3 ms late),
# so sleep until this much before the deadline, then spin on checkpoints.
SPIN_MARGIN_S = 0.0015

now = time.monotonic


async def sleep_until(deadline: float, *, margin_s: float = SPIN_MARGIN_S) -> None:
    """Wait until `deadline` (monotonic seconds) with ~microsecond error, yielding to other tasks while spinning."""
    remaining = deadline - now()
    if remaining > margin_s:
        await trio.sleep(remaining - margin_s)
    while now() < deadline:
        await trio.lowlevel.checkpoint()


def spin_until(deadline: float, *, margin_s: float = SPIN_MARGIN_S) -> None:
    """Blocking variant for synchronous code: sleep most of the way, then busy-wait."""
    remaining = deadline - now()
    if remaining > margin_s:
        time.sleep(remaining - margin_s)
    while now() < deadline:
        pass
