"""The bench study in the report: `testbed bench --json` figures (told apart by their "relay") checked and tabled:
the relay's release error per delay and each backend's per-hop overhead against the raw socket."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_number

RELAY_NUMBERS = ("delay_ms", "p50_us", "p99_us")
OVERHEAD_NUMBERS = ("overhead_p50_us", "raw_one_way_p50_us", "ratio")


@dataclass(frozen=True)
class SourcedBench:
    """One bench run's figures and where they came from."""

    source: str
    figures: dict[str, Any]


def _check_table(rows: Any, keys: tuple[str, ...], source: str, where: str) -> None:
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"expected an object, got {row!r}", source=source, key=f"{where}[{i}]")
        for key in keys:
            check_number(row.get(key), source, f"{where}[{i}].{key}")


def parse_bench(data: dict, source: str) -> SourcedBench:
    """A `testbed bench --json` object: its relay rows and overhead figures are numbers; errors name the key."""
    relay, overhead = data.get("relay"), data.get("overhead", {})
    if not isinstance(relay, list):
        raise ConfigError(f"expected a list of rows, got {relay!r}", source=source, key="relay")
    if not isinstance(overhead, dict):
        raise ConfigError(f"expected an object of backends, got {overhead!r}", source=source, key="overhead")
    _check_table(relay, RELAY_NUMBERS, source, "relay")
    for backend, figures in overhead.items():
        if not isinstance(figures, dict):
            raise ConfigError(f"expected an object, got {figures!r}", source=source, key=f"overhead.{backend}")
        for key in OVERHEAD_NUMBERS:
            check_number(figures.get(key), source, f"overhead.{backend}.{key}", minimum=0.0)
    return SourcedBench(source, data)


def bench_markdown(items: Sequence[SourcedBench]) -> list[str]:
    """The bench section's body: the relay's release error, then the per-hop overhead per backend."""
    lines = []
    for item in items:
        lines += [f"{item.source}: release error (release - deadline) of the userspace relay, and each backend's "
                  "per-hop overhead p50 against a raw blocking-socket loopback transfer of the same frame.", "",
                  "| source | delay (ms) | p50 (µs) | p99 (µs) |", "|---|---:|---:|---:|"]
        lines += [f"| {item.source} | {row['delay_ms']:g} | {row['p50_us']:.1f} | {row['p99_us']:.1f} |"
                  for row in item.figures["relay"]]
        lines += ["", "| source | backend | overhead p50 (µs) | raw one-way p50 (µs) | ratio |", "|---|---|---:|---:|---:|"]
        lines += [f"| {item.source} | {backend} | {f['overhead_p50_us']:.1f} | {f['raw_one_way_p50_us']:.1f} | "
                  f"{f['ratio']:.2f} |" for backend, f in item.figures.get("overhead", {}).items()]
        lines.append("")
    return lines
