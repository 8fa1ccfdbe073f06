"""How the transport study makes a point's transfer on a backend: one link 0 -> 1 between two stages, set up by
netem.select.choose_shaper with ShaperOptions(transport="kernel"), and the study's two ends on it.

    rows = await measure_link("netem", points, log)   # the points share one link: [(point, bytes, seconds)]

- virtual: both ends are tasks in this process on the backend's memory network, on Trio's clock (the caller runs
  this under testbed.core.virtual_time: simulated time, exact);
- a real backend (the relay, netem): the receiver and the sender are processes where stage 1 and stage 0 live
  (`python -m testbed.studies.transport.peer`, under Shaper.agent_command_prefix), kept for all of a link's points.
  Where the stages are namespaces the kernel's cached TCP metrics are flushed before each transfer: Linux keeps a
  closed connection's ssthresh per destination, and a fresh connection would start from it, not cold.

On a lossy link in namespaces, the sender's devices get gso_max_segs 1 (`per_segment_loss`). Linux's TCP builds
its segments into GSO packets of up to 64 KiB whatever the device offers, and splits them only after the qdisc, so
netem's loss would drop a whole GSO packet a draw (2-17 segments at 100 Mbit/s: the size follows the pacing rate),
a few times fewer loss events than the link's rate says (inside user-mode-linux: 40 drops where 180 were due,
each costing a recovery of ~8 segments). With one segment a packet, netem drops segments at the link's rate, as a
router on a real path does and as the model draws them.

Every transfer opens fresh connections (their handshakes before the clock starts) and times the first write to
the last byte's arrival.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from collections.abc import Callable, Sequence

import trio

from testbed.core.channel import LineReader, encode_line
from testbed.core.errors import PeerTimeout, ShapingError
from testbed.core.process import stop_process
from testbed.core.records import Address
from testbed.studies.transport.grid import Point, estimate_s
from testbed.studies.transport.ends import (Listening, Received, ReceiveRequest, Sent, SendRequest, read_all,
                                            write_all)

PEER = "testbed.studies.transport.peer"
SENDER, RECEIVER = 0, 1  # the stages at the link's two ends
START_TIMEOUT_S = 60.0  # a peer process's start (Python's own, slow inside user-mode-linux)
GRACE_S = 30.0  # a transfer later than three times its prediction by this much: the link is broken
STOP_GRACE_S = 2.0


def deadline_s(point: Point) -> float:
    return 3 * estimate_s(point) + GRACE_S


class VirtualEnds:
    """Both ends in this process, on the virtual backend's memory network and Trio's clock."""

    def __init__(self, shaper) -> None:
        self.shaper = shaper

    async def start(self, stack: contextlib.AsyncExitStack) -> Address:
        host = self.shaper.agent_listen_host(RECEIVER)
        self.listener, port = await self.shaper.transport.listen(host)
        stack.push_async_callback(self.listener.aclose)
        return host, port

    async def transfer(self, address: Address, point: Point) -> tuple[int, float]:
        network = self.shaper.transport
        senders = [await network.connect(address) for _ in range(point.connections)]
        accepted = [await self.listener.accept() for _ in range(point.connections)]
        got: list[tuple[int, float]] = []

        def receiver(stream: trio.abc.ReceiveStream):
            async def receive() -> tuple[bytes, float]:
                return await stream.receive_some(), trio.current_time()
            return receive

        async def read() -> None:
            got.append(await read_all([receiver(stream) for stream in accepted]))

        with trio.fail_after(deadline_s(point)):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                start = await write_all(senders, point.size_bytes // point.connections, trio.current_time)
        for stream in accepted:
            await stream.aclose()
        return got[0][0], got[0][1] - start


class ProcessEnds:
    """Each end a peer process where its stage lives, one JSON line a transfer (testbed.studies.transport.peer)."""

    def __init__(self, shaper) -> None:
        self.shaper = shaper

    async def _open(self, stack: contextlib.AsyncExitStack, stage: int, *words: str) -> tuple[trio.Process,
                                                                                               LineReader]:
        process = await trio.lowlevel.open_process(
            [*self.shaper.agent_command_prefix(stage), sys.executable, "-m", PEER, *words],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        stack.push_async_callback(stop_process, process, STOP_GRACE_S)
        return process, LineReader(process.stdout)

    async def start(self, stack: contextlib.AsyncExitStack) -> Address:
        self.receiver, self.received = await self._open(stack, RECEIVER, "receive",
                                                        self.shaper.agent_listen_host(RECEIVER))
        self.sender, self.sent = await self._open(stack, SENDER, "send")
        listening = Listening(**await _answer(self.received, START_TIMEOUT_S, "the receiver's start"))
        return "127.0.0.1", listening.port

    async def transfer(self, address: Address, point: Point) -> tuple[int, float]:
        await self._flush_metrics()
        await self.receiver.stdin.send_all(encode_line(ReceiveRequest(point.connections).to_dict()))
        request = SendRequest(address[0], address[1], point.connections, point.size_bytes // point.connections)
        await self.sender.stdin.send_all(encode_line(request.to_dict()))
        sent = Sent(**await _answer(self.sent, deadline_s(point), "the sender's transfer"))
        received = Received(**await _answer(self.received, GRACE_S, "the receiver's last byte"))
        return received.received_bytes, received.last_byte_s - sent.start_s

    async def _flush_metrics(self) -> None:
        for stage in (SENDER, RECEIVER):
            if self.shaper.agent_netns(stage) is not None:
                await trio.run_process([*self.shaper.agent_command_prefix(stage), "ip", "tcp_metrics", "flush", "all"],
                                       check=False, capture_stdout=True, capture_stderr=True)


async def per_segment_loss(shaper, stage: int) -> None:
    """One segment a GSO packet on every device of `stage`'s namespace (see the module doc)."""
    prefix = shaper.agent_command_prefix(stage)
    shown = await trio.run_process([*prefix, "ip", "-o", "link", "show"], capture_stdout=True, check=False)
    for line in shown.stdout.decode().splitlines():
        name = line.split(": ")[1].split("@")[0] if line.count(": ") >= 2 else ""
        if name and name != "lo":
            done = await trio.run_process([*prefix, "ip", "link", "set", "dev", name, "gso_max_segs", "1"],
                                          check=False, capture_stdout=True, capture_stderr=True)
            if done.returncode:
                raise ShapingError(f"could not set gso_max_segs 1 on {name}: {done.stderr.decode().strip()}")


async def _answer(lines: LineReader, timeout_s: float, what: str) -> dict:
    with trio.move_on_after(timeout_s):
        answer = await lines.receive_json()
        if answer is None:
            raise ShapingError(f"the transport study's peer exited before {what}")
        return answer
    raise PeerTimeout(f"{what} did not come within {timeout_s:g} s")


async def measure_link(kind: str, points: Sequence[Point], log: Callable[[str], None]
                       ) -> tuple[str, list[tuple[Point, int, float]]]:
    """(the backend's name, each point's received bytes and seconds): every point over one link set up on `kind`."""
    from netem.base import ShaperOptions
    from netem.select import choose_shaper
    from testbed.launch.launcher import new_run_id

    link = points[0].link
    if any(p.link != link for p in points):
        raise ValueError("measure_link's points share one link")
    shaper = choose_shaper(kind, [link], 2, new_run_id(), options=ShaperOptions(transport="kernel"))
    rows = []
    async with shaper, contextlib.AsyncExitStack() as stack:
        if link.loss_pct and shaper.agent_netns(SENDER) is not None:
            await per_segment_loss(shaper, SENDER)
        ends = VirtualEnds(shaper) if shaper.in_process else ProcessEnds(shaper)
        listening = await ends.start(stack)
        address = (await shaper.connect({RECEIVER: listening}))[(SENDER, RECEIVER)]
        for point in points:
            received, seconds = await ends.transfer(address, point)
            if received != point.size_bytes // point.connections * point.connections:
                raise ShapingError(f"{received} bytes of {point.size_bytes} arrived")
            log(f"    {point.size_bytes / 2**20:g} MiB on {point.connections}: {seconds:.4f} s "
                f"(estimated {estimate_s(point):.4f} s)" if math.isfinite(seconds) else "    no bytes")
            rows.append((point, received, seconds))
    return shaper.name, rows
