"""The probe's far end as a server: framed messages over one connection, each answered, so a probe whose two ends do
not share a clock (or a process) can still time them.

    sender                                   far end (serve_peer)
    t0 --- FRAME(ONE_WAY, n) + n bytes --->  stamp t1 (the kernel's arrival stamp of its last byte, its clock)
       <-- FRAME(STAMPED, 8) + t1 ---------  one-way = t1 - offset - t0  (offset: far clock - near clock)
    t0 --- FRAME(PING, n) + n bytes ------>
    t2 <-- FRAME(PONG, n) + n bytes -------  round trip = t2 - t0 (one clock: no offset)

The ping-pong is NetPIPE's own mode: a message and a reply of its size. A one-way time is a difference of two clocks,
so it is only as good as the offset between them: on separate hosts the sender estimates it from clock probes
(testbed.hosts.clocksync) just before and just after the link, and every one-way figure of the link carries the
offset's error bound (offset_hull). A frame's header is 9 bytes beside its n (left out of the sizes: it is a third
of a 64-byte message's serialization, 0.7 us at 1 Gbit/s).

Frames are fixed structs and zero bytes (never pickle).
"""

from __future__ import annotations

import collections
import json
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import trio

from testbed.core.errors import LinkBroken, PeerTimeout
from testbed.studies.probe.ladder import MAX_SIZE, size_text
from testbed.studies.probe.result import LinkRow, PingRow, SizeRow

FRAME = struct.Struct("!BQ")  # kind, payload bytes
STAMP = struct.Struct("!d")  # the far end's clock (seconds) when a ONE_WAY frame's last byte came
ONE_WAY, PING, STAMPED, PONG = 1, 2, 3, 4
KINDS = (ONE_WAY, PING, STAMPED, PONG)
REPLY_GRACE_S = 30.0  # a reply later than its plausible time by this much: the link is broken
MIN_GAP_S = 0.02  # between ping-pongs (measure.MIN_GAP_S: the relay is not kept spinning)
MIN_SAMPLES = 3

Receive = Callable[[], Awaitable[tuple[bytes, float]]]  # the next bytes and when they came


@dataclass(frozen=True)
class Frame:
    kind: int
    size: int
    stamp: float  # when its last byte came (the receiving end's clock)
    body: bytes = b""  # kept for a STAMPED frame only (the others' bytes are counted, not kept)


class FrameReader:
    """Frames out of a byte stream's pieces, each with its last piece's arrival stamp."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._kind = 0
        self._left = -1  # payload bytes still to come (-1: reading a header)
        self._body = bytearray()

    def feed(self, data: bytes, stamp: float) -> list[Frame]:
        out: list[Frame] = []
        i = 0
        while i < len(data) or (self._left == 0):
            if self._left == 0:
                out.append(Frame(self._kind, self._size, stamp, bytes(self._body)))
                self._left = -1
                continue
            if self._left < 0:
                take = min(FRAME.size - len(self._head), len(data) - i)
                self._head += data[i:i + take]
                i += take
                if len(self._head) == FRAME.size:
                    self._kind, self._size = FRAME.unpack(self._head)
                    if self._kind not in KINDS or self._size > MAX_SIZE:
                        raise LinkBroken(f"the probe's peer sent a frame it does not speak (kind {self._kind}, "
                                         f"{self._size} bytes)")
                    self._head.clear()
                    self._body.clear()
                    self._left = self._size
                continue
            take = min(self._left, len(data) - i)
            if self._kind == STAMPED:
                self._body += data[i:i + take]
            i += take
            self._left -= take
        return out


async def serve_peer(receive: Receive, send: Callable[[bytes], Awaitable[None]]) -> None:
    """The far end: a ONE_WAY frame is answered with its arrival stamp, a PING with a PONG of its size; until the
    connection closes."""
    reader = FrameReader()
    while True:
        data, stamp = await receive()
        if not data:
            return
        for frame in reader.feed(data, stamp):
            if frame.kind == ONE_WAY:
                await send(FRAME.pack(STAMPED, STAMP.size) + STAMP.pack(frame.stamp))
            elif frame.kind == PING:
                await send(FRAME.pack(PONG, frame.size) + bytes(frame.size))


class PeerProbe:
    """The sending end of a link to a serve_peer: one-way messages timed by the far end's stamps less `offset_s`
    (far clock - this clock), and ping-pongs; `message` and `train` as measure.LinkProbe's, for measure.ladder."""

    def __init__(self, send: trio.abc.SendStream, replies: Receive, clk, offset_s: float = 0.0) -> None:
        self.send, self.replies, self.clk, self.offset_s = send, replies, clk, offset_s
        self._reader = FrameReader()
        self._frames: collections.deque[Frame] = collections.deque()

    async def message(self, payload: bytes) -> float:
        """One message alone: its one-way time (s)."""
        return (await self.train(payload, 1, 0.0, 0.0))[0]

    async def train(self, payload: bytes, count: int, gap_s: float, expected_s: float) -> list[float]:
        """`count` messages `gap_s` apart: their one-way times (s)."""
        stamps = []
        next_at = self.clk.now()
        for _ in range(count):
            await self.clk.sleep_until(next_at)
            stamps.append(self.clk.now())
            await self.send.send_all(FRAME.pack(ONE_WAY, len(payload)) + payload)
            next_at = stamps[-1] + gap_s
        times = []
        for sent in stamps:
            frame = await self._reply(STAMPED, expected_s + REPLY_GRACE_S)
            times.append(STAMP.unpack(frame.body)[0] - self.offset_s - sent)
        return times

    async def ping(self, size: int) -> float:
        """A message of `size` bytes and its reply: the round trip (s), on this end's clock."""
        sent = self.clk.now()
        await self.send.send_all(FRAME.pack(PING, size) + bytes(size))
        return (await self._reply(PONG, REPLY_GRACE_S)).stamp - sent

    async def _reply(self, kind: int, timeout_s: float) -> Frame:
        with trio.move_on_after(timeout_s):
            while not self._frames:
                data, stamp = await self.replies()
                if not data:
                    raise LinkBroken("the probe's peer closed the connection")
                self._frames.extend(self._reader.feed(data, stamp))
            frame = self._frames.popleft()
            if frame.kind != kind:
                raise LinkBroken(f"the probe's peer answered a frame of kind {frame.kind}, expected {kind}")
            return frame
        raise PeerTimeout(f"the probe's peer did not answer within {timeout_s:g} s")


async def ping_ladder(probe: PeerProbe, sizes: Sequence[int], samples: int, budget_s: float, dilation: float,
                      log: Callable[[str], None], rate_bytes_s: float = 0.0) -> list[PingRow]:
    """Every size's round trips within `budget_s`: one alone (it warms the path and prices the size), then up to
    `samples` one after another, MIN_GAP_S apart; a size one round trip of which would not fit its share of what
    is left (the last size's, and the bytes added twice at the link's one-way goodput `rate_bytes_s`, 0: none
    seen) is skipped, said so. Times divided by `dilation`."""
    rows: list[PingRow] = []
    start = probe.clk.now()
    last: tuple[int, float] | None = None  # (size, its round trip alone, s)
    for i, size in enumerate(sizes):
        share = (budget_s - (probe.clk.now() - start)) / (len(sizes) - i)
        guess = last[1] + (2 * (size - last[0]) / rate_bytes_s if rate_bytes_s else 0.0) if last else 0.0
        if guess > share:
            rows.append(PingRow(size, 0, skipped=f"a round trip would take ~{guess / dilation:.3g} s, over its share "
                                                 f"of the budget ({share / dilation:.3g} s)"))
            continue
        alone = await probe.ping(size)
        last = (size, alone)
        gap = MIN_GAP_S * dilation
        count = max(MIN_SAMPLES, min(samples, int((share - alone) // (alone + gap))))
        times = []
        for _ in range(count):
            await probe.clk.sleep_until(probe.clk.now() + gap)
            times.append(await probe.ping(size))
        ms = np.array(times) / dilation * 1e3
        rows.append(PingRow(size, count, float(np.median(ms)), float(np.percentile(ms, 99)), float(ms.min())))
        log(f"      {size_text(size):>7}: {count} ping-pongs, round trip p50 {rows[-1].rtt_ms_p50:.3f} ms")
    return rows


# --- the clocks' offsets ------------------------------------------------------------------------------------------
def offset_hull(estimates: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(offset, bound) from (offset, bound) estimates taken before and after a link: the true offset lay inside
    each estimate's interval when it was taken and, drifting one way between them, inside their hull throughout;
    the hull's midpoint and half-width."""
    low = min(o - b for o, b in estimates)
    high = max(o + b for o, b in estimates)
    return (low + high) / 2, (high - low) / 2


def shifted(rows: Sequence[SizeRow], delta_ms: float) -> list[SizeRow]:
    """A link's sizes with every one-way time moved by `delta_ms` (an offset corrected after the link was measured:
    its time less the offset's change), NetPIPE's throughput recomputed from the moved median."""
    out = []
    for r in rows:
        if not r.samples:
            out.append(r)
            continue
        p50 = r.one_way_ms_p50 + delta_ms
        out.append(replace(r, one_way_ms_p50=p50, one_way_ms_p99=r.one_way_ms_p99 + delta_ms,
                           one_way_ms_min=r.one_way_ms_min + delta_ms,
                           mbit_s=r.size_bytes * 8 / (p50 / 1e3) / 1e6 if p50 > 0 else 0.0))
    return out


# --- several hosts' rows ------------------------------------------------------------------------------------------
def rows_text(rows: Sequence[LinkRow]) -> str:
    """One host's links as the JSON it leaves in the rendezvous store."""
    return json.dumps([r.to_dict() for r in rows])


def assemble(texts: dict[int, str], n_hosts: int) -> list[LinkRow]:
    """Every host's links (rows_text by its stage) as one list, host by host in stage order; a host missing, or a
    link measured twice, is an error naming it."""
    missing = [s for s in range(n_hosts) if s not in texts]
    if missing:
        raise LinkBroken(f"no links from host {', '.join(map(str, missing))} in the rendezvous store")
    rows = [LinkRow.from_dict(item) for s in range(n_hosts) for item in json.loads(texts[s])]
    seen = collections.Counter(r.link for r in rows)
    twice = [name for name, count in seen.items() if count > 1]
    if twice:
        raise LinkBroken(f"link {twice[0]} was measured by two hosts")
    return rows
