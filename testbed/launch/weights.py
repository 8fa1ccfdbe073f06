"""A ring's weights as real bytes over the emulated links: an origin serves a checkpoint's files, every node fetches
the files it needs through its own link, and the time to a ready ring is measured.

    origin (node N) --- link N -> i: delay, rate (the files) ---> node i  (python -m agents.weights.fetch)
                    <-- link i -> N: delay (its requests, ACKs) --

The origin is `python -m agents.weights.origin` (HTTP, Range requests) where node N lives, each fetcher
`python -m agents.weights.fetch` where node i lives (a network namespace on netem: Shaper.agent_command_prefix).
The fetchers start together (their --go) and say when they began and ended on the box's monotonic clock, which
every namespace shares. Real bytes need real sockets: the relay or netem; the virtual backend's figures are the
weights study's simulation.

`predict_node_s` is the closed form of one node's fetch, protocol round trips included (testbed.core.tcp for the
bytes under each transport).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import trio

from testbed.core import tcp
from testbed.core.channel import LineReader
from testbed.core.errors import ConfigError, ShapingError
from testbed.core.process import stop_process
from testbed.core.records import LOSS_RTO_MS, LinkSpec, mbit_to_bytes_s

START_TIMEOUT_S = 120.0  # a process importing trio, starlette and hypercorn inside user-mode-linux: tens of seconds
STOP_GRACE_S = 2.0
HTTP_HEADER_BYTES = 300  # a request's or a response's headers, about
FIRST_RECEIVE_WINDOW = 65_535  # Linux's first advertised window of a new connection (netem.base.Shaper.warm_windows)
SOCKET_BUFFER_BYTES = 256 * 2**20  # netem.plan's tuned buffers


@dataclass(frozen=True)
class Route:
    """The origin's path to one node: one-way delay, and the rate the node receives at (its downlink)."""

    delay_ms: float
    rate_mbit: float = 0.0


@dataclass
class NodeFetch:
    node: int
    began: float
    ended: float
    fetched_bytes: int
    reports: list[dict] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.ended - self.began


@dataclass
class Distribution:
    backend: str
    transport: str
    nodes: list[NodeFetch]

    @property
    def ready_s(self) -> float:
        """From the first node's start to the last node's last verified byte: the ring can load."""
        return max(n.ended for n in self.nodes) - min(n.began for n in self.nodes)


def route_links(routes: list[Route]) -> list[LinkSpec]:
    """Node i's two links with the origin (node len(routes)): the files' way and the requests' way."""
    origin = len(routes)
    links = [LinkSpec(origin, i, r.delay_ms, rate_mbit=r.rate_mbit, seed=i) for i, r in enumerate(routes)]
    return links + [LinkSpec(i, origin, r.delay_ms, seed=origin + i) for i, r in enumerate(routes)]


def predict_node_s(route: Route, sizes: list[int], streams: int, transport: str, kernel_tcp: bool,
                   manifest_bytes: int, chunk_bytes: int) -> float:
    """One node's fetch, from its first request to its last verified byte.

    The manifest: a connection (one round trip where the handshake crosses the link, `kernel_tcp`: netem, whose
    connections are the kernel's own; the relay's are local), a request and its answer. Then file after file: its
    chunks in at most `streams` ranges at once, each on its own connection (the new ones: one more handshake), a
    request, and the ranges' bytes sharing the link:

    - "kernel": each range a cold TCP flow; P alike cold flows side by side are one flow with P times the initial
      window and the cap (cold_transfer_s);
    - "tuned" on the kernel's own TCP: the congestion window is open, but a new connection's receive window starts at
      64 KiB (Linux caps the first one there, whatever initrwnd says: netem.base) and doubles each round trip;
    - "tuned" on the relay: the link's rate from the first byte.
    """
    rtt = 2 * route.delay_ms / 1e3
    rate = mbit_to_bytes_s(route.rate_mbit)
    if transport == "kernel":
        params = tcp.TcpParams(rtt, rate)
    else:
        params = tcp.TcpParams(rtt, rate, initial_window=FIRST_RECEIVE_WINDOW, window_cap=SOCKET_BUFFER_BYTES)
    total = (rtt if kernel_tcp else 0.0) + rtt + manifest_bytes / rate
    opened = 1
    for size in sizes:
        ranges = max(1, min(streams, math.ceil(size / chunk_bytes)))
        fresh = ranges > opened
        total += (rtt if kernel_tcp and fresh else 0.0) + rtt / 2
        opened = max(opened, ranges)
        body = size + ranges * HTTP_HEADER_BYTES
        if transport == "kernel" or (kernel_tcp and fresh):  # `ranges` alike flows side by side: one, windows x P
            together = dataclasses.replace(params, initial_window=ranges * params.initial_window,
                                           window_cap=ranges * params.window_cap)
            total += tcp.cold_transfer_s(body, together, rtt / 2)
        else:
            total += body / rate + rtt / 2
    return total


async def _start(stack: contextlib.AsyncExitStack, argv: list[str]) -> tuple[trio.Process, LineReader]:
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    stack.push_async_callback(stop_process, process, STOP_GRACE_S)
    return process, LineReader(process.stdout)


async def _line(lines: LineReader, timeout_s: float, what: str) -> dict:
    with trio.move_on_after(timeout_s):
        answer = await lines.receive_json()
        if answer is None:
            raise ShapingError(f"{what} exited without answering")
        if "error" in answer:
            raise ShapingError(f"{what}: {answer['error']}")
        return answer
    raise ShapingError(f"{what} did not answer within {timeout_s:g} s")


async def distribute(routes: list[Route], files: list[list[str]], origin_root: Path, dest_root: Path, *,
                     shaper_kind: str = "userspace", transport: str = "tuned", streams: int = 8,
                     dilation: float = 1.0, timeout_s: float = 600.0,
                     log: Callable[[str], None] = lambda line: None) -> Distribution:
    """Every node i fetches files[i] from an origin serving origin_root, over route i, into dest_root/node<i>.

    `dilation` D runs every delay (and the minimum RTO) D times longer and every rate D times slower, and reports
    the times divided by D (testbed.launch.dilation's remedy: the box's own cost per byte, the relay's and the
    fetchers' in Python, shrinks D-fold against the link's); a transfer's rounds and windows are unchanged by it."""
    from netem.base import ShaperOptions
    from netem.select import choose_shaper
    from testbed.launch.launcher import new_run_id

    if not dilation >= 1:
        raise ConfigError(f"expected a dilation >= 1, got {dilation!r}", key="dilation")
    origin = len(routes)
    box = [Route(r.delay_ms * dilation, r.rate_mbit / dilation) for r in routes]
    shaper = choose_shaper(shaper_kind, route_links(box), origin + 1, new_run_id(),
                           options=ShaperOptions(loss_rto_ms=LOSS_RTO_MS * dilation, transport=transport))
    if shaper.in_process:
        raise ConfigError("real bytes cross real sockets: use the relay or netem (the weights study simulates the "
                          "virtual backend's)", key="--shaper")
    log(f"shaper: {shaper.reason}")
    python = [sys.executable, "-m"]
    async with shaper, contextlib.AsyncExitStack() as stack:
        _, said = await _start(stack, [*shaper.agent_command_prefix(origin), *python, "agents.weights.origin",
                                       str(origin_root), "--host", shaper.agent_listen_host(origin)])
        port = (await _line(said, START_TIMEOUT_S, "the origin"))["port"]
        listen = {i: ("127.0.0.1", 9) for i in range(origin)} | {origin: (shaper.agent_listen_host(origin), port)}
        peers = await shaper.connect(listen)  # nodes listen on nothing: the links towards them carry answers only
        fetchers = []
        for i, names in enumerate(files):
            host, node_port = peers[(i, origin)]
            fetchers.append(await _start(stack, [
                *shaper.agent_command_prefix(i), *python, "agents.weights.fetch", f"http://{host}:{node_port}",
                str(dest_root / f"node{i}"), "--names", ",".join(names), "--streams", str(streams), "--go"]))
        for i, (_, lines) in enumerate(fetchers):
            await _line(lines, START_TIMEOUT_S, f"node {i}'s fetcher")
        for process, _ in fetchers:
            await process.stdin.send_all(b"go\n")
        nodes = []
        for i, (_, lines) in enumerate(fetchers):
            done = await _line(lines, timeout_s, f"node {i}'s fetch")
            nodes.append(NodeFetch(i, done["began"] / dilation, done["ended"] / dilation,
                                   sum(r["fetched_bytes"] for r in done["reports"]), done["reports"]))
            log(f"node {i}: {nodes[-1].fetched_bytes:,} bytes in {nodes[-1].seconds:.3f} s")
    return Distribution(shaper.name, transport, nodes)
