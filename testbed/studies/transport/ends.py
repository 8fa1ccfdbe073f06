"""The transport study's two ends: a sender that writes S / n bytes on each of n fresh connections at once
(`write_all`), a receiver that reads every connection to its end and stamps its last byte (`read_all`), and the
records the peer processes exchange with the study, one JSON line each (testbed.studies.transport.peer)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from testbed.core.records import JsonRecord

BLOCK_BYTES = 2 ** 20  # a socket's bytes are written from a block of this size
Receive = Callable[[], Awaitable[tuple[bytes, float]]]  # the next bytes and when they came (b"": the end)


@dataclass(frozen=True)
class Listening(JsonRecord):
    port: int


@dataclass(frozen=True)
class ReceiveRequest(JsonRecord):
    connections: int


@dataclass(frozen=True)
class Received(JsonRecord):
    received_bytes: int
    last_byte_s: float  # the box's monotonic clock


@dataclass(frozen=True)
class SendRequest(JsonRecord):
    host: str
    port: int
    connections: int
    bytes_each: int


@dataclass(frozen=True)
class Sent(JsonRecord):
    start_s: float  # the box's monotonic clock, just before the first write


async def write_all(streams: Sequence[trio.abc.Stream], bytes_each: int, now: Callable[[], float]) -> float:
    """Write `bytes_each` on every stream at once (one write each), end each; returns when the writes began. On the
    memory network the writes go in the streams' order (each is one put at the same simulated instant), so the
    connections book the link in one order, run after run: tasks would be scheduled in an order Trio draws."""
    start = now()
    if streams and not isinstance(streams[0], trio.abc.HalfCloseableStream):
        for stream in streams:
            await _write(stream, bytes_each)
        return start
    async with trio.open_nursery() as nursery:
        for stream in streams:
            nursery.start_soon(_write, stream, bytes_each)
    return start


async def _write(stream: trio.abc.Stream, n_bytes: int) -> None:
    if not isinstance(stream, trio.abc.HalfCloseableStream):  # the memory network: one put, the link cuts it
        await stream.send_all(bytes(n_bytes))
        await stream.aclose()
        return
    # a socket: from one block (a guest of user-mode-linux maps each page of a large buffer apart, and runs out of
    # mappings at 256 MiB), then wait for the receiver's close, then close
    block = memoryview(bytes(min(n_bytes, BLOCK_BYTES)))
    left = n_bytes
    while left:
        take = min(left, len(block))
        await stream.send_all(block[:take])
        left -= take
    await stream.send_eof()
    while await stream.receive_some():
        pass
    await stream.aclose()


async def read_all(receives: Sequence[Receive]) -> tuple[int, float]:
    """Read every connection to its end: (the bytes, when the last of them came)."""
    total, last = 0, -math.inf

    async def drain(receive: Receive) -> None:
        nonlocal total, last
        while True:
            data, stamp = await receive()
            if not data:
                return
            total += len(data)
            last = max(last, stamp)

    async with trio.open_nursery() as nursery:
        for receive in receives:
            nursery.start_soon(drain, receive)
    return total, last
