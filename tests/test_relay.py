"""The userspace relay: deadline arithmetic, timing on Trio's MockClock, and the Stream contract."""

import math

import pytest
import trio
import trio.testing

from testbed.core.records import LinkSpec
from netem.userspace import TRIO_CLOCK, LinkTiming, relay
from testbed.core.errors import ShapingError


def test_delay_only():
    t = LinkTiming(delay_s=0.010)
    assert t.deadline(1.0, 1000) == pytest.approx(1.010)
    assert t.deadline(1.0005, 1000) == pytest.approx(1.0105)  # several messages in flight at once


def test_serialization_is_separate_from_propagation():
    t = LinkTiming(delay_s=0.010, rate_bytes_s=1e6)  # 1 MB/s: 1000 bytes take 1 ms
    assert t.deadline(0.0, 1000) == pytest.approx(0.011)
    # arrives while the first is still serializing: waits for the wire, not for the first's propagation
    assert t.deadline(0.0005, 1000) == pytest.approx(0.012)
    # arrives after the wire is idle again
    assert t.deadline(1.0, 1000) == pytest.approx(1.011)


def test_jitter_is_seeded_and_fifo():
    a = LinkTiming(delay_s=0.010, jitter_s=0.005, seed=3)
    b = LinkTiming(delay_s=0.010, jitter_s=0.005, seed=3)
    times = [i * 0.0001 for i in range(500)]
    da = [a.deadline(t, 100) for t in times]
    assert da == [b.deadline(t, 100) for t in times]
    assert all(x <= y for x, y in zip(da, da[1:]))  # never reordered
    assert len({round(d - t, 6) for d, t in zip(da, times)}) > 50  # and really jittered


def test_loss_costs_a_retransmission_timeout():
    t = LinkTiming(delay_s=0.010, loss=1.0, rto_s=0.2)
    assert t.deadline(0.0, 10) == pytest.approx(0.210)
    t = LinkTiming(delay_s=0.010, loss=0.1, rto_s=0.2, seed=1)
    extra = [t.deadline(i * 1.0, 10) - i * 1.0 - 0.010 for i in range(2000)]
    lost = sum(e > 0.1 for e in extra) / len(extra)
    assert lost == pytest.approx(0.1, abs=0.02)


def test_from_spec_units_and_bad_input():
    t = LinkTiming.from_spec(LinkSpec(0, 1, delay_ms=130, jitter_ms=2, loss_pct=1, rate_mbit=8))
    assert (t.delay_s, t.jitter_s, t.loss, t.rate_bytes_s) == (0.130, 0.002, 0.01, 1e6)
    assert LinkTiming.from_spec(LinkSpec(0, 1, 5)).rate_bytes_s == math.inf
    with pytest.raises(ShapingError):
        LinkTiming(delay_s=-1)


async def test_relay_releases_on_time_mock_clock(autojump_clock):
    a, r1 = trio.testing.memory_stream_pair()
    r2, b = trio.testing.memory_stream_pair()
    timing = LinkTiming(delay_s=0.050, rate_bytes_s=100_000)  # 1000 bytes serialize in 10 ms
    arrivals = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay, r1, r2, timing, TRIO_CLOCK)
        start = trio.current_time()
        await a.send_all(b"x" * 1000)
        await trio.testing.wait_all_tasks_blocked()  # the relay has taken the first chunk
        await a.send_all(b"y" * 1000)  # right behind: waits 10 ms for the wire
        received = 0
        while received < 2000:
            chunk = await b.receive_some()
            received += len(chunk)
            arrivals.append((trio.current_time() - start, chunk[:1]))
        nursery.cancel_scope.cancel()
    assert arrivals[0] == (pytest.approx(0.060), b"x")
    assert arrivals[-1] == (pytest.approx(0.070), b"y")


async def test_reverse_direction_is_not_delayed(autojump_clock):
    a, r1 = trio.testing.memory_stream_pair()
    r2, b = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay, r1, r2, LinkTiming(delay_s=1.0), TRIO_CLOCK)
        start = trio.current_time()
        await b.send_all(b"ack")
        assert await a.receive_some() == b"ack"
        assert trio.current_time() - start < 0.001
        nursery.cancel_scope.cancel()


async def test_relay_is_a_proper_two_way_stream():
    async with trio.open_nursery() as nursery:
        async def maker():
            a, r1 = trio.testing.memory_stream_pair()
            r2, b = trio.testing.memory_stream_pair()
            nursery.start_soon(relay, r1, r2, LinkTiming(delay_s=0.001))
            return a, b

        with trio.fail_after(30):
            await trio.testing.check_two_way_stream(maker, None)
        nursery.cancel_scope.cancel()
