"""The probe's output: the region matrix its links give (the file `testbed search` reads: `regions = "FILE"`), and
its part of `testbed report`.

A matrix needs every ordered pair of regions, and a ring measures only its own hops. An entry no link measured is
the reverse direction's figure where that was measured (marked "reverse": links are taken as symmetric), else the
shortest path through the measured entries (marked "routed": what relaying through the regions between would cost).
A link inside one region (two stages in one place) is measured and listed, and leaves the matrix's zero diagonal be.

    names, one_way_ms, fills = fill_matrix(rows)
    write(result, "links.toml", "python -m testbed probe geo-ring --shaper userspace")
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Sequence
from pathlib import Path

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_number, check_text, record_from
from testbed.studies.probe.result import ProbeResult
from testbed.studies.base import Sourced

FILLS = ("measured", "reverse", "routed")


def fill_matrix(rows: Sequence) -> tuple[tuple[str, ...], tuple[tuple[float, ...], ...], tuple[tuple[str, ...], ...]]:
    """(names, one_way_ms [from][to], how each entry was had) from the probe's LinkRows (see the module doc)."""
    names = list(dict.fromkeys(name for r in rows for name in (r.src, r.dst)))
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    seen: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if r.src != r.dst:
            seen.setdefault((index[r.src], index[r.dst]), []).append(r.latency_ms)
    matrix = [[0.0] * n for _ in range(n)]
    fills = [[""] * n for _ in range(n)]
    for (a, b), values in seen.items():
        matrix[a][b], fills[a][b] = sum(values) / len(values), "measured"
    for a in range(n):
        for b in range(n):
            if a != b and not fills[a][b] and fills[b][a] == "measured":
                matrix[a][b], fills[a][b] = matrix[b][a], "reverse"
    known = [[0.0 if a == b else matrix[a][b] if fills[a][b] else math.inf for b in range(n)] for a in range(n)]
    for via in range(n):  # Floyd-Warshall over the measured (and reversed) entries
        for a in range(n):
            for b in range(n):
                known[a][b] = min(known[a][b], known[a][via] + known[via][b])
    for a in range(n):
        for b in range(n):
            if a != b and not fills[a][b]:
                if math.isinf(known[a][b]):
                    raise ConfigError(f"no measured link connects {names[a]} to {names[b]}, so the region matrix "
                                      "has no figure for them", key="SCENARIO")
                matrix[a][b], fills[a][b] = known[a][b], "routed"
    return tuple(names), tuple(tuple(row) for row in matrix), tuple(tuple(row) for row in fills)


def result_of(scenario: str, shaper: str, dilation: float, sizes: Sequence[int], samples: int, seconds: float,
              rows: Sequence) -> ProbeResult:
    """The probe's result from its links' rows: the matrix they fill and the slowest link's goodput."""
    names, matrix, fills = fill_matrix(rows)
    rated = [r.goodput_mbit for r in rows if r.goodput_mbit > 0]
    return ProbeResult(scenario, shaper, dilation, tuple(sizes), samples, seconds, tuple(rows), tuple(names), matrix,
                       fills, min(rated) if rated else 0.0)


def toml_text(result, command: str) -> str:
    """The file: rate_mbit (the slowest link's goodput), [regions] (names, one_way_ms, source), a [[links]] per link."""
    def number(value: float) -> str:
        return f"{value:.4f}"

    def text(value: str) -> str:
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's

    routed = [f"{result.names[a]} -> {result.names[b]} ({fill})" for a, row in enumerate(result.fills)
              for b, fill in enumerate(row) if fill in ("reverse", "routed")]
    lines = [f"# {command} ({datetime.date.today().isoformat()}): one-way latency and goodput of every link.",
             "# A search file reads the matrix by naming this file: regions = \"<this file>\" (testbed search).",
             "# [regions].one_way_ms: each link's median one-way time at the smallest size less its serialization, "
             "row = from."]
    if routed:
        lines.append("# Not measured (reverse: the other direction's figure; routed: through other regions): "
                     + ", ".join(routed))
    if result.rate_mbit > 0:
        lines += ["", f"rate_mbit = {number(result.rate_mbit)}  # the slowest link's goodput (a search file without "
                      "its own rate_mbit takes it)"]
    width = max(len(number(v)) for row in result.one_way_ms for v in row)
    lines += ["", "[regions]", f"names = [{', '.join(text(n) for n in result.names)}]", "one_way_ms = ["]
    lines += [f"  [{', '.join(number(v).rjust(width) for v in row)}],  # {name}"
              for name, row in zip(result.names, result.one_way_ms)]
    lines += ["]", f"source = {text(f'{command}: median one-way latency of each link (probe)')}"]
    for r in result.probe_links:
        measured = [s for s in r.sizes if s.samples]
        lines += ["", "[[links]]", f"link = {text(r.link)}", f"from = {text(r.src)}", f"to = {text(r.dst)}",
                  f"configured_ms = {number(r.configured_ms)}", f"configured_mbit = {number(r.configured_mbit)}",
                  f"one_way_ms = {number(r.latency_ms)}", f"one_way_ms_p99 = {number(r.latency_ms_p99)}",
                  f"one_way_ms_min = {number(r.latency_ms_min)}", f"goodput_mbit = {number(r.goodput_mbit)}",
                  f"samples = {r.samples}", f"one_way_bound_ms = {number(r.bound_ms)}",
                  *([f"round_trip_ms = {number(r.round_trip_ms)}",
                     f"configured_round_trip_ms = {number(r.configured_rtt_ms)}"] if r.round_trip_ms is not None
                    else []),
                  f"sizes_bytes = [{', '.join(str(s.size_bytes) for s in measured)}]",
                  f"sizes_one_way_ms_p50 = [{', '.join(number(s.one_way_ms_p50) for s in measured)}]",
                  f"sizes_mbit_s = [{', '.join(number(s.mbit_s) for s in measured)}]"]
    return "\n".join(lines) + "\n"


def write(result, path: str | Path, command: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(toml_text(result, command), encoding="utf-8")
    return path


# --- the report part ------------------------------------------------------------------------------------------


def parse(data: dict, source: str) -> Sourced[ProbeResult]:
    """A `testbed probe --json` object -> a checked ProbeResult; field errors become ConfigError."""
    result = record_from(ProbeResult, data, source, "a probe result")
    check_text(result.shaper, source, "shaper")
    if not isinstance(result.probe_links, tuple) or not result.probe_links:
        raise ConfigError("expected a non-empty list of links", source=source, key="probe_links")
    for i, r in enumerate(result.probe_links):
        check_number(r.configured_ms, source, f"probe_links[{i}].configured_ms", minimum=0.0)
        check_number(r.latency_ms, source, f"probe_links[{i}].latency_ms")
        check_number(r.goodput_mbit, source, f"probe_links[{i}].goodput_mbit", minimum=0.0)
    return Sourced(source, result)


def markdown(items: Sequence[Sourced[ProbeResult]]) -> list[str]:
    lines = ["Each probe: every link of a scenario measured one-way on the box's clock (median of the smallest "
             "message, less its serialization; goodput the slope to the largest), beside what the scenario "
             "configured.", "",
             "| probe | shaper | link | configured ms | p50 ms | p99 ms | error ms | configured Mbit/s | goodput "
             "Mbit/s | error % |", "|---|---|---|---|---|---|---|---|---|---|"]
    for item in items:
        r = item.result
        for link in r.probe_links:
            error = link.goodput_error_pct
            rate = f"{link.configured_mbit:g}" if link.configured_mbit else "unlimited"
            lines.append(f"| {item.source} | {r.shaper} | {link.src} -> {link.dst} | {link.configured_ms:.3f} | "
                         f"{link.latency_ms:.3f} | {link.latency_ms_p99:.3f} | {link.latency_error_ms:+.3f} | {rate} | "
                         f"{link.goodput_mbit:.2f} | {f'{error:+.2f}' if error is not None else ''} |")
    return lines
