"""The weights study's tables (pure: a result in, rich tables out) and its show: print them, write the JSON."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from testbed.studies.base import print_tables, results_path, write_json
from testbed.studies.weights.result import StrategyRow, WeightsResult

GB = 1e9
MB = 1e6


def hms(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}"


def ring_table(result: WeightsResult) -> Table:
    table = Table(title=f"Time to a ready ring: {result.distribution} ({result.model_bytes / GB:,.1f} GB in "
                        f"{result.dtype}, {result.rings} ring(s), origin up {result.origin_up_mbit:g} Mbit/s, nodes "
                        f"down/up {result.down_mbit:g}/{result.up_mbit:g} Mbit/s, chunks "
                        f"{result.chunk_bytes / 2**20:g} MiB)")
    for name in ("placement", "transport", "strategy", "simulated s", "h:mm:ss", "predicted s", "err %", "tol s",
                 "bound", "bound s", "origin copies", "peers GB", "x co-located"):
        table.add_column(name, justify="left" if name in ("placement", "transport", "strategy", "bound") else "right")
    colocated = {(r.transport, r.strategy): r.ring_ready_s for r in result.weights_rows if r.placement == "co-located"}
    for r in result.weights_rows:
        table.add_row(r.placement, r.transport, r.strategy, f"{r.ring_ready_s:,.1f}", hms(r.ring_ready_s),
                      f"{r.predicted_s:,.1f}", f"{r.error_pct:+.2f}", f"{r.tolerance_s:.1f}" if r.tolerance_s else "",
                      r.bound, f"{r.bound_s:,.1f}", f"{r.copies:.2f}",
                      f"{r.peer_bytes / GB:,.1f}", f"{r.ring_ready_s / colocated[(r.transport, r.strategy)]:.2f}")
    return table


def node_table(result: WeightsResult, placement: str) -> Table:
    table = Table(title=f"Per node, {placement} ring: its rate bound (least of downlink, windows x streams, origin "
                        "share), predicted and simulated ready times")
    for name in ("transport", "strategy", "node", "region", "shard GB", "origin RTT ms", "bound MB/s", "predicted s",
                 "simulated s", "err %"):
        table.add_column(name, justify="left" if name in ("transport", "strategy", "node", "region") else "right")
    rows: list[StrategyRow] = [r for r in result.weights_rows if r.placement == placement]
    for r in rows:
        for n in r.nodes:
            table.add_row(r.transport, r.strategy, n.node, n.region, f"{n.shard_bytes / GB:,.2f}",
                          f"{n.origin_rtt_ms:.1f}", f"{n.cap_bytes_s / MB:,.1f}", f"{n.predicted_s:,.1f}",
                          f"{n.simulated_s:,.1f}", f"{n.error_pct:+.2f}")
    return table


def streams_table(result: WeightsResult) -> Table:
    first = result.streams[0]
    table = Table(title=f"Parallel streams on the slowest path ({first.node} from {result.origin}, RTT "
                        f"{first.rtt_ms:.1f} ms, transport kernel, the node alone)")
    for name in ("streams", "simulated MB/s", "P x cap/RTT MB/s", "link MB/s", "of link"):
        table.add_column(name, justify="right")
    for s in result.streams:
        table.add_row(str(s.streams), f"{s.simulated_bytes_s / MB:,.1f}", f"{s.predicted_bytes_s / MB:,.1f}",
                      f"{s.link_bytes_s / MB:,.1f}", f"{s.of_link:.1%}")
    return table


def real_table(result: WeightsResult) -> Table:
    table = Table(title=f"Real bytes: the checkpoint's stage shards over the {result.real_rows[0].backend} backend's "
                        f"links at D = {result.real_rows[0].dilation:g} (ready: first node's start to the last node's "
                        "last verified byte)")
    for name in ("placement", "transport", "strategy", "MB", "measured s", "predicted s", "err %", "nodes s (pred)"):
        table.add_column(name, justify="left" if name in ("placement", "transport", "strategy") else "right")
    for r in result.real_rows:
        nodes = ", ".join(f"{m:.2f} ({p:.2f})" for m, p in zip(r.node_s, r.node_predicted_s))
        table.add_row(r.placement, r.transport, r.strategy, f"{r.bytes_total / MB:,.1f}", f"{r.ring_ready_s:.3f}",
                      f"{r.predicted_s:.3f}", f"{r.error_pct:+.2f}", nodes)
    return table


def summary_lines(result: WeightsResult) -> list[str]:
    """The issue's two sentences: how much RTT slows one stream, how many streams make it latency-insensitive."""
    one = {(r.placement, r.transport): r.ring_ready_s for r in result.weights_rows if r.origin_bytes and r.streams == 1}
    lines = [f"RTT slows one stream {result.one_stream_slowdown:.2f}x on the slowest path ({result.slowest_path}, "
             f"window cap / RTT against the link); {result.streams_needed} parallel streams make it "
             f"latency-insensitive (within 5% of the link: closed form), {result.streams_needed_simulated} simulated."]
    if ("geo", "kernel") in one and ("co-located", "kernel") in one:
        lines.append(f"One stream per node under transport kernel: the geo ring is ready after "
                     f"{hms(one[('geo', 'kernel')])}, the co-located one after {hms(one[('co-located', 'kernel')])}.")
    return lines


def show(result: WeightsResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [ring_table(result), node_table(result, "geo"), streams_table(result)]
                 + ([real_table(result)] if result.real_rows else []))
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)
    write_json(results_path(args, "weights", args.scenario), result.to_json(indent=2), console)
