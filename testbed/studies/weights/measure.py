"""The weights study's run: every strategy on the geo ring and on a co-located one, under both transports, simulated
on simulated time beside its closed forms; then the streams one path needs to stop depending on its round trip."""

from __future__ import annotations

import argparse
from dataclasses import replace

from rich.console import Console

from testbed.core.distribution import LATENCY_INSENSITIVE_WITHIN, one_stream_slowdown, streams_for_link
from testbed.core.errors import ConfigError
from testbed.core.tcp import TRANSPORTS, window_limited_rate
from testbed.studies.base import make_scenario
from testbed.studies.weights import inputs, predict, real
from testbed.studies.weights.result import NodeRow, StrategyRow, StreamsRow, WeightsResult
from testbed.studies.weights.simulate import ORIGIN, Network, Strategy, simulate

MIB = 2**20
MAX_STREAMS_SWEPT = 64  # the streams sweep stops here however long the path
SWEEP_CHUNKS = 16  # chunks a stream carries in the sweep


def strategies(streams: int) -> list[Strategy]:
    """One stream per node, `streams` parallel range streams per node, and the swarm over `streams` origin streams."""
    return [Strategy("one stream", 1), Strategy(f"{streams} streams", streams),
            Strategy("swarm", streams, swarm=True)]


def strategy_row(net: Network, strategy: Strategy, chunk_bytes: int, placement: str, transport: str) -> StrategyRow:
    """One simulation and its prediction."""
    outcome = simulate(net, strategy, chunk_bytes)
    pred = predict.predict(net, strategy, chunk_bytes)
    nodes = tuple(NodeRow(nd.name, nd.region, nd.shard_bytes, net.rtt_s(ORIGIN, i + 1) * 1e3, pred.node_cap_bytes_s[i],
                          pred.node_s[i], outcome.ready_s[i]) for i, nd in enumerate(net.nodes))
    return StrategyRow(placement, transport, strategy.name, strategy.origin_streams, outcome.ring_ready_s,
                       pred.ring_s, pred.bound, pred.bound_s, pred.tolerance_s, outcome.origin_bytes,
                       outcome.peer_bytes, predict.distinct_bytes(net), outcome.rounds, outcome.restarts, nodes)


def streams_sweep(net: Network, chunk_bytes: int) -> tuple[int, float, list[StreamsRow]]:
    """The node with the longest round trip to the origin, alone, under transport "kernel": its rate with P = 1, 2,
    ... streams, up to the closed form's fewest that reach 95% of its link (and one more, to show the step); with
    that closed form and one stream's slowdown on the path."""
    kernel = replace(net, kernel=True)
    far = max(range(len(kernel.nodes)), key=lambda i: kernel.rtt_s(ORIGIN, i + 1))
    node = kernel.nodes[far]
    alone = replace(kernel, nodes=(node,), one_way_s=tuple(tuple(kernel.one_way_s[a][b] for b in (0, far + 1))
                                                            for a in (0, far + 1)))
    link = min(node.down_bytes_s, kernel.origin_up_bytes_s)
    params = predict.path_params(alone, ORIGIN, 0, link)
    needed = streams_for_link(params)
    rows = []
    for p in range(1, min(needed + 1, MAX_STREAMS_SWEPT) + 1):
        # P streams' steady rate: a shard of SWEEP_CHUNKS chunks a stream, so no stream is left alone at the end
        shard = p * SWEEP_CHUNKS * chunk_bytes
        each = replace(alone, nodes=(replace(node, shard_bytes=shard),))
        ready = simulate(each, Strategy(f"{p} streams", p), chunk_bytes).ring_ready_s
        rate = shard / (ready - alone.one_way_s[0][1])
        rows.append(StreamsRow(node.name, params.rtt_s * 1e3, p, rate, min(link, p * window_limited_rate(params)),
                               link))
    return needed, one_stream_slowdown(params), rows


def check_options(args: argparse.Namespace) -> None:
    if not args.scenario:
        raise ConfigError("required: a scenario (a built-in name or a TOML file)", key="scenario")
    for key in ("origin_up_mbit", "down_mbit", "up_mbit", "chunk_mib", "streams"):
        if not getattr(args, key) > 0:
            option = "--" + key.replace("_", "-")
            raise ConfigError(f"expected a positive number, got {getattr(args, key)!r}", key=option)
    if not args.local_ms >= 0:
        raise ConfigError(f"expected a delay >= 0, got {args.local_ms!r}", key="--local-ms")


def run(args: argparse.Namespace, console: Console) -> WeightsResult:
    check_options(args)
    overrides = [args.overrides] if isinstance(args.overrides, str) else args.overrides  # the API's one override
    scenario = make_scenario(args.scenario, overrides=overrides)
    given = args.regions.split(",") if isinstance(args.regions, str) else args.regions
    regions = inputs.node_regions(scenario, [r.strip() for r in given or [] if r.strip()])
    colocated = args.colocate or args.origin
    links = inputs.Links(args.origin, args.origin_up_mbit * inputs.MBIT, args.down_mbit * inputs.MBIT,
                         args.up_mbit * inputs.MBIT, args.local_ms / 1e3)
    chunk = int(args.chunk_mib * MIB)
    rows = []
    for placement, where in (("geo", regions), ("co-located", [colocated] * len(regions))):
        for transport in ([args.transport] if args.transport else TRANSPORTS):
            net = inputs.network(scenario, where, links, transport, args.rings)
            rows += [strategy_row(net, s, chunk, placement, transport) for s in strategies(args.streams)]
    real_rows = ()
    if args.real:
        real_rows = tuple(real.measure(args, scenario, [("geo", regions), ("co-located", [colocated] * len(regions))],
                                       args.streams, lambda line: console.print(line, markup=False, highlight=False)))
    geo = inputs.network(scenario, regions, links, "kernel", args.rings)
    needed, slowdown, sweep = streams_sweep(geo, chunk)
    reached = [row.streams for row in sweep if row.of_link >= 1 - LATENCY_INSENSITIVE_WITHIN]
    return WeightsResult(
        distribution=f"{scenario.geometry.name} on {scenario.name} from {args.origin}", scenario=scenario.name,
        model=scenario.geometry.name, model_bytes=scenario.geometry.weight_bytes, dtype=scenario.geometry.dtype,
        regions=tuple(regions), colocated=colocated, origin=args.origin, origin_up_mbit=args.origin_up_mbit,
        down_mbit=args.down_mbit, up_mbit=args.up_mbit, rings=args.rings, chunk_bytes=chunk, weights_rows=tuple(rows),
        streams=tuple(sweep), slowest_path=sweep[0].node, one_stream_slowdown=slowdown, streams_needed=needed,
        streams_needed_simulated=min(reached) if reached else 0, real_rows=real_rows)
