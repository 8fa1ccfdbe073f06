"""One host of a several-host run, started by torchrun: it serves one stage and meets the others in the store.

    torchrun --nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29400 \\
        -m testbed.hosts.node geo-ring [--stage I] [--shape none|relay|egress] [--iface IFACE] [--json PATH]

torchrun forms the group (ranks, the c10d store, worker supervision); the testbed keeps its own Trio TCP data
plane. Node = stage = rank unless --stage pins a stage to this host. Each node starts its agent, publishes the
agent's address and a clock server's in the store (testbed.hosts.rendezvous), reads its peers', dials its links out
(shaped by netem.hostnet), and serves. The entry (stage 0) also runs the run's log, exporter, dashboard and
JSON summary, as `testbed run` does on one box, with every other node's lap stamps moved onto its own clock
(testbed.hosts.clocksync). Every node heartbeats in the store; a node that fails says so there, and every node stops
on it, tearing down what it created (its agent, relay or qdiscs).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path

import trio

from netem.base import ShaperOptions
from netem.hostnet import KINDS, node_shaper
from testbed import api
from testbed.scenario.config import Scenario
from testbed.core.errors import ConfigError, TestbedError, leaf_errors
from testbed.core.summary import RunSummary
from testbed.hosts.node_launcher import NodeLauncher
from testbed.hosts.rendezvous import NodeStore, torchrun_store
from testbed.launch.dilation import BUDGET_S
from testbed.launch.runlog import RunLog


def node_address(iface: str | None, towards: str) -> str:
    """This host's IPv4 address on `iface`, or the one it uses to reach `towards` (the store's host)."""
    if iface:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))  # SIOCGIFADDR
            except OSError as exc:
                raise TestbedError(f"--iface {iface}: no such interface with an IPv4 address ({exc.strerror})") from exc
        return socket.inet_ntoa(packed[20:24])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((socket.gethostbyname(towards), 9))  # no packet is sent: this picks the route's source
        return sock.getsockname()[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchrun ... -m testbed.node", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="built-in name or a TOML file (the same on every node)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--stage", type=int, help="serve this stage (default: the torchrun rank)")
    parser.add_argument("--shape", choices=KINDS, default="none",
                        help="how this node shapes its links out (default none: the real network as is)")
    parser.add_argument("--iface", help="the interface to the other hosts: its address is published, and "
                                        "--shape egress shapes it")
    parser.add_argument("--json", help="(entry) write the run's JSON summary here")
    parser.add_argument("--metrics-port", type=int, default=0, help="(entry) Prometheus port (default: any free)")
    parser.add_argument("--no-dashboard", action="store_true", help="(entry) no live dashboard")
    parser.add_argument("--verbose", action="store_true", help="echo the agent's stderr")
    return parser


def node_table(summary: RunSummary) -> list[str]:
    """The per-node and per-hop lines the entry prints after the run's summary."""
    facts = summary.shaper_facts
    lines = ["node rank host         address         offset ms  +- ms  drift ppm  estimates"]
    for node in facts.get("nodes", []):
        lines.append(f"{node['stage']:>4} {node['rank']:>4} {node['hostname'][:12]:<12} {node['address']:<15} "
                     f"{node['offset_ms']:>9.3f} {node['bound_ms']:>6.3f} {node.get('drift_ppm', 0.0):>10.1f} "
                     f"{node.get('estimates', 0):>10}")
    lines.append("hop    expected ms  measured p50 ms  mean ms   min ms  +- ms")

    def ms(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    for hop in facts.get("hops", []):
        lines.append(f"{hop['hop']:<6} {hop['expected_ms']:>11.3f} {ms(hop['p50_ms']):>16} {ms(hop['mean_ms']):>8} "
                     f"{ms(hop['min_ms']):>8} {hop['bound_ms']:>6.3f}")
    lines.append(f"clock violations (a hop received before it was sent, beyond the bounds): "
                 f"{facts.get('clock_violations', 0)}")
    return lines


async def until_sigterm(fn):
    """fn(), unwound like Ctrl-C when torchrun stops its worker with SIGTERM (tear down, tell the others)."""
    result = []

    async def body(cancel_scope: trio.CancelScope) -> None:
        result.append(await fn())
        cancel_scope.cancel()

    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(body, nursery.cancel_scope)
            async for _ in signals:
                raise KeyboardInterrupt  # the body's finally blocks run as for Ctrl-C
    return result[0]


def claim_stage(scenario: Scenario, store, stage: int, world: int) -> int:
    """`stage`, once the world has a node per agent, the stage is one of the scenario's, and no node has it."""
    if world != scenario.n_agents:
        raise ConfigError(f"scenario {scenario.name} has {scenario.n_agents} stages: run it on as many nodes "
                          f"(torchrun --nnodes={scenario.n_agents}), got {world}", key="--nnodes")
    if not 0 <= stage < scenario.n_agents:
        raise ConfigError(f"expected a stage in 0..{scenario.n_agents - 1}, got {stage}", key="--stage")
    if store.add(f"claim/{stage}", 1) != 1:
        raise ConfigError(f"stage {stage} is claimed by two nodes: give each node its own --stage", key="--stage")
    return stage


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from testbed.cli import _run_live, print_summary, write_json

    console = Console(stderr=True, soft_wrap=True)
    args = build_parser().parse_args(argv)
    launchers: list[NodeLauncher] = []
    stage = args.stage
    try:
        scenario = api.scenario(args.scenario, tokens=args.tokens, overrides=args.overrides)
        store, rank, world = torchrun_store()
        stage = claim_stage(scenario, store, rank if args.stage is None else args.stage, world)
        address = node_address(args.iface, os.environ["MASTER_ADDR"])
        links = [link for link in scenario.links if link.src == stage]
        options = ShaperOptions(loss_rto_ms=scenario.loss_rto_ms, transport=scenario.transport,
                                schedule=tuple(e for e in scenario.schedule if e.src == stage))
        shaper = node_shaper(args.shape, links, scenario.n_agents, f"node{stage}", iface=args.iface, options=options)
        nodes = NodeStore(store)
        launchers: list[NodeLauncher] = []

        def launch(sc: Scenario, runlog: RunLog, log) -> NodeLauncher:
            launchers.append(NodeLauncher(sc, shaper, runlog, store=nodes, stage=stage, rank=rank, address=address,
                                          store_host=socket.gethostbyname(os.environ["MASTER_ADDR"]), log=log,
                                          echo_agent_stderr=args.verbose))
            return launchers[-1]

        console.print(f"node {stage} ({scenario.stages[stage].name if stage < scenario.n_stages else 'edge'}), "
                      f"rank {rank} of {world}, {address}; shaper {shaper.name}: {shaper.reason}")
        if stage != 0:
            trio.run(until_sigterm, launch(scenario, RunLog(scenario), lambda m: console.print(m, markup=False)).run)
            console.print(f"node {stage}: done")
            return 0
        summaries = trio.run(until_sigterm, lambda: _run_live(
            [scenario], "none", args.metrics_port, console, not args.no_dashboard, args.verbose,
            argparse.Namespace(dilation=1.0, compensate=False, budget_s=BUDGET_S), launch))
        print_summary(console, summaries)
        for line in node_table(summaries[0]):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        if args.json:
            write_json(Path(args.json), summaries[0])
            console.print(f"JSON summary: {args.json}")
        return 0
    except BaseException as exc:  # noqa: BLE001 - sorted into our own errors below, anything else re-raised
        leaves = leaf_errors(exc)
        cause = launchers[-1].cause if launchers else None
        who = f"node {stage}" if stage is not None else "node"
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            console.print(f"{who}: stopped (Ctrl-C or SIGTERM){f'; {cause}' if cause else ''}; everything this node "
                          "started is gone", markup=False, highlight=False)
            return 130
        if not leaves or not all(isinstance(e, TestbedError) for e in leaves):
            raise
        console.print(f"{who}: error: {cause or '; '.join(str(e) for e in leaves)}", markup=False, highlight=False)
        return 2 if all(isinstance(e, ConfigError) for e in leaves) else 1

if __name__ == "__main__":
    sys.exit(main())
