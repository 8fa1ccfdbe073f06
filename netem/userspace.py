"""Userspace shaping backend: a Trio relay per directed link (delay, jitter, rate, loss), no root needed.

Each directed link src -> dst is a TCP listener on 127.0.0.1 in a separate relay process; src dials
it and the relay dials dst. Bytes flowing src -> dst are shaped; the reverse direction (unused by the
ring protocol) passes straight through.

Timing of a chunk of n bytes arriving at time t (all stamped at arrival)::

    start     = max(t, next_free)                   serialization at W bytes/s, a next-free clock
    next_free = start + n / W                       (separate from propagation: many chunks in flight)
    deadline  = next_free + delay + jitter          jitter ~ Normal(0, jitter_ms), seeded, delay+jitter >= 0
    deadline += rto      with probability loss      loss on a reliable transport = a retransmission
                                                    timeout (TCP's minimum RTO, 200 ms by default)
    deadline  = max(deadline, previous deadline)    FIFO: a byte stream is never reordered

The relay sleeps until deadline - SPIN_MARGIN_S and spins on checkpoints to the deadline (Trio's
timers are up to ~1.3 ms late here), then forwards the chunk.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Awaitable, Callable

import trio

from netem.base import DEFAULT_LOSS_RTO_MS, Shaper, ShaperOptions
from netem.timing import LinkTiming
from testbed.core import tcp
from testbed.core.tcp import Bottleneck
from testbed.core import clock
from testbed.core.channel import LineReader, encode_line
from testbed.core.errors import ShapingError
from testbed.core.process import stop_process
from testbed.core.records import Address, LinkSpec

RELAY_CHUNK = 256 * 1024
QUEUE_CHUNKS = 1024  # chunks in flight per link before the relay stops reading (TCP backpressure)
CONNECT_TIMEOUT_S = 10.0
STARTUP_TIMEOUT_S = 20.0
STOP_GRACE_S = 1.0
DEFAULT_RTO_MS = DEFAULT_LOSS_RTO_MS
RELAY_MTU_BYTES = 1500  # only to put the serialization time of a rate in words (plan lines)


@dataclass(frozen=True)
class RelayClock:
    """Where the relay reads time and waits: the box's monotonic clock (real runs) or Trio's (MockClock tests)."""

    now: Callable[[], float]
    sleep_until: Callable[[float], Awaitable[None]]


MONOTONIC = RelayClock(clock.now, clock.sleep_until)
TRIO_CLOCK = RelayClock(trio.current_time, trio.sleep_until)


async def _close_direction(stream: trio.abc.SendStream) -> None:
    if isinstance(stream, trio.abc.HalfCloseableStream):
        try:
            await stream.send_eof()
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)


SO_TIMESTAMPNS = 35  # Linux: the kernel stamps each received skb (CLOCK_REALTIME); not in Python's socket module
TIMESPEC = struct.Struct("qq")


def kernel_arrival_receiver(stream: trio.SocketStream) -> Callable[[], Awaitable[tuple[bytes, float]]]:
    """Receive with the kernel's arrival stamp, so the relay's own wake-up after a long sleep (0.5-1 ms on
    these VMs) is not added to the link: the deadline counts from when the bytes reached the relay."""
    sock = stream.socket
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    ancillary = socket.CMSG_SPACE(TIMESPEC.size)
    # One buffer for every receive, each chunk copied out at its own size: a fresh RELAY_CHUNK-sized bytes a
    # receive is above malloc's mmap threshold (an mmap, page faults and an munmap for a 600-byte frame).
    buffer = memoryview(bytearray(RELAY_CHUNK))

    async def receive() -> tuple[bytes, float]:
        n, ancdata, _flags, _addr = await sock.recvmsg_into([buffer], ancillary)
        received = clock.now()
        data = bytes(buffer[:n])
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= TIMESPEC.size:
                seconds, nanoseconds = TIMESPEC.unpack_from(payload)
                realtime_offset = time.clock_gettime(time.CLOCK_REALTIME) - clock.now()
                return data, min(received, seconds + nanoseconds * 1e-9 - realtime_offset)
        return data, received

    return receive


async def _shaped_pump(src: trio.abc.ReceiveStream, dst: trio.abc.SendStream, timing: LinkTiming,
                       clk: RelayClock) -> None:
    send_channel, receive_channel = trio.open_memory_channel[tuple[float, bytes]](QUEUE_CHUNKS)
    if isinstance(src, trio.SocketStream) and clk is MONOTONIC:
        receive = kernel_arrival_receiver(src)
    else:
        async def receive() -> tuple[bytes, float]:
            return await src.receive_some(RELAY_CHUNK), clk.now()

    async def receiver() -> None:
        async with send_channel:
            while True:
                chunk, arrival = await receive()
                if not chunk:
                    return
                await send_channel.send((timing.deadline(arrival, len(chunk)), chunk))

    async def sender() -> None:
        async with receive_channel:
            async for deadline, chunk in receive_channel:
                await clk.sleep_until(deadline)
                await dst.send_all(chunk)
        await _close_direction(dst)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        nursery.start_soon(sender)


async def _plain_pump(src: trio.abc.ReceiveStream, dst: trio.abc.SendStream) -> None:
    while chunk := await src.receive_some(RELAY_CHUNK):
        await dst.send_all(chunk)
    await _close_direction(dst)


async def relay(upstream: trio.abc.Stream, downstream: trio.abc.Stream, timing: LinkTiming,
                clk: RelayClock = MONOTONIC, back: LinkTiming | None = None) -> None:
    """Shape upstream -> downstream with `timing`; pass downstream -> upstream through. Closes both at the end.

    A failure on either side (peer gone) closes both streams, so each peer sees the link break.
    """
    try:
        async with trio.open_nursery() as nursery:
            async def guarded(pump: Awaitable[None]) -> None:
                try:
                    await pump
                except* (trio.BrokenResourceError, trio.ClosedResourceError):
                    nursery.cancel_scope.cancel()

            nursery.start_soon(guarded, _shaped_pump(upstream, downstream, timing, clk))
            nursery.start_soon(guarded, _plain_pump(downstream, upstream) if back is None
                               else _shaped_pump(downstream, upstream, back, clk))
    finally:
        await trio.aclose_forcefully(upstream)
        await trio.aclose_forcefully(downstream)


def realized_propagation(timings: list[LinkTiming]) -> dict[str, tuple[float, int]]:
    """Per link: (the mean propagation delay its chunks drew, s, in the clock's time; how many chunks), over every
    connection the link carried: what the seeded jitter realized (Shaper.realized_propagation)."""
    sums: dict[str, list[float]] = {}
    for timing in timings:
        total = sums.setdefault(timing.link, [0.0, 0])
        total[0], total[1] = total[0] + timing.drawn[0], total[1] + timing.drawn[1]
    return {link: (total / count, int(count)) for link, (total, count) in sums.items() if count}


TIMINGS: list[LinkTiming] = []  # every link's timing in this relay process: the schedule's origin goes to each
ORIGIN: list[float | None] = [None]  # the schedule's origin once known (a connection made later starts with it)


async def serve_link(link: LinkSpec, target: Address, rto_ms: float, events: tuple[dict, ...] = (),
                     transport: str = "tuned", return_delay_ms: float = 0.0, *,
                     clocks: dict[str, Bottleneck] | None = None, reverse: LinkSpec | None = None,
                     task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on 127.0.0.1:0 for link.src; relay each connection to `target`. Reports the bound port.

    `clocks`: every link's next-free clock by name, shared by all the connections over it in either direction.
    `reverse`: the link dst -> src, if any: what the far end sends back on a connection (an HTTP answer: the weights'
    origin) is shaped by it, as netem shapes a packet by the link it leaves on, whoever dialed."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    clocks = {} if clocks is None else clocks
    link_clock = clocks.setdefault(link.name, Bottleneck())

    async def handle(upstream: trio.SocketStream) -> None:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                downstream = await trio.open_tcp_stream(*target)
        except (OSError, trio.TooSlowError) as exc:
            print(f"relay {link.name}: cannot reach {target}: {exc}", file=sys.stderr, flush=True)
            await trio.aclose_forcefully(upstream)
            return
        for stream in (upstream, downstream):
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames must not wait for Nagle
        timing = LinkTiming.from_spec(link, rto_ms, events, transport, return_delay_ms, link_clock)
        back = None if reverse is None else LinkTiming.from_spec(
            reverse, rto_ms, (), transport, link.delay_ms, clocks.setdefault(reverse.name, Bottleneck()))
        timing.origin = ORIGIN[0]
        TIMINGS.extend([timing] if back is None else [timing, back])
        try:
            await relay(upstream, downstream, timing, back=back)
        finally:
            for ended in (timing, back):
                if ended is not None:
                    ended.close()

    async with trio.open_nursery() as nursery:
        task_status.started(port)
        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)


async def relay_process_main() -> None:
    """Relay process: one JSON request on stdin, one JSON answer on stdout, then serve until stdin closes."""
    stdin = trio.lowlevel.FdStream(os.dup(0))
    lines = LineReader(stdin)
    with trio.fail_after(STARTUP_TIMEOUT_S):
        request = await lines.receive_json()
    if request is None:
        return
    rto_ms = float(request["rto_ms"])
    async with trio.open_nursery() as nursery:
        ports: dict[str, int] = {}
        clocks: dict[str, Bottleneck] = {}
        links = {(spec.src, spec.dst): spec for spec in (LinkSpec(**item["link"]) for item in request["links"])}
        for item in request["links"]:
            link = LinkSpec(**item["link"])
            start = partial(serve_link, clocks=clocks, reverse=links.get((link.dst, link.src)))
            ports[link.name] = await nursery.start(start, link, tuple(item["target"]), rto_ms,
                                                   tuple(item.get("events", ())), request.get("transport", "tuned"),
                                                   float(item.get("return_delay_ms", 0.0)))
        sys.stdout.buffer.write(encode_line({"ports": ports}))
        sys.stdout.flush()
        # {"origin": t}: the schedule starts (Shaper.start_schedule); {"realized": true}: the delays drawn so far,
        # answered on stdout; the launcher closes our stdin when the run ends.
        while (line := await lines.receive_json()) is not None:
            if line.get("realized"):
                sys.stdout.buffer.write(encode_line({"realized": realized_propagation(TIMINGS)}))
                sys.stdout.flush()
            if "origin" in line:
                ORIGIN[0] = float(line["origin"])
                for timing in TIMINGS:
                    timing.origin = ORIGIN[0]
        nursery.cancel_scope.cancel()


class UserspaceShaper(Shaper):
    """Shapes every directed link with a relay in one supervised child process.

    options.loss_rto_ms is what a lost chunk costs here (see the module docstring).
    """

    name = "userspace"

    def __init__(self, links: list[LinkSpec], n_stages: int, run_id: str,
                 options: ShaperOptions | None = None) -> None:
        super().__init__(links, n_stages, run_id, options)
        self.reason = self.reason or "userspace relay requested"
        self._process: trio.Process | None = None

    async def connect(self, listen: dict[int, Address]) -> dict[tuple[int, int], Address]:
        if not self.links:
            return {}
        request = {"rto_ms": self.options.loss_rto_ms, "transport": self.options.transport,
                   "links": [{"link": vars(link), "target": list(listen[link.dst]),
                              "return_delay_ms": self.return_delay_ms(link),
                              "events": [e.to_dict() for e in self.schedule if (e.src, e.dst) == (link.src, link.dst)]}
                             for link in self.links]}
        self._process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "netem.userspace"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            process_group=0)  # own process group: Ctrl-C reaches the launcher only, which stops us
        assert self._process.stdin is not None and self._process.stdout is not None
        await self._process.stdin.send_all(encode_line(request))
        try:
            with trio.fail_after(STARTUP_TIMEOUT_S):
                answer = await LineReader(self._process.stdout).receive_json()
                if answer is None:
                    raise ShapingError(f"relay process exited during setup (status {await self._process.wait()})")
        except trio.TooSlowError as exc:
            raise ShapingError(f"relay process did not start within {STARTUP_TIMEOUT_S} s") from exc
        ports = answer["ports"]
        return {(link.src, link.dst): ("127.0.0.1", ports[link.name]) for link in self.links}

    def plan_lines(self) -> list[str]:
        return [f"relay {link.name}: "
                f"{describe_timing(link, self.options.loss_rto_ms, self.options.transport, self.return_delay_ms(link))}"
                for link in sorted(self.links, key=lambda l: (l.src, l.dst))] + [
            f"schedule at {e.at_s:g} s: {e.describe()}" for e in self.schedule]

    async def realized_propagation(self) -> dict[str, tuple[float, int]]:
        if self._process is None or self._process.stdin is None or self._process.stdout is None:
            return {}
        with trio.move_on_after(STARTUP_TIMEOUT_S):
            try:
                await self._process.stdin.send_all(encode_line({"realized": True}))
                answer = await LineReader(self._process.stdout).receive_json()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return {}  # the relay is gone: its supervision reports why; nothing is known of its draws
            return {link: (float(mean), int(n)) for link, (mean, n) in (answer or {}).get("realized", {}).items()}
        return {}

    async def start_schedule(self, origin: float, nursery=None) -> None:
        if self.schedule and self._process is not None and self._process.stdin is not None:
            await self._process.stdin.send_all(encode_line({"origin": origin}))

    async def aclose(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with trio.CancelScope(shield=True):
            await stop_process(process, STOP_GRACE_S)


def describe_timing(link: LinkSpec, rto_ms: float, transport: str = "tuned", return_delay_ms: float = 0.0) -> str:
    """One link's relay timing in words: what `LinkTiming.from_spec(link, rto_ms, (), transport, return_delay_ms)`
    will do to each chunk."""
    parts = [f"stage {link.src} -> stage {link.dst} through 127.0.0.1", f"delay {link.delay_ms:g} ms"]
    if link.jitter_ms:
        parts.append(f"jitter Normal(0, {link.jitter_ms:g} ms) seed {link.seed}")
    if link.loss_pct:
        parts.append(f"loss {link.loss_pct:g}% (each lost chunk +{rto_ms:g} ms RTO)")
    if link.rate_mbit > 0:
        per_mtu_ms = RELAY_MTU_BYTES * 8 / (link.rate_mbit * 1e6) * 1e3
        parts.append(f"rate {link.rate_mbit:g} Mbit/s (serialization {per_mtu_ms:.4g} ms per {RELAY_MTU_BYTES} B)")
    else:
        parts.append("rate unlimited (no serialization)")
    if transport == "kernel":
        parts.append(f"TCP as the kernel's defaults leave it (testbed.core.tcp): a {tcp.INITIAL_WINDOW_SEGMENTS}-segment "
                     f"first window, slow start, a {tcp.KERNEL_WINDOW_CAP_BYTES / 2**20:g} MiB window cap, round trip "
                     f"{link.delay_ms + return_delay_ms:g} ms, slow start again after an idle RTO")
    return ", ".join(parts)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        trio.run(relay_process_main)
    except BrokenPipeError:
        pass
