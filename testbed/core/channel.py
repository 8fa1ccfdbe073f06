"""JSON lines over a byte stream: the one framing every control channel of the testbed uses."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

RECEIVE_CHUNK = 65536
MAX_LINE_BYTES = 16 * 1024 * 1024  # a control line is small; this bounds a misbehaving peer


def encode_line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


class LineReader:
    """Complete lines from a byte stream; a closed or broken stream reads as EOF (None)."""

    def __init__(self, stream: trio.abc.ReceiveStream, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.stream = stream
        self.max_line_bytes = max_line_bytes
        self._buffer = b""
        self._lines: list[bytes] = []

    async def receive_line(self) -> bytes | None:
        """The next line without its newline, or None at EOF."""
        while not self._lines:
            try:
                chunk = await self.stream.receive_some(RECEIVE_CHUNK)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                chunk = b""
            if not chunk:
                return None
            *lines, self._buffer = (self._buffer + chunk).split(b"\n")
            self._lines.extend(lines)
            if len(self._buffer) > self.max_line_bytes:
                raise ValueError(f"control line longer than {self.max_line_bytes} bytes")
        return self._lines.pop(0)

    async def receive_json(self) -> Any | None:
        """The next non-blank line parsed as JSON, or None at EOF (callers put this under a deadline)."""
        while (line := await self.receive_line()) is not None:
            if line.strip():
                return json.loads(line)
        return None

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        line = await self.receive_line()
        if line is None:
            raise StopAsyncIteration
        return line


async def read_lines(stream: trio.abc.ReceiveStream, on_line: Callable[[str], None]) -> None:
    """Call on_line with every line of `stream` (decoded, undecodable bytes replaced) until EOF."""
    async for line in LineReader(stream):
        on_line(line.decode("utf-8", "replace"))
