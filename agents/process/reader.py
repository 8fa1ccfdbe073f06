"""Whole frames off a byte stream (agents.process.wire's format): what an agent's inbound connection reads with."""

from __future__ import annotations

import time
from typing import Awaitable, Callable

import trio

from agents.process.wire import HEADER, PAD_PIECE, Frame, WireConfig, decode_body, decode_header
from testbed.core.errors import LinkBroken, WireError

RECEIVE_CHUNK = 64 * 1024  # below malloc's mmap threshold: no mmap/munmap per receive


class FrameReader:
    """Reads whole frames from a Trio byte stream, with a bounded buffer."""

    def __init__(self, stream: trio.abc.ReceiveStream,
                 receive: Callable[[int], Awaitable[bytes]] | None = None,
                 now: Callable[[], float] = time.monotonic, codec: WireConfig | None = None) -> None:
        self._stream = stream
        self._codec = codec  # the run's [wire]: its emulated geometry bounds the padding a frame may carry
        self._receive = receive or stream.receive_some
        self._now = now  # the clock frames are stamped on (the agent's: the box's, or simulated time)
        self._buffer = bytearray()

    async def _chunk(self, max_bytes: int) -> bytes:
        try:
            return await self._receive(max_bytes)
        except (trio.BrokenResourceError, OSError) as exc:
            raise LinkBroken(f"connection failed while reading a frame: {exc}") from exc

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            chunk = await self._chunk(max(RECEIVE_CHUNK, min(size - len(self._buffer), PAD_PIECE)))
            if not chunk:
                if self._buffer:
                    raise LinkBroken(f"connection closed mid-frame ({len(self._buffer)} of {size} bytes)")
                return False
            self._buffer += chunk
        return True

    def read_buffered(self) -> tuple[Frame, float] | None:
        """The next frame if all of it is already buffered (no I/O), else None: drains a burst in one go."""
        if len(self._buffer) < HEADER.size:
            return None
        header = decode_header(self._buffer, self._codec)
        total = HEADER.size + header.body_len
        if len(self._buffer) < total:
            return None
        body = bytes(self._buffer[HEADER.size:total])
        self._consume(total)
        return decode_body(header, body), self._now()

    def _consume(self, n: int) -> None:
        """Drop the buffer's first n bytes; an emptied buffer is a new one (a bytearray keeps what it grew to: a
        20 MB batch of prompts, on each of a ring's 128 connections, would stay)."""
        if n >= len(self._buffer):
            self._buffer = bytearray()
        else:
            del self._buffer[:n]

    async def read(self) -> tuple[Frame, float] | None:
        """The next frame and the monotonic time it was complete, or None at a clean end of stream."""
        if not await self._fill(HEADER.size):
            return None
        header = decode_header(self._buffer, self._codec)
        end = HEADER.size + header.body_len - header.pad_len  # the padding is checked as it comes, never kept
        if not await self._fill(end):
            raise LinkBroken("connection closed mid-frame")
        body = bytes(self._buffer[HEADER.size:end])  # a copy: the buffer is resized below
        self._consume(end)
        await self._skip_padding(header.pad_len)
        received_at = self._now()
        return decode_body(header, body), received_at

    async def _skip_padding(self, n: int) -> None:
        """Consume n bytes of an emulated geometry's padding, each checked to be zero, none kept."""
        while n:
            if self._buffer:
                take = min(n, len(self._buffer))
                if self._buffer.count(0, 0, take) != take:
                    raise WireError("padding that is not all zero")
                del self._buffer[:take]
            else:
                chunk = await self._chunk(min(n, PAD_PIECE))
                if not chunk:
                    raise LinkBroken(f"connection closed in a frame's padding ({n} bytes to come)")
                take = min(n, len(chunk))
                if chunk.count(0, 0, take) != take:
                    raise WireError("padding that is not all zero")
                self._buffer += chunk[take:]
            n -= take
