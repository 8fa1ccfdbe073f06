"""Precise waits and arrival prediction (the real-time ones are `slow`: a loaded box makes them miss)."""

import pytest
import trio
import trio.testing

from testbed.core import clock


@pytest.mark.fidelity
async def test_sleep_until_is_precise():
    errors = []
    for _ in range(20):
        deadline = clock.now() + 0.003
        await clock.sleep_until(deadline)
        errors.append(clock.now() - deadline)
    assert min(errors) >= 0
    assert sorted(errors)[10] < 0.0005  # median error well under the 1 ms timer tick


def test_arrival_predictor_window():
    p = clock.ArrivalPredictor(lead_s=0.002)
    assert p.window() is None
    for t in (1.0, 1.1, 1.2):
        p.observe(t)
    start, end = p.window()
    assert start == pytest.approx(1.3 - 0.002 - 0.001) and end == pytest.approx(1.3 + 0.01)


@pytest.mark.fidelity
async def test_receive_polling_gets_early_on_time_and_late_data():
    a, b = trio.testing.memory_stream_pair()
    pending = bytearray()

    def raw_recv(n):
        if not pending:
            raise BlockingIOError
        data = bytes(pending[:n])
        del pending[:n]
        return data

    p = clock.ArrivalPredictor(lead_s=0.002)
    t = clock.now()
    period = 0.5  # a wide window (10% of the period after the expected arrival): a loaded box may wake late
    for i in range(3):
        p.observe(t - 2 * period + i * period)  # next arrival expected at ~t + period
    with trio.fail_after(5):
        await a.send_all(b"early")  # before the window: the blocking receive gets it
        assert await clock.receive_polling(b, raw_recv, p, 100) == b"early"
        pending += b"polled"  # inside the window: found by polling
        await trio.sleep(max(0.0, p.window()[0] - clock.now()) + 0.001)
        assert await clock.receive_polling(b, raw_recv, p, 100) == b"polled"
        await a.send_all(b"late")  # after the window: falls back to the blocking receive
        assert await clock.receive_polling(b, raw_recv, p, 100) == b"late"
