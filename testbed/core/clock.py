"""The box's one clock (CLOCK_MONOTONIC, shared by every process) and precise waits on it."""

from __future__ import annotations

import time

import trio

# Trio's epoll timeouts round up to whole milliseconds (measured here: trio.sleep is 0.3-1.3 ms late),
# so sleep until this much before the deadline, then spin on checkpoints. Long sleeps on these VMs wake
# later still (a process idle for 100+ ms is slow to get going again), so the margin grows with the wait.
SPIN_MARGIN_S = 0.0015
SPIN_MARGIN_FRACTION = 0.02

now = time.monotonic


async def sleep_until(deadline: float, *, margin_s: float = SPIN_MARGIN_S) -> None:
    """Wait until `deadline` (monotonic seconds) with ~microsecond error, yielding to other tasks while spinning."""
    remaining = deadline - now()
    margin_s += SPIN_MARGIN_FRACTION * remaining
    if remaining > margin_s:
        await trio.sleep(remaining - margin_s)
    while now() < deadline:
        await trio.lowlevel.checkpoint()


def spin_until(deadline: float, *, margin_s: float = SPIN_MARGIN_S) -> None:
    """Blocking variant for synchronous code: sleep most of the way, then busy-wait."""
    remaining = deadline - now()
    margin_s += SPIN_MARGIN_FRACTION * remaining
    if remaining > margin_s:
        time.sleep(remaining - margin_s)
    while now() < deadline:
        pass


# On these VMs a process woken from a long sleep pays 0.5-1 ms before it runs (measured here: a Trio
# receiver idle for 30 ms sees a 600-byte message ~1.1 ms after it was sent; one that polls sees it
# after ~0.17 ms). Receivers that can predict an arrival poll for it instead of sleeping.
SPIN_LEAD_S = 0.002
PREDICT_HISTORY = 8


class ArrivalPredictor:
    """Predicts the next arrival from the recent inter-arrival periods (laps are regular)."""

    def __init__(self, lead_s: float = SPIN_LEAD_S, history: int = PREDICT_HISTORY) -> None:
        self.lead_s = lead_s
        self._arrivals: list[float] = []
        self._history = history

    def observe(self, arrival: float) -> None:
        self._arrivals.append(arrival)
        del self._arrivals[: -(self._history + 1)]

    def window(self) -> tuple[float, float] | None:
        """(start, end) of the interval in which to poll for the next arrival, or None without a pattern yet."""
        if len(self._arrivals) < 3:
            return None
        periods = sorted(b - a for a, b in zip(self._arrivals, self._arrivals[1:]))
        period = periods[len(periods) // 2]
        expected = self._arrivals[-1] + period
        # Laps are padded precisely, so arrivals rarely drift by more than a percent of the period.
        return expected - self.lead_s - 0.01 * period, expected + max(self.lead_s, 0.1 * period)


async def receive_polling(stream: trio.SocketStream, raw_recv, predictor: ArrivalPredictor | None,
                          max_bytes: int) -> bytes:
    """stream.receive_some, but awake (polling `raw_recv`, a non-blocking recv) in the predicted window."""
    window = predictor.window() if predictor is not None else None
    if window is not None:
        start, end = window
        ahead = start - now()  # read the clock once: a second read could be past `start` (a negative timeout)
        if ahead > 0:
            with trio.move_on_after(ahead):
                return await stream.receive_some(max_bytes)  # cancel-safe: nothing is lost if it times out
        while now() < end:
            try:
                return raw_recv(max_bytes)
            except BlockingIOError:
                await trio.lowlevel.checkpoint()
    return await stream.receive_some(max_bytes)


class Clock:
    """The box's one clock as an object that is passed in (tests hand in another, as Trio's MockClock is)."""

    def now(self) -> float:
        return now()

    async def sleep_until(self, deadline: float) -> None:
        await sleep_until(deadline)

    def spin_until(self, deadline: float) -> None:
        spin_until(deadline)

    async def hold_until(self, deadline: float) -> None:
        """Keep the task busy until `deadline`, as a device computing would: on the box the task does not yield
        (a drafter's padded step), on the virtual clock it is a sleep (nothing else can pass the time)."""
        spin_until(deadline)


class TrioClock(Clock):
    """Trio's own clock: under `trio.testing.MockClock` (the virtual backend) simulated time, exact and cost-free.

    Waits are plain Trio sleeps: on a MockClock with autojump nothing is late, so there is nothing to spin for.
    """

    def now(self) -> float:
        return trio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    def spin_until(self, deadline: float) -> None:
        raise RuntimeError("a blocking wait cannot pass simulated time: use `await clock.hold_until(deadline)`")

    async def hold_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)


MONOTONIC = Clock()
TRIO = TrioClock()
