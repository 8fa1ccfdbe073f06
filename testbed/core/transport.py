"""How an agent opens and reads its links: TCP on the box, or in-memory streams on simulated time (the seam).

An agent never knows how it is shaped; it only listens, dials the addresses the shaper handed it, and reads
frames. Every backend but one gives it `TCP`; the virtual backend (netem.virtual) gives every agent of a run one
`MemoryNetwork`, where an address is ("virtual", port) and a connection a pair of `MemoryStream`s.

    transport = MemoryNetwork()
    listener, port = await transport.listen("virtual")    # a trio.abc.Listener: trio.serve_listeners serves it
    stream = await transport.connect(("virtual", port))   # a trio.abc.Stream, its peer accepted by the listener
"""

from __future__ import annotations

import abc
import errno
from dataclasses import dataclass
import math
import os
import socket
from typing import Awaitable, Callable

import trio

from testbed.core import clock as clock_module
from testbed.core.records import Address

VIRTUAL_HOST = "virtual"  # the host part of every address on a MemoryNetwork


@dataclass(frozen=True)
class Inbound:
    """One upstream connection: `receive(max_bytes)` its bytes, `observe(arrival)` after each frame that came at
    the lap's period, `close()` at the end (agents.process.ring reads frames from it)."""

    receive: Callable[[int], Awaitable[bytes]]
    observe: Callable[[float], None] = lambda arrival: None
    close: Callable[[], None] = lambda: None


class Transport(abc.ABC):
    """Listeners, connections and readers for one agent (TCP) or for every agent of a run (memory)."""

    # every agent of the run in this one process: a process's figures (its memory) are the run's, not an agent's
    one_process = False

    @abc.abstractmethod
    async def listen(self, host: str) -> tuple[trio.abc.Listener, int]:
        """A listener on `host` at a port of the transport's choosing, and that port."""

    @abc.abstractmethod
    async def connect(self, address: Address) -> trio.abc.Stream:
        """A stream to `address`; OSError when nothing listens there (the caller retries)."""

    def inbound(self, stream: trio.abc.ReceiveStream) -> Inbound:
        """How to read `stream`."""
        return Inbound(stream.receive_some)


class TcpTransport(Transport):
    """Real sockets: TCP_NODELAY, and a reader that polls around the predicted arrival (clock.ArrivalPredictor)."""

    async def listen(self, host: str) -> tuple[trio.abc.Listener, int]:
        listeners = await trio.open_tcp_listeners(0, host=host)
        for extra in listeners[1:]:
            await extra.aclose()
        return listeners[0], listeners[0].socket.getsockname()[1]

    async def connect(self, address: Address) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(*address)
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames must not wait for Nagle
        return stream

    def inbound(self, stream: trio.abc.ReceiveStream) -> Inbound:
        # Frames come at the lap's regular period, so the reader polls around the predicted arrival rather than
        # sleeping through it (a process woken from a sleep pays 0.5-1 ms here: testbed.core.clock).
        assert isinstance(stream, trio.SocketStream)
        raw = socket.socket(fileno=os.dup(stream.socket.fileno()))
        raw.setblocking(False)
        predictor = clock_module.ArrivalPredictor()

        async def receive(max_bytes: int) -> bytes:
            return await clock_module.receive_polling(stream, raw.recv, predictor, max_bytes)

        return Inbound(receive, predictor.observe, raw.close)


TCP = TcpTransport()


class Pipe:
    """One direction of an in-memory connection: bytes put in without waiting, taken out by one reader. A `sink`
    (a shaper's link: netem.virtual) takes the bytes as they are put instead, b"" at the end."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.ended = False  # the writer closed: the reader gets what is left, then b""
        self.broken = False  # the reader closed: the writer's next put fails
        self.sink: Callable[[bytes], None] | None = None
        self._lot = trio.lowlevel.ParkingLot()

    def put(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            raise trio.BrokenResourceError("the peer closed the connection")
        if self.sink is not None:
            self.sink(bytes(data))
        else:
            self.buffer += data
            self._lot.unpark_all()

    def end(self) -> None:
        self.ended = True
        if self.sink is not None:
            self.sink(b"")
        self._lot.unpark_all()

    def divert(self, sink: Callable[[bytes], None]) -> None:
        """Send what was put so far, and everything put from now on, to `sink`."""
        self.sink = sink
        if self.buffer:
            sink(bytes(self.buffer))
            self.buffer.clear()
        if self.ended:
            sink(b"")

    def close_reader(self) -> None:
        self.broken = True
        self._lot.unpark_all()

    async def get(self, max_bytes: int | None) -> bytes:
        if not self.buffer and not self.ended and not self.broken:
            await self._lot.park()
        else:
            await trio.lowlevel.checkpoint()
        if self.broken:
            raise trio.ClosedResourceError("this end of the connection is closed")
        n = max_bytes or len(self.buffer)
        if n >= len(self.buffer):  # all of it: a new buffer (a bytearray keeps the size it grew to)
            data, self.buffer = bytes(self.buffer), bytearray()
            return data
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data


class MemoryStream(trio.abc.Stream):
    """One end of an in-memory connection (MemoryNetwork.connect): a send is a put and one checkpoint, a receive
    one wake-up (trio.testing's memory streams take several scheduling rounds for each)."""

    def __init__(self, incoming: Pipe, outgoing: Pipe) -> None:
        self.incoming, self.outgoing = incoming, outgoing
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this end of the connection is closed")
        self.outgoing.put(data)
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("this end of the connection is closed")
        return await self.incoming.get(max_bytes)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.outgoing.end()
            self.incoming.close_reader()
        await trio.lowlevel.checkpoint()


def memory_connection() -> tuple[MemoryStream, MemoryStream]:
    """The two ends of a new in-memory connection."""
    there, back = Pipe(), Pipe()
    return MemoryStream(back, there), MemoryStream(there, back)


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """One listening port of a MemoryNetwork: connections wait in a channel until accepted (a fake of a real
    Listener, passed to trio.serve_listeners as is)."""

    def __init__(self, network: "MemoryNetwork", port: int) -> None:
        self._network, self.port = network, port
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](math.inf)

    def offer(self, stream: trio.abc.Stream) -> None:
        self._send.send_nowait(stream)

    async def accept(self) -> trio.abc.Stream:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError) as exc:
            raise trio.ClosedResourceError("listener closed") from exc

    async def aclose(self) -> None:
        self._network.ports.pop(self.port, None)
        await self._send.aclose()
        await self._receive.aclose()
        await trio.lowlevel.checkpoint()


class MemoryNetwork(Transport):
    """Every listener and connection of one virtual run, in memory: nothing in between but what the shaper puts."""

    one_process = True

    def __init__(self) -> None:
        self.ports: dict[int, MemoryListener] = {}
        self._next_port = 1

    async def listen(self, host: str = VIRTUAL_HOST) -> tuple[trio.abc.Listener, int]:
        port, self._next_port = self._next_port, self._next_port + 1
        listener = self.ports[port] = MemoryListener(self, port)
        await trio.lowlevel.checkpoint()
        return listener, port

    async def connect(self, address: Address) -> trio.abc.Stream:
        host, port = address
        await trio.lowlevel.checkpoint()
        if host != VIRTUAL_HOST or (listener := self.ports.get(int(port))) is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"nothing listens at {host}:{port} on the virtual network")
        ours, theirs = memory_connection()
        listener.offer(theirs)
        return ours
