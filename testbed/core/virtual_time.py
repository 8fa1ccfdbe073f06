"""Simulated time: run a Trio program on `trio.testing.MockClock` (autojump), deterministically, from real time.

    summary = await virtual_time.run(launcher_main)   # from a running (real-time) Trio program
    summary = virtual_time.run_sync(launcher_main)    # from plain code

Time passes only when every task waits (MockClock(autojump_threshold=0) jumps to the next deadline), so compute
that does not sleep takes no simulated time, and nothing is ever late. Trio picks the order of tasks that became
runnable at the same moment at random (its scheduler's `_r`, one per interpreter); a virtual run replaces that
with a generator of its own, seeded, in its own thread, so the same program gives the same run, every time
(as Shadow holds itself to: a difference between two runs is a bug, not noise).
"""

from __future__ import annotations

import random
import threading
from typing import Any, Awaitable, Callable

import trio
import trio.testing

SCHEDULER_SEED = 0

_LOCAL = threading.local()  # this thread's scheduler generator while a virtual run is on it
_LOCK = threading.Lock()
_ACTIVE = [0]  # virtual runs in progress (the scheduler stays deterministic while any is)


class _PerThreadRandom(random.Random):
    """Trio's scheduler generator, per thread: a virtual run's own seeded one, else Trio's (real-time runs). A
    Random whose two sources draw from that generator, so every method Trio calls (shuffle, random, uniform)
    draws what the generator's own would."""

    def __init__(self, fallback: random.Random) -> None:
        self._fallback = fallback
        super().__init__()

    def _current(self) -> random.Random:
        return getattr(_LOCAL, "rng", None) or self._fallback

    def random(self) -> float:
        return self._current().random()

    def getrandbits(self, k: int) -> int:
        return self._current().getrandbits(k)


def _scheduler_module():
    from trio._core import _run  # the one private hook this module needs; tests/test_virtual checks it holds

    return _run


def _enter(seed: int) -> None:
    run_module = _scheduler_module()
    with _LOCK:
        if not isinstance(run_module._r, _PerThreadRandom):
            run_module._r = _PerThreadRandom(run_module._r)
        if _ACTIVE[0] == 0:
            _ACTIVE.append(run_module._ALLOW_DETERMINISTIC_SCHEDULING)
            # each batch of runnable tasks in creation order, then shuffled by the seeded generator
            run_module._ALLOW_DETERMINISTIC_SCHEDULING = True
        _ACTIVE[0] += 1
    _LOCAL.rng = random.Random(seed)


def _exit() -> None:
    run_module = _scheduler_module()
    _LOCAL.rng = None
    with _LOCK:
        _ACTIVE[0] -= 1
        if _ACTIVE[0] == 0:
            run_module._ALLOW_DETERMINISTIC_SCHEDULING = _ACTIVE.pop()


def run_sync(async_fn: Callable[..., Awaitable[Any]], *args: Any, seed: int = SCHEDULER_SEED) -> Any:
    """`trio.run(async_fn, *args)` on a fresh MockClock(autojump_threshold=0) that starts at 0, deterministic."""
    _enter(seed)
    try:
        return trio.run(async_fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        _exit()


async def run(async_fn: Callable[..., Awaitable[Any]], *args: Any, seed: int = SCHEDULER_SEED) -> Any:
    """run_sync in a worker thread, from a real-time Trio program: its dashboard and exporter keep real time
    while the simulated world runs. Cancelling the caller (Ctrl-C, a timeout) cancels the simulated run, which
    unwinds (its teardown on simulated time) before this returns."""
    state: dict[str, Any] = {"cancelled": False}
    finished = threading.Event()

    async def inside() -> Any:
        with trio.CancelScope() as scope:
            state["scope"], state["token"] = scope, trio.lowlevel.current_trio_token()
            if state["cancelled"]:
                scope.cancel()
            return await async_fn(*args)
        raise trio.TooSlowError("the simulated run was cancelled")  # only reached when cancelled from outside

    def work() -> Any:
        try:
            return run_sync(inside, seed=seed)
        finally:
            finished.set()

    try:
        return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
    except BaseException:
        state["cancelled"] = True
        if "token" in state:
            try:
                state["token"].run_sync_soon(state["scope"].cancel)
            except trio.RunFinishedError:
                pass
        finished.wait()  # the simulated run unwinds at once: nothing in it waits on real time
        raise
