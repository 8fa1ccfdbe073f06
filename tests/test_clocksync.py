"""Clock offsets across hosts (testbed.hosts.clocksync): a skewed clock server is found within the probe's bound,
drift is fitted, a jump is flagged, and lap stamps move onto the entry's clock."""

from __future__ import annotations

import pytest
import trio

from testbed.hosts.clocksync import (ClockProbe, OffsetEstimate, OffsetTrack, clock_violations, estimate, hop_bounds_s,
                               serve_clock, to_entry_clock)
from testbed.core.clock import now
from testbed.core.errors import LinkBroken, PeerTimeout
from testbed.core.records import LapRecord, Stamp


def test_min_rtt_exchange_gives_the_estimate_and_its_bound():
    # node clock = entry clock + 5: the exchange with the 2 ms round trip wins over the 10 ms one
    exchanges = [(0.0, 5.0 + 0.008, 0.010), (1.0, 5.0 + 1.001, 1.002)]
    est = estimate(exchanges)
    assert est.rtt_min_s == pytest.approx(0.002)
    assert est.bound_s == pytest.approx(0.001)
    assert abs(est.offset_s - 5.0) <= est.bound_s
    with pytest.raises(ValueError, match="no clock probe"):
        estimate([])


@pytest.mark.parametrize("skew_s", [0.0, 0.0371, -12.5])
def test_a_skewed_clock_server_is_found_within_the_bound(skew_s):
    async def main():
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            await nursery.start(trio.serve_listeners, lambda s: serve_clock(s, clock=lambda: now() + skew_s),
                                listeners)
            probe = ClockProbe(("127.0.0.1", listeners[0].socket.getsockname()[1]), probes=16)
            try:
                return await probe.measure()
            finally:
                await probe.aclose()
                nursery.cancel_scope.cancel()

    est = trio.run(main)
    assert est.samples == 16
    assert abs(est.offset_s - skew_s) <= est.bound_s + 1e-9
    assert est.bound_s < 0.0005  # loopback: well under the 0.5 ms


async def _reset_after_one_reply(stream: trio.SocketStream) -> None:
    """A clock server whose host dies mid-probe: one reply, then a TCP reset (SO_LINGER 0)."""
    import socket
    import struct

    await stream.receive_some(8)
    await stream.send_all(b"\0" * 16)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def _silent(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


@pytest.mark.parametrize("server, error", [(_reset_after_one_reply, LinkBroken), (_silent, PeerTimeout)])
def test_a_clock_server_that_dies_or_hangs_is_a_testbed_error(server, error, monkeypatch):
    # the entry re-probes every node through the run: a node killed mid-probe must not crash it with a
    # foreign error (a reset is trio.BrokenResourceError, no OSError) but say which server, in our own type
    monkeypatch.setattr("testbed.hosts.clocksync.PROBE_TIMEOUT_S", 0.3)

    async def main():
        with trio.fail_after(10):
            await probe_a_failing_server()

    async def probe_a_failing_server():
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            await nursery.start(trio.serve_listeners, server, listeners)
            probe = ClockProbe(("127.0.0.1", listeners[0].socket.getsockname()[1]), probes=4)
            try:
                with pytest.raises(error, match="clock server"):
                    await probe.measure()
                assert probe._stream is None  # closed: the next measure() dials again
            finally:
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_drift_is_fitted_and_a_jump_is_flagged():
    track = OffsetTrack(1, [OffsetEstimate(0.010, 0.0001, 0.0002, at=0.0, samples=8)])
    assert track.add(OffsetEstimate(0.010 + 20e-6 * 2, 0.0001, 0.0002, at=2.0, samples=8))  # 20 ppm
    assert track.add(OffsetEstimate(0.010 + 20e-6 * 4, 0.0001, 0.0002, at=4.0, samples=8))
    assert track.drift() * 1e6 == pytest.approx(20.0, rel=1e-6)
    offset, bound = track.offset_at(10.0)
    assert offset == pytest.approx(0.010 + 20e-6 * 10, abs=1e-9) and bound == 0.0001
    assert not track.add(OffsetEstimate(0.015, 0.0001, 0.0002, at=6.0, samples=8))  # 5 ms off the fit
    assert track.moved == 1 and track.to_dict()["moved"] == 1


def lap(stamps, return_recv) -> LapRecord:
    return LapRecord(lap=1, kind="decode", mode="plain", n_tok=1, tokens=1, start=stamps[0].recv,
                     end=return_recv + 0.001, stamps=tuple(stamps), return_recv=return_recv)


def stamp(stage: int, recv: float, send: float) -> Stamp:
    return Stamp(stage=stage, recv=recv, compute_start=recv, real_end=send, compute_end=send, send=send)


def test_stamps_move_onto_the_entry_clock_and_hops_come_out_right():
    # true hops 0.030, 0.010, 0.020 s; stage 1's clock is 100 s ahead, stage 2's 3 s behind
    true = [stamp(0, 0.0, 0.005), stamp(1, 0.035, 0.040), stamp(2, 0.050, 0.055)]
    skewed = [true[0], stamp(1, 100.035, 100.040), stamp(2, -2.950, -2.945)]
    tracks = {1: OffsetTrack(1, [OffsetEstimate(100.0, 0.0002, 0.0004, 0.0, 8)]),
              2: OffsetTrack(2, [OffsetEstimate(-3.0, 0.0001, 0.0002, 0.0, 8)])}
    raw = lap(skewed, 0.075)
    assert raw.hop_latencies_s()[0] == pytest.approx(100.030)
    fixed = to_entry_clock(raw, tracks)
    assert fixed.hop_latencies_s() == pytest.approx([0.030, 0.010, 0.020])
    assert fixed.ring_s == pytest.approx(raw.ring_s)  # the offsets cancel in the sum: it cannot show a bad offset
    bounds = hop_bounds_s(3, tracks)
    assert bounds == pytest.approx([0.0002, 0.0003, 0.0001])
    assert clock_violations(fixed, bounds) == 0
    wrong = {1: OffsetTrack(1, [OffsetEstimate(100.010, 0.0002, 0.0004, 0.0, 8)]), 2: tracks[2]}
    assert to_entry_clock(raw, wrong).hop_latencies_s() == pytest.approx([0.020, 0.020, 0.020])
    assert clock_violations(to_entry_clock(raw, wrong), bounds) == 0  # 10 ms off and nothing shows it
    worse = {1: OffsetTrack(1, [OffsetEstimate(100.035, 0.0002, 0.0004, 0.0, 8)]), 2: tracks[2]}
    assert clock_violations(to_entry_clock(raw, worse), bounds) == 1  # 0->1 received 5 ms before it was sent
