"""python -m testbed probe SCENARIO: every link of a scenario measured NetPIPE-style, one-way, on the box's one clock.

The scenario's links are set up on a shaper (the relay, kernel netem, or virtual time) exactly as a run sets them
up, but the agents are replaced by a sender and a receiver per link in this process: the sender stamps each message
just before it writes it, the receiver stamps the moment its last byte came (the kernel's arrival stamp on a
socket, so this process's own wake-up is not counted), and one clock reads both. For each size of the ladder:

- one message alone first (it warms the connection, as a run's first frame does, and shows how long a message of
  this size takes to serialize: its time less the latency found so far);
- then up to --samples messages, each sent when the one before has left the link's serializer (GAP_FACTOR x that
  time apart, at least MIN_GAP_S), so none queues behind another while many are in flight on a long link.

A link's figures come from the medians: its goodput is the slope between the smallest and the largest size, and its
latency the median one-way time of the smallest size less that size's serialization (the zero-byte intercept), with
its p99 and minimum the same way. Links are measured one after another, each within an even share of --budget-s;
a size whose one message would not fit its share of what is left is skipped, said so.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import trio

from testbed.core import clock
from testbed.core.errors import ConfigError, PeerTimeout
from testbed.scenario.config import Scenario
from testbed.studies.base import log_to, make_scenario
from testbed.studies.probe import links as link_table
from testbed.studies.probe import remote
from testbed.studies.probe.ladder import parse_ping_sizes, parse_sizes, size_text
from testbed.studies.probe.result import LinkRow, PingRow, ProbeResult, SizeRow
from testbed.studies.probe.tables import command_words, overrides

SAMPLES = 100  # messages a size (after the first): the p99 of the smallest size is their 99th
MIN_SAMPLES = 3  # a size's messages at least (a median), even where the budget would allow fewer
# Messages of a size leave at least this far apart: the relay spins on its clock for 1.5 ms + 2% of the delay before
# each release (testbed.core.clock.sleep_until), and messages closer than this would keep it spinning, and the
# box's other work (and so the relay's own wake-ups) waiting.
MIN_GAP_S = 0.02
GAP_FACTOR = 1.5  # ... and this many times their serialization apart, so none waits behind another
NO_RATE_S = 1e-9  # a largest size no slower than the smallest by this much: the link shows no rate
CONNECT_TIMEOUT_S = 20.0
ARRIVAL_GRACE_S = 30.0  # a message later than its link's slowest plausible time by this much: the link is broken


# --- the two ends of a link -------------------------------------------------------------------------------------
Receive = Callable[[], Awaitable[tuple[bytes, float]]]  # the next bytes and when they came


@dataclass(frozen=True)
class Clock:
    """Where the probe reads time and waits: the box's monotonic clock, or Trio's (virtual time)."""

    now: Callable[[], float]
    sleep_until: Callable[[float], Awaitable[None]]


async def _sleep_until_box(deadline: float) -> None:
    """Trio's sleep to a time of the box's clock, without spinning: a message is stamped when it leaves, so the
    sender needs no precision, and a spinning sender would take the CPU the relay releases messages with."""
    await trio.sleep(max(0.0, deadline - clock.now()))


BOX_CLOCK = Clock(clock.now, _sleep_until_box)
TRIO_CLOCK = Clock(trio.current_time, trio.sleep_until)


class Ends:
    """How the probe listens where an agent would and dials what the shaper hands it, per backend: TCP on the box
    (the relay), a socket opened inside each agent's namespace (netem), or the virtual backend's memory network."""

    def __init__(self, shaper) -> None:
        self.shaper = shaper

    async def listen(self, agent: int) -> tuple[trio.abc.Listener, int]:
        if self.shaper.in_process:
            return await self.shaper.transport.listen(self.shaper.agent_listen_host(agent))
        sock = self._socket(agent)
        sock.bind((self.shaper.agent_listen_host(agent), 0))
        sock.listen()
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock)), sock.getsockname()[1]

    async def connect(self, agent: int, address: tuple[str, int]) -> trio.abc.Stream:
        if self.shaper.in_process:
            return await self.shaper.transport.connect(address)
        sock = trio.socket.from_stdlib_socket(self._socket(agent))
        try:
            await sock.connect(address)
        except BaseException:
            sock.close()
            raise
        stream = trio.SocketStream(sock)
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return stream

    def receiver(self, stream: trio.abc.ReceiveStream) -> Receive:
        if self.shaper.in_process:
            async def receive() -> tuple[bytes, float]:
                return await stream.receive_some(), trio.current_time()
            return receive
        from netem.userspace import kernel_arrival_receiver

        return kernel_arrival_receiver(stream)

    def _socket(self, agent: int) -> socket.socket:
        """A TCP socket in agent's network namespace (a socket keeps the namespace it was made in)."""
        netns = self.shaper.agent_netns(agent)
        if netns is None:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        from netem.nsutil import in_namespace

        return in_namespace(os.path.basename(netns), lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))


class Arrivals:
    """The receiving end of one link: the sizes it expects, in order, and when each one's last byte came."""

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.expected: collections.deque[int] = collections.deque()
        self.stamps: list[float] = []
        self._lot = trio.lowlevel.ParkingLot()

    async def run(self) -> None:
        pending = 0
        while True:
            data, stamp = await self.receive()
            if not data:
                return
            left = len(data)
            while left:
                if pending == 0:
                    pending = self.expected.popleft()
                taken = min(left, pending)
                pending, left = pending - taken, left - taken
                if pending == 0:
                    self.stamps.append(stamp)
                    self._lot.unpark_all()

    async def wait_for(self, count: int) -> None:
        while len(self.stamps) < count:
            await self._lot.park()


# --- one link -------------------------------------------------------------------------------------------------
@dataclass
class LinkProbe:
    """Sends the ladder down one link and keeps each message's one-way time."""

    send: trio.abc.SendStream
    arrivals: Arrivals
    clk: Clock
    sent: int = 0

    async def message(self, payload: bytes) -> float:
        """One message alone: its one-way time (s)."""
        stamp = await self._send(payload)
        await self._arrived(self.sent, ARRIVAL_GRACE_S)
        return self.arrivals.stamps[self.sent - 1] - stamp

    async def train(self, payload: bytes, count: int, gap_s: float, expected_s: float) -> list[float]:
        """`count` messages `gap_s` apart: their one-way times (s)."""
        stamps, first = [], self.sent
        next_at = self.clk.now()
        for _ in range(count):
            await self.clk.sleep_until(next_at)
            stamps.append(await self._send(payload))
            next_at = stamps[-1] + gap_s
        await self._arrived(self.sent, expected_s + ARRIVAL_GRACE_S)
        return [arrival - stamp for arrival, stamp in zip(self.arrivals.stamps[first:self.sent], stamps)]

    async def _send(self, payload: bytes) -> float:
        self.arrivals.expected.append(len(payload))
        stamp = self.clk.now()
        await self.send.send_all(payload)
        self.sent += 1
        return stamp

    async def _arrived(self, count: int, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            await self.arrivals.wait_for(count)
            return
        raise PeerTimeout(f"the probe's message {count} did not arrive within {timeout_s:g} s")


async def ladder(probe: LinkProbe, sizes: Sequence[int], samples: int, budget_s: float, dilation: float,
                 log: Callable[[str], None]) -> list[SizeRow]:
    """Every size of the ladder on one link, within `budget_s` (see the module doc); times divided by `dilation`."""
    rows: list[SizeRow] = []
    start = probe.clk.now()
    base_s = math.inf  # the smallest one-way time of the first size: what a message costs besides serializing
    last: tuple[int, float] | None = None  # (size, its serialization, s) of the last size measured
    for i, size in enumerate(sizes):
        share = (budget_s - (probe.clk.now() - start)) / (len(sizes) - i)
        if last is not None:
            guess = base_s + last[1] * size / last[0]
            if guess > share:
                rows.append(SizeRow(size, 0, skipped=f"one message would take ~{guess / dilation:.3g} s, over its "
                                                     f"share of the budget ({share / dilation:.3g} s)"))
                continue
        payload = bytes(size)
        alone = await probe.message(payload)
        serialization = max(0.0, alone - base_s) if last is not None else 0.0
        gap = max(MIN_GAP_S * dilation, GAP_FACTOR * serialization)
        count = max(MIN_SAMPLES, min(samples, int((share - alone) // gap)))
        times = np.array(await probe.train(payload, count, gap, alone + count * gap)) / dilation
        if last is None:
            base_s = float(times.min()) * dilation
        last = (size, max(serialization, 0.0) or 1e-12)
        p50 = float(np.median(times))
        rows.append(SizeRow(size, count, p50 * 1e3, float(np.percentile(times, 99)) * 1e3, float(times.min()) * 1e3,
                            size * 8 / p50 / 1e6 if p50 > 0 else 0.0))
        log(f"      {size_text(size):>7}: {count} messages, one-way p50 {p50 * 1e3:.3f} ms, "
            f"p99 {rows[-1].one_way_ms_p99:.3f} ms")
    return rows


def link_figures(rows: Sequence[SizeRow]) -> tuple[float, float, float, float]:
    """(latency p50, p99, min in ms; goodput in Mbit/s, 0 where no rate showed) from a link's sizes."""
    measured = [r for r in rows if r.samples]
    small, large = measured[0], measured[-1]
    grew_s = (large.one_way_ms_p50 - small.one_way_ms_p50) / 1e3
    if large.size_bytes == small.size_bytes or grew_s <= NO_RATE_S:
        return small.one_way_ms_p50, small.one_way_ms_p99, small.one_way_ms_min, 0.0
    rate_bytes_s = (large.size_bytes - small.size_bytes) / grew_s
    serialization_ms = small.size_bytes / rate_bytes_s * 1e3
    return (small.one_way_ms_p50 - serialization_ms, small.one_way_ms_p99 - serialization_ms,
            small.one_way_ms_min - serialization_ms, rate_bytes_s * 8 / 1e6)


# --- the scenario -------------------------------------------------------------------------------------------
def agent_names(scenario: Scenario) -> list[str]:
    """Each agent's place: its stage's region, else the stage's name (geo-ring's stages are named for cities)."""
    names = [st.region or st.name for st in scenario.stages]
    return names + [f"agent{i}" for i in range(len(names), scenario.n_agents)]


async def probe_scenario(scenario: Scenario, shaper_kind: str, sizes: Sequence[int], samples: int, budget_s: float,
                         dilation: float, log: Callable[[str], None], ping_sizes: Sequence[int] = ()
                         ) -> tuple[str, list[LinkRow]]:
    """Set the scenario's links up on `shaper_kind` (dilated by `dilation`) and probe each, one-way and, at
    `ping_sizes`, round trips: (backend, its rows)."""
    from netem.base import ShaperOptions
    from netem.select import choose_shaper
    from testbed.launch.launcher import new_run_id

    physical = scenario.dilated(dilation)
    shaper = choose_shaper(shaper_kind, list(physical.links), scenario.n_agents, new_run_id(),
                           options=ShaperOptions(loss_rto_ms=physical.loss_rto_ms))
    log(f"shaper: {shaper.reason}")
    names = agent_names(scenario)
    rows: list[LinkRow] = []
    clk = TRIO_CLOCK if shaper.in_process else BOX_CLOCK
    share = budget_s * dilation / len(physical.links)  # each link's, split between its one-way and round trips
    one_way_share = share * len(sizes) / (len(sizes) + len(ping_sizes))
    delays = {(link.src, link.dst): link.delay_ms for link in scenario.links}
    async with shaper, contextlib.AsyncExitStack() as stack:
        ends = Ends(shaper)
        listeners = {}
        for agent in range(scenario.n_agents):  # every agent: a ping-pong's reply may come back to any
            listeners[agent] = await ends.listen(agent)
            stack.push_async_callback(listeners[agent][0].aclose)
        peers = await shaper.connect({agent: (shaper.agent_listen_host(agent), port)
                                      for agent, (_, port) in listeners.items()})

        async def dial(src: int, dst: int) -> tuple[trio.abc.Stream, trio.abc.Stream]:
            """src's connection to dst, through the link where the scenario has one, else direct; both its ends."""
            address = peers.get((src, dst), (shaper.agent_listen_host(dst), listeners[dst][1]))
            pair = await open_pair(ends, listeners[dst][0], src, address)
            for stream in pair:
                stack.push_async_callback(trio.aclose_forcefully, stream)
            return pair

        for configured, link in zip(scenario.links, physical.links):
            log(f"probing {link.name} ({names[link.src]} -> {names[link.dst]}): configured {configured.delay_ms:g} ms"
                + (f", {configured.rate_mbit:g} Mbit/s" if configured.rate_mbit else ", unlimited rate"))
            send, accepted = await dial(link.src, link.dst)
            arrivals = Arrivals(ends.receiver(accepted))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(arrivals.run)
                sizes_rows = await ladder(LinkProbe(send, arrivals, clk), sizes, samples, one_way_share, dilation, log)
                nursery.cancel_scope.cancel()
            pings: list[PingRow] = []
            if ping_sizes:  # a second connection on the link, its replies back on dst's own connection to src
                send, far = await dial(link.src, link.dst)
                back, near = await dial(link.dst, link.src)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(remote.serve_peer, ends.receiver(far), back.send_all)
                    pings = await remote.ping_ladder(remote.PeerProbe(send, ends.receiver(near), clk), ping_sizes,
                                                     samples, share - one_way_share, dilation, log,
                                                     link_figures(sizes_rows)[3] * 1e6 / 8 * dilation)
                    nursery.cancel_scope.cancel()
            rows.append(link_row(link.name, names[link.src], names[link.dst], configured, sizes_rows, pings=pings,
                                 configured_rtt_ms=configured.delay_ms + delays.get((link.dst, link.src), 0.0)))
    return shaper.name, rows


async def open_pair(ends: Ends, listener: trio.abc.Listener, src: int, address) -> tuple[trio.abc.Stream, ...]:
    """(src's end, the listener's end) of a fresh connection to `address`."""
    with trio.fail_after(CONNECT_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            accepted: list[trio.abc.Stream] = []

            async def accept() -> None:
                accepted.append(await listener.accept())

            nursery.start_soon(accept)
            send = await ends.connect(src, address)
    return send, accepted[0]


def link_row(name: str, src: str, dst: str, configured, sizes_rows: Sequence[SizeRow], **extra) -> LinkRow:
    """A link's row from its sizes (link_figures) beside what `configured` (a LinkSpec) says."""
    latency, p99, low, goodput = link_figures(sizes_rows)
    return LinkRow(name, src, dst, configured.delay_ms, configured.rate_mbit, latency, p99, low, goodput,
                   next(r.samples for r in sizes_rows if r.samples), tuple(sizes_rows), **extra)


def checked_samples(samples) -> int:
    if not isinstance(samples, int) or isinstance(samples, bool) or not MIN_SAMPLES <= samples <= 100_000:
        raise ConfigError(f"expected a whole number of messages from {MIN_SAMPLES} to 100000, got {samples!r}",
                          key="--samples")
    return samples


def run(args: argparse.Namespace, console) -> ProbeResult:
    sizes, ping_sizes = parse_sizes(args.sizes), parse_ping_sizes(args.ping_sizes)
    samples = checked_samples(args.samples)
    if args.dilation == "auto":
        raise ConfigError("the probe measures at a stated D (default 1: the links as they are); auto has no lap to "
                          "calibrate", key="--dilation")
    dilation = float(args.dilation)
    try:
        scenario = make_scenario(args.scenario, overrides=overrides(args))
    except ConfigError as exc:
        if exc.source is None and exc.key is None:  # no such scenario: say which argument named it
            raise ConfigError(str(exc), key="SCENARIO") from exc
        raise
    if not scenario.links:
        raise ConfigError("the scenario has no links to probe (one stage)", key="SCENARIO")
    log = log_to(console)
    if scenario.schedule:
        log("the scenario's [[network.schedule]] is not applied: the probe measures the links as they start")
    is_virtual = args.shaper == "virtual"
    started = time.perf_counter()

    async def main() -> tuple[str, list[LinkRow], float]:
        now = trio.current_time if is_virtual else clock.now
        begun = now()
        backend, rows = await probe_scenario(scenario, args.shaper, sizes, samples, args.budget_s, dilation, log,
                                             ping_sizes)
        return backend, rows, (now() - begun) / dilation

    if is_virtual:
        from testbed.core import virtual_time

        backend, rows, seconds = virtual_time.run_sync(main)
    else:
        backend, rows, seconds = trio.run(main)
    result = link_table.result_of(str(args.scenario), backend, dilation, sizes, samples,
                                  seconds if is_virtual else time.perf_counter() - started, rows)
    if args.out:
        link_table.write(result, args.out, " ".join(["python -m testbed probe", *command_words(args)]))
    return result
