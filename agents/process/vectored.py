"""A frame's pieces written without joining them: one sendmsg (a vectored write) on a socket, so a frame's header,
stamps and payload leave in one system call and the payload is never copied into a joined buffer."""

from __future__ import annotations

from typing import Sequence

import trio

from testbed.core.errors import LinkBroken


async def write_pieces(stream: trio.abc.SendStream, pieces: Sequence[bytes | memoryview],
                       zeros: Sequence[memoryview] = ()) -> None:
    """Send `pieces`, then `zeros` (an emulated geometry's padding, shared read-only pieces), in order on `stream`:
    all in one vectored write on a socket (partial writes resume where they stopped), so a padded frame is one
    chunk to the relay; elsewhere (an in-memory stream, simulated time) the joined pieces, then each of the zeros
    (never joined: a 64 MiB prompt's padding is not built)."""
    if not isinstance(stream, trio.SocketStream):
        await stream.send_all(b"".join(pieces))
        for piece in zeros:
            await stream.send_all(piece)
        return
    if id(stream) in _WRITING:  # as send_all would: two writers would interleave their frames' bytes
        raise trio.BusyResourceError("another task is writing to this stream")
    views = [memoryview(p) for p in (*pieces, *zeros) if len(p)]
    _WRITING.add(id(stream))
    try:
        while views:
            sent = await stream.socket.sendmsg(views)
            while views and sent >= len(views[0]):
                sent -= len(views.pop(0))
            if sent:
                views[0] = views[0][sent:]
    except OSError as exc:
        raise LinkBroken(f"the connection failed while sending: {exc}") from exc
    finally:
        _WRITING.discard(id(stream))


_WRITING: set[int] = set()  # the streams a write_pieces is under way on (id)
