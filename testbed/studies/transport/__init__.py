"""The transport study: the flow-level TCP model of transport "kernel" (testbed.core.tcp) checked against transfers
of 64 KiB to 256 MiB on one and four fresh connections over each backend's links (virtual: the model itself, exact;
the relay: the model paced in real time; netem: the kernel's own TCP), with the backend's ceiling, the window's
cap and slow start's rounds measured beside."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_number, check_text, record_from
from testbed.studies.base import ReportPart, Study
from testbed.studies.transport import grid, measure
from testbed.studies.transport.cells import error_cell, measured_cell, predicted_cell
from testbed.studies.transport.result import TransportResult


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapers", default=measure.DEFAULT_SHAPERS, metavar="LIST",
                        help=f"backends, comma-separated (default {measure.DEFAULT_SHAPERS}; netem where the kernel "
                             "has it, else inside user-mode-linux: python -m netem.uml -- python -m testbed "
                             "transport --shapers netem)")
    parser.add_argument("--quick", action="store_true", help="a small subset of the grid (3 links, 64 KiB and 4 MiB)")
    parser.add_argument("--max-point-s", type=float, default=grid.MAX_POINT_S, metavar="S",
                        help=f"leave out points predicted to take longer (default {grid.MAX_POINT_S:g} s)")
    parser.add_argument("--repeats", type=int, default=grid.REPEATS, metavar="N",
                        help=f"transfers of each lossy point, each over a link with a seed of its own, beside the "
                             f"model's mean over as many seeds (default {grid.REPEATS}; a loss-free point is one)")
    parser.add_argument("--json", help="write the result here")


def parse(data: dict, source: str) -> TransportResult:
    result = record_from(TransportResult, data, source, "a transport result")
    if not result.transport_rows:
        raise ConfigError("expected a non-empty list of transfers", source=source, key="transport_rows")
    for i, r in enumerate(result.transport_rows):
        check_text(r.backend, source, f"transport_rows[{i}].backend")
        check_number(r.predicted_s, source, f"transport_rows[{i}].predicted_s", positive=True)
        check_number(r.measured_s, source, f"transport_rows[{i}].measured_s", positive=True)
    return result


def markdown(items: Sequence[TransportResult]) -> list[str]:
    lines = ["Each transfer: S bytes on n fresh connections (transport \"kernel\"), first write to last byte, beside "
             "testbed.core.tcp's prediction; a lossy point's times are the means of its draws (each on a seed of its "
             "own), \u00b1 their standard error [min-max].", "",
             "| backend | RTT ms | Mbit/s | loss % | size | n | predicted s | measured s | error % | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for result in items:
        for r in result.transport_rows:
            lines.append(f"| {r.backend} | {r.rtt_ms:g} | {r.rate_mbit:g} | {r.loss_pct:g} | "
                         f"{grid.size_text(r.size_bytes)} | {r.connections} | {predicted_cell(r)} | "
                         f"{measured_cell(r)} | {error_cell(r)} | {r.limited} |")
    return lines


# No bench row (Study.bench): its grid is a bench section of its own (`python -m testbed bench --only transport`,
# testbed.studies.bench.transport), every point against the kernel's TCP.
STUDY = Study("transport", "the flow-level TCP model of transport \"kernel\" against transfers over each backend "
                           "(64 KiB-256 MiB, RTT 2-280 ms, 10-1,000 Mbit/s, loss up to 1 percent, 1 and 4 "
                           "connections), with the window's cap and slow start's rounds", add_options, measure.run,
              measure.show,
              scenario=False, report=ReportPart("transport_rows", "Transport", "transport checks", parse, markdown))
