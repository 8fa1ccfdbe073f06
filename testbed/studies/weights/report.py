"""The weights study's part of `testbed report`: time to a ready ring per placement, transport and strategy, each
simulated beside its prediction and its bound, with the streams one path needs."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.scenario.validate import check_number, record_from
from testbed.studies.weights.result import WeightsResult
from testbed.studies.base import Sourced


def parse(data: dict, source: str) -> Sourced[WeightsResult]:
    result = record_from(WeightsResult, data, source, "a weights result")
    for i, row in enumerate(result.weights_rows):
        for key in ("ring_ready_s", "predicted_s", "bound_s"):
            check_number(getattr(row, key), source, f"weights_rows[{i}].{key}", positive=True)
        check_number(row.origin_bytes, source, f"weights_rows[{i}].origin_bytes", minimum=0.0)
    check_number(result.one_stream_slowdown, source, "one_stream_slowdown", minimum=1.0)
    return Sourced(source, result)


def markdown(items: Sequence[Sourced[WeightsResult]]) -> list[str]:
    lines = ["| distribution | placement | transport | strategy | ready s (simulated) | predicted s | err % | bound | "
             "bound s | origin copies | source |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for item in items:
        r = item.result
        for row in r.weights_rows:
            lines.append(f"| {r.distribution} | {row.placement} | {row.transport} | {row.strategy} | "
                         f"{row.ring_ready_s:,.1f} | {row.predicted_s:,.1f} | {row.error_pct:+.2f} | {row.bound} | "
                         f"{row.bound_s:,.1f} | {row.copies:.2f} | {item.source} |")
        for row in r.real_rows:
            lines.append(f"| {r.distribution}, real bytes on {row.backend} | {row.placement} | {row.transport} | "
                         f"{row.strategy} | {row.ring_ready_s:,.3f} (measured) | {row.predicted_s:,.3f} | "
                         f"{row.error_pct:+.2f} | | | | {item.source} |")
        notes.append(f"- {r.distribution}: RTT slows one stream {r.one_stream_slowdown:.2f}x on the slowest path "
                     f"({r.slowest_path}); {r.streams_needed} parallel streams make it latency-insensitive (within 5% "
                     f"of the link; {r.streams_needed_simulated} simulated).")
    seed = ("Seed 000's regime map, its first row: weight distribution is \"throughput-bound, great on a geo ring "
            "(independent chunks, BitTorrent)\". Measured here: it holds with enough parallel streams (or a swarm); one "
            "stream under the kernel's default TCP is window-bound on a long path, and the geo ring then waits "
            "several times longer than a co-located one (the rows above).")
    return lines + [""] + notes + ["", seed]
