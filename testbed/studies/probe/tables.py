"""The probe's printed tables (links, sizes, round trips, the region matrix) and the command line it states."""

from __future__ import annotations

import argparse

from testbed.studies.base import log_to, print_tables
from testbed.studies.probe.ladder import size_text
from testbed.studies.probe.result import ProbeResult


def link_table(result: ProbeResult):
    from rich.table import Table

    bounded = any(r.bound_ms for r in result.probe_links)
    links = Table(title=f"probe {result.scenario} on {result.shaper}" + (f" at D {result.dilation:g}"
                                                                          if result.dilation != 1 else "")
                  + ": one-way latency (the zero-byte intercept of the median) and goodput, configured vs measured"
                  + ("; +- ms: the clocks' offset bound every one-way figure carries" if bounded else ""))
    for col in ("link", "from -> to", "configured ms", "p50 ms", "p99 ms", "min ms", "error ms",
                *(("+- ms",) if bounded else ()), "configured Mbit/s", "goodput Mbit/s", "error %", "samples"):
        links.add_column(col, justify="right")
    for r in result.probe_links:
        error = r.goodput_error_pct
        links.add_row(r.link, f"{r.src} -> {r.dst}", f"{r.configured_ms:.3f}", f"{r.latency_ms:.3f}",
                      f"{r.latency_ms_p99:.3f}", f"{r.latency_ms_min:.3f}", f"{r.latency_error_ms:+.3f}",
                      *((f"{r.bound_ms:.3f}",) if bounded else ()),
                      f"{r.configured_mbit:g}" if r.configured_mbit else "unlimited",
                      f"{r.goodput_mbit:.2f}" if r.goodput_mbit else "none seen",
                      f"{error:+.2f}" if error is not None else "", str(r.samples))
    return links


def size_table(result: ProbeResult):
    from rich.table import Table

    sizes = Table(title="By message size (NetPIPE): one-way time and throughput (size / time, latency included)")
    for col in ("link", "size", "messages", "p50 ms", "p99 ms", "min ms", "Mbit/s"):
        sizes.add_column(col, justify="right")
    for r in result.probe_links:
        for s in r.sizes:
            if s.samples:
                sizes.add_row(r.link, size_text(s.size_bytes), str(s.samples), f"{s.one_way_ms_p50:.3f}",
                              f"{s.one_way_ms_p99:.3f}", f"{s.one_way_ms_min:.3f}", f"{s.mbit_s:.2f}")
            else:
                sizes.add_row(r.link, size_text(s.size_bytes), "skipped", s.skipped, "", "", "")
    return sizes


def ping_table(result: ProbeResult):
    from rich.table import Table

    pings = Table(title="Round trips (NetPIPE's ping-pong: a message and a reply of its size; the reply comes back "
                        "over the scenario's reverse link where it has one, else the path as it is)")
    for col in ("link", "size", "ping-pongs", "configured ms", "p50 ms", "p99 ms", "min ms"):
        pings.add_column(col, justify="right")
    for r in result.probe_links:
        for p in r.pings:
            if p.samples:
                pings.add_row(r.link, size_text(p.size_bytes), str(p.samples), f"{r.configured_rtt_ms:.3f}",
                              f"{p.rtt_ms_p50:.3f}", f"{p.rtt_ms_p99:.3f}", f"{p.rtt_ms_min:.3f}")
            else:
                pings.add_row(r.link, size_text(p.size_bytes), "skipped", p.skipped, "", "", "")
    return pings


def matrix_table(result: ProbeResult):
    from rich.table import Table

    matrix = Table(title="The region matrix written (one-way ms, row = from; * the reverse direction's figure, "
                         "+ routed through other regions)")
    matrix.add_column("from \\ to", justify="right")
    for name in result.names:
        matrix.add_column(name, justify="right")
    mark = {"measured": "", "reverse": "*", "routed": "+", "": ""}
    for name, row, fill in zip(result.names, result.one_way_ms, result.fills):
        matrix.add_row(name, *(f"{v:.3f}{mark[f]}" for v, f in zip(row, fill)))
    return matrix


def show(result: ProbeResult, args: argparse.Namespace, console) -> None:
    tables = [link_table(result), size_table(result)]
    if any(r.pings for r in result.probe_links):
        tables.append(ping_table(result))
    print_tables(console, [*tables, matrix_table(result)])
    log = log_to(console)
    log(f"probed {len(result.probe_links)} links in {result.seconds:.1f} s")
    if args.out:
        log(f"links: {args.out} (a search file names it: regions = \"{args.out}\", relative to the search file)")
    if args.json:
        from testbed.studies.base import write_json

        write_json(args.json, result.to_json(indent=2), console)


def overrides(args: argparse.Namespace) -> list[str]:
    """--set's items (the API hands one as a string)."""
    if isinstance(args.overrides, str):
        return [args.overrides] if args.overrides else []
    return list(args.overrides)


def command_words(args: argparse.Namespace) -> list[str]:
    words = [str(args.scenario), "--shaper", args.shaper]
    words += [f"--set {item}" for item in overrides(args)]
    if args.dilation != 1.0:
        words.append(f"--dilation {args.dilation:g}")
    return words
