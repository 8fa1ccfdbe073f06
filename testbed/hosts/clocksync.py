"""Clocks across hosts: each node's offset to the entry node's clock, from probe exchanges (Cristian, min-RTT).

On one box every process reads the same CLOCK_MONOTONIC, so a hop's one-way latency is a difference of two
stamps. Across hosts there is no common clock: stage compute and lap time stay exact (each is a difference on
one clock), but a hop's latency, recv on the next host minus send on this one, needs the next host's offset.

    entry                     node i (its clock server)
    t0 ---- 8-byte probe ---->
                              ts = node clock now
    t1 <--- probe id + ts ----

The node read its clock at some instant in [t0, t1], so its offset to the entry (node clock - entry clock) lies
in [ts - t1, ts - t0]: the midpoint is the estimate and half the round trip is a hard bound on its error. Of
many exchanges the one with the smallest round trip gives the tightest bound (the min-RTT filter). On a LAN
that is ~0.1 ms; a shaped link must not carry the probes (the egress shaper shapes the data port only).

The estimate is checked through the run: the entry probes again every `RESYNC_S` seconds. Two estimates whose
bound intervals do not overlap (after allowing for the fitted drift) mean the offset moved, and the run says
so. (Summing a lap's corrected hops and stage times cannot reveal a wrong offset: the offsets cancel in the
sum, which always equals the lap. What can reveal one is a hop whose corrected latency is negative beyond its
bound, a message received before it was sent: `clock_violations` counts those.)

Probe frames are fixed-size structs (never pickle).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import trio

from testbed.core.clock import now
from testbed.core.errors import LinkBroken, PeerTimeout
from testbed.core.records import Address, LapRecord, Stamp

PROBE = struct.Struct("!Q")  # probe id
REPLY = struct.Struct("!Qd")  # probe id, the server's clock (seconds)
PROBES = 32  # exchanges per estimate
PROBE_GAP_S = 0.002
RESYNC_S = 2.0  # the entry re-estimates every node's offset this often during the run
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OffsetEstimate:
    """One node's clock minus the entry's, at entry time `at`, with a hard error bound."""

    offset_s: float
    bound_s: float  # |true offset - offset_s| <= bound_s (half the smallest round trip)
    rtt_min_s: float
    at: float  # entry clock when it was taken
    samples: int

    def agrees_with(self, other: "OffsetEstimate", drift: float = 0.0) -> bool:
        """Whether the two bound intervals overlap once `drift` (seconds per second) is allowed for."""
        expected = self.offset_s + drift * (other.at - self.at)
        return abs(other.offset_s - expected) <= self.bound_s + other.bound_s + 1e-6


def estimate(exchanges: list[tuple[float, float, float]], at: float | None = None) -> OffsetEstimate:
    """The min-RTT estimate from (t0, ts, t1) exchanges (t0, t1 on the entry's clock, ts on the node's)."""
    if not exchanges:
        raise ValueError("no clock probe exchanges to estimate an offset from")
    t0, ts, t1 = min(exchanges, key=lambda e: e[2] - e[0])
    rtt = t1 - t0
    return OffsetEstimate(offset_s=ts - (t0 + t1) / 2, bound_s=rtt / 2, rtt_min_s=rtt,
                          at=(t0 + t1) / 2 if at is None else at, samples=len(exchanges))


async def serve_clock(stream: trio.SocketStream, clock=now) -> None:
    """Answer probes on one connection until it closes: each 8-byte id gets back the id and `clock()`."""
    buffer = b""
    async with stream:
        while True:
            try:
                data = await stream.receive_some(4096)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            buffer += data
            replies = []
            while len(buffer) >= PROBE.size:
                (probe_id,), buffer = PROBE.unpack(buffer[:PROBE.size]), buffer[PROBE.size:]
                replies.append(REPLY.pack(probe_id, clock()))
            try:
                await stream.send_all(b"".join(replies))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        if not chunk:
            raise ConnectionError("clock server closed the connection")
        data += chunk
    return data


class ClockProbe:
    """The entry's connection to one node's clock server; `measure()` gives a fresh estimate."""

    def __init__(self, address: Address, probes: int = PROBES) -> None:
        self.address = address
        self.probes = probes
        self._stream: trio.SocketStream | None = None
        self._next_id = 0

    async def measure(self) -> OffsetEstimate:
        """A fresh estimate; LinkBroken when the clock server's connection fails, PeerTimeout when it is silent."""
        try:
            with trio.fail_after(PROBE_TIMEOUT_S):
                return await self._exchange()
        except trio.TooSlowError as exc:
            await self.aclose()
            raise PeerTimeout(f"clock server {self.address} did not answer within {PROBE_TIMEOUT_S:g} s") from exc
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self.aclose()  # the next measure() dials again
            raise LinkBroken(f"clock server {self.address}: {exc}") from exc

    async def _exchange(self) -> OffsetEstimate:
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(*self.address)
        exchanges = []
        for _ in range(self.probes):
            self._next_id += 1
            t0 = now()
            await self._stream.send_all(PROBE.pack(self._next_id))
            probe_id, ts = REPLY.unpack(await _receive_exactly(self._stream, REPLY.size))
            t1 = now()
            if probe_id != self._next_id:
                raise ConnectionError(f"clock server {self.address} answered probe {probe_id}, "
                                      f"expected {self._next_id}")
            exchanges.append((t0, ts, t1))
            await trio.sleep(PROBE_GAP_S)
        return estimate(exchanges)

    async def aclose(self) -> None:
        if self._stream is not None:
            await trio.aclose_forcefully(self._stream)
            self._stream = None


@dataclass
class OffsetTrack:
    """Every estimate of one node's offset over a run, the drift fitted to them and their disagreements."""

    stage: int
    estimates: list[OffsetEstimate]
    moved: int = 0  # re-estimates that disagreed with the fit so far (the offset jumped)

    def add(self, new: OffsetEstimate) -> bool:
        """Record a re-estimate; False when it disagrees with the earlier ones (counted in `moved`)."""
        ok = not self.estimates or self.estimates[-1].agrees_with(new, self.drift())
        self.moved += 0 if ok else 1
        self.estimates.append(new)
        return ok

    @property
    def best(self) -> OffsetEstimate:
        return min(self.estimates, key=lambda e: e.bound_s)

    def drift(self) -> float:
        """Seconds per second (least squares over the estimates; 0 with fewer than two)."""
        if len(self.estimates) < 2:
            return 0.0
        ts = [e.at for e in self.estimates]
        os_ = [e.offset_s for e in self.estimates]
        mt, mo = sum(ts) / len(ts), sum(os_) / len(os_)
        var = sum((t - mt) ** 2 for t in ts)
        return sum((t - mt) * (o - mo) for t, o in zip(ts, os_)) / var if var > 0 else 0.0

    def offset_at(self, t: float) -> tuple[float, float]:
        """(offset, bound) at entry time t: the tightest estimate carried along the fitted drift."""
        best = self.best
        drift = self.drift()
        return best.offset_s + drift * (t - best.at), best.bound_s

    def to_dict(self) -> dict:
        best = self.best
        return {"stage": self.stage, "offset_ms": best.offset_s * 1e3, "bound_ms": best.bound_s * 1e3,
                "rtt_min_ms": best.rtt_min_s * 1e3, "estimates": len(self.estimates),
                "drift_ppm": self.drift() * 1e6, "moved": self.moved}


def _shift(stamp: Stamp, offset: float) -> Stamp:
    return replace(stamp, recv=stamp.recv - offset, compute_start=stamp.compute_start - offset,
                   real_end=stamp.real_end - offset, compute_end=stamp.compute_end - offset,
                   send=stamp.send - offset)


def to_entry_clock(record: LapRecord, tracks: dict[int, OffsetTrack]) -> LapRecord:
    """The lap with every stage's stamps moved onto the entry's clock (stages without a track are on it)."""
    if not tracks:
        return record
    stamps = tuple(_shift(s, tracks[s.stage].offset_at(record.start)[0]) if s.stage in tracks else s
                   for s in record.stamps)
    return replace(record, stamps=stamps)


def hop_bounds_s(n_hops: int, tracks: dict[int, OffsetTrack]) -> list[float]:
    """Error bound of each ring hop's one-way latency (hop i: stage i -> i + 1): both ends' offset bounds."""
    def bound(stage: int) -> float:
        return tracks[stage].best.bound_s if stage in tracks else 0.0
    return [bound(i) + bound((i + 1) % n_hops) for i in range(n_hops)]


def clock_violations(record: LapRecord, bounds_s: list[float]) -> int:
    """Hops of this (corrected) lap received before they were sent, beyond the offsets' bounds."""
    hops = record.hop_latencies_s()
    return sum(1 for i, hop in enumerate(hops) if i < len(bounds_s) and hop < -bounds_s[i] - 1e-6)
