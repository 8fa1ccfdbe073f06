"""The probe between separate hosts, one per stage of a scenario, started by torchrun as testbed.hosts.node is:

    torchrun --nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29400 \\
        -m testbed.hosts.probe geo-ring [--stage I] [--shape none|relay|egress] [--iface IFACE] --out links.toml

Every host serves a probe end (testbed.studies.probe.remote.serve_peer: each message answered with its arrival
stamp, each ping with a pong) and a clock server (testbed.hosts.clocksync), and publishes both in the store. Then
the hosts take turns, stage by stage, so no two links are measured at once: each measures its links out, NetPIPE-
style as the one-box probe does (the ladder of sizes one-way, then the ping-pong), each link between two estimates
of the offset from this host's clock to the far one's (min-RTT, before and after the link), and leaves its rows in
the store. A one-way time is the far end's stamp less the offset less the send, and carries the offset's bound
(remote.offset_hull); a round trip is read on one clock and carries none. The entry (stage 0) gathers every host's
rows, prints the tables and writes --out, the file `testbed search` reads.

Which links: on the real network (--shape none) every host to every other, the whole matrix; shaped (relay or
egress, the scenario's links emulated between the hosts), the scenario's links, what is configured.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import trio

from netem.base import ShaperOptions
from netem.hostnet import KINDS, node_shaper
from netem.userspace import kernel_arrival_receiver
from testbed import api
from testbed.core.errors import ConfigError, LinkBroken, TestbedError, leaf_errors
from testbed.core.records import LinkSpec
from testbed.hosts.clocksync import ClockProbe, serve_clock
from testbed.hosts.node import claim_stage, node_address, until_sigterm
from testbed.hosts.node_launcher import digest
from testbed.hosts.rendezvous import NodeInfo, NodeStore, torchrun_store
from testbed.launch.launcher import STARTUP_TIMEOUT_S
from testbed.scenario.config import Scenario
from testbed.studies.probe import links as link_table
from testbed.studies.probe import remote, tables
from testbed.studies.probe.ladder import DEFAULT_PING_SIZES, DEFAULT_SIZES, parse_ping_sizes, parse_sizes
from testbed.studies.probe.measure import BOX_CLOCK, SAMPLES, agent_names, checked_samples, ladder, link_figures, \
    link_row
from testbed.studies.probe.result import LinkRow

BUDGET_S = 240.0
TURN_SLACK_S = 60.0  # beyond the budget, how long a host waits for the hosts before it (then it names them)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchrun ... -m testbed.hosts.probe", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="built-in name or a TOML file (the same on every host)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--stage", type=int, help="this host's stage (default: the torchrun rank)")
    parser.add_argument("--shape", choices=KINDS, default="none",
                        help="none (default): the real network, every host to every other; relay or egress: the "
                             "scenario's links emulated between the hosts, and measured")
    parser.add_argument("--iface", help="the interface to the other hosts (its address is published)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, metavar="LADDER", help=f"as probe's (default {DEFAULT_SIZES})")
    parser.add_argument("--ping-sizes", default=DEFAULT_PING_SIZES, metavar="LADDER",
                        help=f"round trips at these sizes, or none (default {DEFAULT_PING_SIZES})")
    parser.add_argument("--samples", type=int, default=SAMPLES, metavar="N", help=f"as probe's (default {SAMPLES})")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, metavar="S",
                        help=f"every host's links together, an even share a link (default {BUDGET_S:g})")
    parser.add_argument("--out", metavar="TOML", help="(entry) write the region matrix and link table here")
    parser.add_argument("--json", help="(entry) write the result here")
    return parser


def pairs(scenario: Scenario, shaped: bool) -> list[tuple[int, int]]:
    """The links the hosts measure, host by host: shaped, the scenario's; on the real network, every ordered pair."""
    if shaped:
        return sorted((link.src, link.dst) for link in scenario.links)
    n = scenario.n_agents
    return [(a, b) for a in range(n) for b in range(n) if a != b]


def configured(scenario: Scenario, src: int, dst: int) -> LinkSpec:
    """The scenario's link src -> dst, else the reverse one's figures (what a symmetric network would show)."""
    links = {(link.src, link.dst): link for link in scenario.links}
    if (src, dst) in links:
        return links[(src, dst)]
    back = links.get((dst, src))
    return LinkSpec(src, dst, back.delay_ms if back else 0.0, rate_mbit=back.rate_mbit if back else 0.0)


class HostProbe:
    """One host's part: its servers, its turn, its links, and (the entry) everyone's rows."""

    def __init__(self, args: argparse.Namespace, scenario: Scenario, store: NodeStore, stage: int, rank: int,
                 address: str, log) -> None:
        self.args, self.scenario, self.store, self.stage, self.rank = args, scenario, store, stage, rank
        self.address, self.log = address, log
        self.sizes, self.ping_sizes = parse_sizes(args.sizes), parse_ping_sizes(args.ping_sizes)
        self.samples = checked_samples(args.samples)
        self.shaped = args.shape != "none"
        self.all_pairs = pairs(scenario, self.shaped)
        self.mine = [(a, b) for a, b in self.all_pairs if a == stage]
        self.nodes: dict[int, NodeInfo] = {}

    @property
    def share_s(self) -> float:
        return self.args.budget_s / len(self.all_pairs)

    async def run(self, shaper) -> list[LinkRow] | None:
        everyone = list(range(self.scenario.n_agents))
        async with shaper, trio.open_nursery() as nursery:
            probe_port = await self._serve(nursery, serve_probe)
            clock_port = await self._serve(nursery, serve_clock)
            me = NodeInfo(self.stage, self.rank, socket.gethostname(), self.address, probe_port, clock_port,
                          digest(self.scenario))
            await self.store.set(f"node/{self.stage}", me.to_json())
            await self.store.wait_for([f"node/{s}" for s in everyone], STARTUP_TIMEOUT_S, "hosts")
            for s in everyone:
                self.nodes[s] = NodeInfo.from_json(await self.store.get(f"node/{s}"))
                if self.nodes[s].digest != me.digest:
                    raise ConfigError(f"host {s} ({self.nodes[s].address}) probes another scenario: give every host "
                                      "the same scenario and --set options", key="SCENARIO")
            peers = await shaper.connect({s: (info.address, info.agent_port) for s, info in self.nodes.items()})
            wait_s = self.args.budget_s + TURN_SLACK_S
            if self.stage > 0:  # one host at a time: no two links share the network while measured
                await self.store.wait_for([f"probed/{self.stage - 1}"], wait_s, "the hosts before this one")
            rows = [await self.link(src, dst, peers) for src, dst in self.mine]
            await self.store.set(f"links/{self.stage}", remote.rows_text(rows))
            await self.store.set(f"probed/{self.stage}", "1")
            if self.stage != 0:
                await self.store.wait_for(["done"], wait_s, "the entry")  # the later hosts probe this one
                nursery.cancel_scope.cancel()
                return None
            await self.store.wait_for([f"links/{s}" for s in everyone], wait_s, "every host's links")
            texts = {s: await self.store.get(f"links/{s}") for s in everyone}
            await self.store.set("done", "1")
            nursery.cancel_scope.cancel()
        return remote.assemble(texts, len(everyone))

    async def _serve(self, nursery: trio.Nursery, handler) -> int:
        listeners = await trio.open_tcp_listeners(0, host=self.address)
        await nursery.start(trio.serve_listeners, handler, listeners)
        return listeners[0].socket.getsockname()[1]

    async def link(self, src: int, dst: int, peers: dict) -> LinkRow:
        """One link out: the offset before, the one-way ladder, the ping-pong, the offset after."""
        far, names = self.nodes[dst], agent_names(self.scenario)
        spec = configured(self.scenario, src, dst)
        self.log(f"probing {src}->{dst} ({names[src]} -> {names[dst]}, {far.address}): configured "
                 f"{spec.delay_ms:g} ms" + ("" if self.shaped else " (the scenario's; the real network is measured)"))
        clock = ClockProbe((far.address, far.clock_port))
        before = await clock.measure()
        stream = await trio.open_tcp_stream(*peers.get((src, dst), (far.address, far.agent_port)))
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one_way_s = self.share_s * len(self.sizes) / (len(self.sizes) + len(self.ping_sizes))
        try:
            probe = remote.PeerProbe(stream, kernel_arrival_receiver(stream), BOX_CLOCK, before.offset_s)
            sizes = await ladder(probe, self.sizes, self.samples, one_way_s, 1.0, self.log)
            pings = await remote.ping_ladder(probe, self.ping_sizes, self.samples, self.share_s - one_way_s, 1.0,
                                             self.log, link_figures(sizes)[3] * 1e6 / 8)
            after = await clock.measure()
        finally:
            await trio.aclose_forcefully(stream)
            await clock.aclose()
        offset, bound = remote.offset_hull([(before.offset_s, before.bound_s), (after.offset_s, after.bound_s)])
        self.log(f"  clock offset to host {dst}: {offset * 1e3:+.3f} ms +- {bound * 1e3:.3f} ms")
        back = configured(self.scenario, dst, src).delay_ms if not self.shaped else \
            next((link.delay_ms for link in self.scenario.links if (link.src, link.dst) == (dst, src)), 0.0)
        return link_row(spec.name, names[src], names[dst], spec, remote.shifted(sizes, (before.offset_s - offset) * 1e3),
                        bound_ms=bound * 1e3, pings=tuple(pings), configured_rtt_ms=spec.delay_ms + back)


async def serve_probe(stream: trio.SocketStream) -> None:
    """The far end of another host's link: remote.serve_peer on the connection, its arrivals the kernel's stamps."""
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    async with stream:
        try:
            await remote.serve_peer(kernel_arrival_receiver(stream), stream.send_all)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, LinkBroken):
            return  # the prober went away: its own side says why


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    args = build_parser().parse_args(argv)
    stage, store = args.stage, None
    try:
        scenario = api.scenario(args.scenario, overrides=args.overrides)
        if not scenario.links:
            raise ConfigError("the scenario has no links to probe (one stage)", key="SCENARIO")
        raw, rank, world = torchrun_store()
        stage = claim_stage(scenario, raw, rank if args.stage is None else args.stage, world)
        store = NodeStore(raw)
        address = node_address(args.iface, os.environ["MASTER_ADDR"])
        out_links = [link for link in scenario.links if link.src == stage] if args.shape != "none" else []
        shaper = node_shaper(args.shape, out_links, scenario.n_agents, f"probe{stage}", iface=args.iface,
                             options=ShaperOptions(loss_rto_ms=scenario.loss_rto_ms, transport=scenario.transport))
        host = HostProbe(args, scenario, store, stage, rank, address, lambda m: console.print(m, markup=False))
        console.print(f"probe host {stage}, rank {rank} of {world}, {address}; shaper {shaper.name}: {shaper.reason}")
        started = time.perf_counter()
        rows = trio.run(until_sigterm, lambda: host.run(shaper))
        if rows is None:
            console.print(f"probe host {stage}: done")
            return 0
        result = link_table.result_of(str(args.scenario), f"hosts ({shaper.name})", 1.0, host.sizes, host.samples,
                                      time.perf_counter() - started, rows)
        if args.out:
            link_table.write(result, args.out, f"torchrun ... -m testbed.hosts.probe {args.scenario} --shape "
                                               f"{args.shape}")
        tables.show(result, args, console)
        return 0
    except BaseException as exc:  # noqa: BLE001 - sorted into our own errors below, anything else re-raised
        return failed(exc, stage, store, console)


def failed(exc: BaseException, stage: int | None, store: NodeStore | None, console) -> int:
    """Say why this host stopped (and tell the others, where the store is there); the exit status."""
    leaves = leaf_errors(exc)
    who = f"probe host {stage}" if stage is not None else "probe host"
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        console.print(f"{who}: stopped (Ctrl-C or SIGTERM)", markup=False, highlight=False)
        return 130
    if not leaves or not all(isinstance(e, TestbedError) for e in leaves):
        raise exc
    message = f"{who}: " + "; ".join(str(e) for e in leaves)
    if store is not None:
        trio.run(store.fail, message)
    console.print(f"error: {message}", markup=False, highlight=False)
    return 2 if all(isinstance(e, ConfigError) for e in leaves) else 1


if __name__ == "__main__":
    sys.exit(main())
