"""[weights]: the run's first phase, every stage's shard from an origin before the ring serves (testbed.launch.weights).

    [weights]
    origin = "virginia"      # a region of [regions]: where the origin (a hub mirror) is
    strategy = "parallel"    # "one": one stream per node; "parallel": `streams` range requests at once
    streams = 8              # exo's downloader: 8
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from testbed.core.errors import ConfigError
from testbed.core.records import LinkSpec
from testbed.scenario.regions import RegionMatrix
from testbed.scenario.validate import check_keys, number, string

STRATEGIES = ("one", "parallel")
MAX_STREAMS = 64  # as the weights study's sweep: past it no path of the region catalogue gains
MAX_MBIT = 100_000.0


@dataclass(frozen=True)
class WeightsConfig:
    """Where the origin is, how each node fetches its shard, and the access links the bytes cross."""

    origin: str  # a region of the scenario's [regions]
    strategy: str = "parallel"  # "one" | "parallel"
    streams: int = 8  # parallel range streams per node; 1 under "one"
    origin_up_mbit: float = 1000.0  # the origin's uplink, shared by every node's streams
    down_mbit: float = 1000.0  # each node's downlink (default: the ring's network.rate_mbit where it sets one)
    local_ms: float = 0.5  # one way between two hosts of one region (the matrix's diagonal is 0)

    @property
    def stream_count(self) -> int:
        return 1 if self.strategy == "one" else self.streams


WEIGHTS_KEYS = {f.name for f in fields(WeightsConfig)}


def weights_from_dict(table: object, regions: RegionMatrix | None, placed: list[str], links: list[LinkSpec],
                      scale: float, source: str) -> WeightsConfig | None:
    """[weights] (None where the scenario has none), checked against the stages' regions: the origin's delay to
    each stage comes from [regions], so the stages must be placed in it."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key="weights")
    check_keys(table, WEIGHTS_KEYS, source, "weights")
    if "origin" not in table:
        raise ConfigError("required: the origin's region (a name of [regions])", source=source, key="weights.origin")
    origin = string(table, "origin", "", source, "weights")
    if regions is None or not placed:
        raise ConfigError("the origin's delay to each stage comes from [regions]: give the scenario a [regions] "
                          "table and every stage a region", source=source, key="weights.origin")
    if origin not in regions.names:
        raise ConfigError(f"unknown region {origin!r}; expected one of {', '.join(regions.names)}", source=source,
                          key="weights.origin")
    strategy = string(table, "strategy", WeightsConfig.strategy, source, "weights", STRATEGIES)
    streams = number(table, "streams", 1 if strategy == "one" else WeightsConfig.streams, source, "weights",
                     minimum=1, maximum=MAX_STREAMS, integer=True)
    if strategy == "one" and streams != 1:
        raise ConfigError('one stream per node: drop weights.streams, or use strategy = "parallel"', source=source,
                          key="weights.streams")
    ring_mbit = links[0].rate_mbit if links and links[0].rate_mbit > 0 else WeightsConfig.down_mbit
    return WeightsConfig(
        origin=origin, strategy=strategy, streams=streams,
        origin_up_mbit=number(table, "origin_up_mbit", WeightsConfig.origin_up_mbit, source, "weights",
                              minimum=1e-3, maximum=MAX_MBIT),
        down_mbit=number(table, "down_mbit", ring_mbit, source, "weights", minimum=1e-3, maximum=MAX_MBIT),
        local_ms=number(table, "local_ms", WeightsConfig.local_ms, source, "weights", maximum=10_000) * scale)
