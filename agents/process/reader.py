"""Whole frames off a byte stream (agents.process.wire's format): what an agent's inbound connection reads with."""

from __future__ import annotations

import time
from typing import Awaitable, Callable

import trio

from agents.process.wire import HEADER, PAD_PIECE, Frame, WireConfig, _Header, decode_body, decode_header
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
        self._arrived = 0.0  # when the buffer's newest bytes came: a frame is complete when its last bytes are in

    async def _chunk(self, max_bytes: int) -> bytes:
        """The next bytes, and the time they came taken at once: the parsing and copying that follow are the
        receiver's work on a complete frame, not the hop's."""
        try:
            chunk = await self._receive(max_bytes)
        except (trio.BrokenResourceError, OSError) as exc:
            raise LinkBroken(f"connection failed while reading a frame: {exc}") from exc
        self._arrived = self._now()
        return chunk

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
        frame = self._decode(header, total)
        self._consume(total)
        return frame, self._arrived

    def _decode(self, header: _Header, end: int) -> Frame:
        """The frame whose body is the buffer's bytes HEADER.size..end, decoded in place (decode_body copies what
        it keeps: the stamps and the tensor), so the body is not copied out first."""
        view = memoryview(self._buffer)
        frame = decode_body(header, view[HEADER.size:end])
        view.release()  # (a malformed frame closes the connection: its buffer is never resized again)
        return frame

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
        frame = self._decode(header, end)
        self._consume(end)
        if header.pad_len:
            await self._skip_padding(header.pad_len)
        return frame, self._arrived

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
