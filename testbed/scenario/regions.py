"""[regions] of a scenario: named regions and the one-way latency between them (seed 000, "Placement laws")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_keys, number, string

REGION_KEYS = {"names", "one_way_ms", "source"}


@dataclass(frozen=True)
class RegionMatrix:
    """[regions]: named regions and the one-way latency between every ordered pair (ms, already scaled)."""

    names: tuple[str, ...]
    one_way_ms: tuple[tuple[float, ...], ...]  # [from][to]
    source: str = ""  # where the figures come from

    def latency(self, a: str, b: str) -> float:
        return self.one_way_ms[self.names.index(a)][self.names.index(b)]

    def ring_ms(self, order: list[str] | tuple[str, ...]) -> list[float]:
        """One-way latency of each hop of a ring visiting `order` (the last hop closes the ring)."""
        return [self.latency(order[i], order[(i + 1) % len(order)]) for i in range(len(order))] if len(order) > 1 else []


def parse_regions(table: Any, source: str, scale: float) -> RegionMatrix | None:
    """[regions] names = [...], one_way_ms = [[...], ...] (row = from, column = to; zero diagonal)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key="regions")
    check_keys(table, REGION_KEYS, source, "regions")
    names = table.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(x, str) and x for x in names) \
            or len(set(names)) != len(names):
        raise ConfigError("expected a non-empty array of distinct region names", source=source, key="regions.names")
    matrix = table.get("one_way_ms")
    if not isinstance(matrix, list) or len(matrix) != len(names) or not all(isinstance(row, list)
                                                                            and len(row) == len(names) for row in matrix):
        raise ConfigError(f"expected a {len(names)} x {len(names)} array of one-way delays in ms (row = from)",
                          source=source, key="regions.one_way_ms")
    rows = []
    for i, row in enumerate(matrix):
        rows.append(tuple(number({f"one_way_ms[{i}][{j}]": v}, f"one_way_ms[{i}][{j}]", 0.0, source, "regions",
                                  maximum=60_000) * scale for j, v in enumerate(row)))
        if rows[-1][i] != 0:
            raise ConfigError("a region's latency to itself must be 0", source=source, key=f"regions.one_way_ms[{i}][{i}]")
    return RegionMatrix(tuple(names), tuple(rows), string(table, "source", "", source, "regions"))
