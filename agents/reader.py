"""Whole frames off a byte stream (agents.wire's format): what an agent's inbound connection reads with."""

from __future__ import annotations

import time
from typing import Awaitable, Callable

import trio

from agents.wire import HEADER, PAD_PIECE, Frame, WireConfig, _Header, decode_body, decode_header
from testbed.core.errors import LinkBroken, WireError

RECEIVE_CHUNK = 64 * 1024  # below malloc's mmap threshold: no mmap/munmap per receive
COMPACT_BYTES = 1 << 20  # a reader drops the bytes it has read once they are this many (or all that it holds)


class FrameReader:
    """Reads whole frames from a Trio byte stream, with a bounded buffer.

    The buffer is read from an offset and compacted once it is drained (or past COMPACT_BYTES): taking each frame
    of a burst off its front would move the rest of the burst every time (a 256-frame burst, O(n^2) bytes)."""

    def __init__(self, stream: trio.abc.ReceiveStream,
                 receive: Callable[[int], Awaitable[bytes]] | None = None,
                 now: Callable[[], float] = time.monotonic, codec: WireConfig | None = None) -> None:
        self._stream = stream
        self._codec = codec  # the run's [wire]: its emulated geometry bounds the padding a frame may carry
        self._receive = receive or stream.receive_some
        self._now = now  # the clock frames are stamped on (the agent's: the box's, or simulated time)
        self._buffer = bytearray()
        self._at = 0  # where the unread bytes start

    def _unread(self) -> int:
        return len(self._buffer) - self._at

    def _take(self, n: int) -> bytes:
        """The next n buffered bytes, consumed."""
        data = bytes(self._buffer[self._at:self._at + n])
        self._at += n
        if self._at == len(self._buffer) or self._at > COMPACT_BYTES:
            del self._buffer[:self._at]
            self._at = 0
        return data

    async def _chunk(self, max_bytes: int) -> bytes:
        try:
            return await self._receive(max_bytes)
        except (trio.BrokenResourceError, OSError) as exc:
            raise LinkBroken(f"connection failed while reading a frame: {exc}") from exc

    async def _fill(self, size: int) -> bool:
        while self._unread() < size:
            chunk = await self._chunk(max(RECEIVE_CHUNK, min(size - self._unread(), PAD_PIECE)))
            if not chunk:
                if self._unread():
                    raise LinkBroken(f"connection closed mid-frame ({self._unread()} of {size} bytes)")
                return False
            self._buffer += chunk
        return True

    def _header(self) -> _Header:
        return decode_header(memoryview(self._buffer)[self._at:self._at + HEADER.size], self._codec)

    def read_buffered(self) -> tuple[Frame, float] | None:
        """The next frame if all of it is already buffered (no I/O), else None: drains a burst in one go."""
        if self._unread() < HEADER.size:
            return None
        header = self._header()
        if self._unread() < HEADER.size + header.body_len:
            return None
        self._at += HEADER.size
        return decode_body(header, self._take(header.body_len)), self._now()

    async def read(self) -> tuple[Frame, float] | None:
        """The next frame and the monotonic time it was complete, or None at a clean end of stream."""
        if not await self._fill(HEADER.size):
            return None
        header = self._header()
        body_len = header.body_len - header.pad_len  # the padding is checked as it comes, never kept
        if not await self._fill(HEADER.size + body_len):
            raise LinkBroken("connection closed mid-frame")
        self._at += HEADER.size
        body = self._take(body_len)
        await self._skip_padding(header.pad_len)
        received_at = self._now()
        return decode_body(header, body), received_at

    async def _skip_padding(self, n: int) -> None:
        """Consume n bytes of an emulated geometry's padding, each checked to be zero, none kept."""
        while n:
            if self._unread():
                take = min(n, self._unread())
                if self._buffer.count(0, self._at, self._at + take) != take:
                    raise WireError("padding that is not all zero")
                self._take(take)
            else:
                chunk = await self._chunk(min(n, PAD_PIECE))
                if not chunk:
                    raise LinkBroken(f"connection closed in a frame's padding ({n} bytes to come)")
                take = min(n, len(chunk))
                if chunk.count(0, 0, take) != take:
                    raise WireError("padding that is not all zero")
                self._buffer += chunk[take:]
            n -= take
