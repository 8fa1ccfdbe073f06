"""The weights study's inputs: each stage's shard from the scenario's [geometry], the nodes' and the origin's regions
and rates, and the one-way delays between them, as a simulate.Network."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.errors import ConfigError
from testbed.core.tcp import INITIAL_WINDOW_SEGMENTS, KERNEL_WINDOW_CAP_BYTES, MSS_BYTES, RTO_MIN_S, TRANSPORTS
from testbed.deploy import regions as region_catalog
from testbed.launch.weights import geometry_shards
from testbed.scenario.config import Scenario
from testbed.studies.weights.simulate import Network, Node

MBIT = 125_000.0  # bytes/s in a Mbit/s


@dataclass(frozen=True)
class Shard:
    """One stage's weights: its layers (every expert), the LM head's matrix where it holds it, the entry's
    embedding (testbed.deploy.rules.resident_bytes)."""

    stage: str
    layers: int
    head: bool
    n_bytes: int


@dataclass(frozen=True)
class Links:
    """Where the origin is and what every endpoint's access link carries (bytes/s), and the delay within a region."""

    origin: str
    origin_up_bytes_s: float
    down_bytes_s: float
    up_bytes_s: float
    local_one_way_s: float  # two endpoints in one region (the catalogue's diagonal is 0)


def shards(scenario: Scenario) -> list[Shard]:
    """Each stage's shard of the scenario's [geometry], the layers split as the scenario splits them."""
    geometry = scenario.geometry
    if geometry is None:
        raise ConfigError("the weights study needs a [geometry] (the model whose shards the nodes load), e.g. "
                          '--set geometry.preset="seed-700b"', source=scenario.source, key="geometry")
    return [Shard(st.name, share.layers, share.head, n_bytes)
            for st, (share, n_bytes) in zip(scenario.stages, geometry_shards(scenario))]


def node_regions(scenario: Scenario, given: list[str] | None) -> list[str]:
    """Each stage's region: `given` (--regions), else the stages' own, else their names where the region catalogue
    knows every one."""
    names = [st.name for st in scenario.stages]
    if given:
        if len(given) != len(names):
            raise ConfigError(f"expected one region per stage ({len(names)}: {', '.join(names)}), got {len(given)}",
                              key="--regions")
        return list(given)
    placed = [st.region for st in scenario.stages]
    if all(placed):
        return placed  # type: ignore[return-value]
    if all(name in region_catalog().names for name in names):
        return names
    raise ConfigError(f"the stages of {scenario.name} name no regions: give --regions (one per stage, from "
                      f"testbed/deploy/regions.toml, e.g. hong-kong,ireland,virginia)", key="--regions")


def one_way_s(scenario: Scenario, a: str, b: str, local_s: float) -> float:
    """The one-way delay a -> b: the scenario's [regions] where it names both, else the region catalogue's; within
    one region, `local_s`."""
    if a == b:
        return local_s
    matrix = scenario.regions
    if matrix is not None and a in matrix.names and b in matrix.names:
        return matrix.latency(a, b) / 1e3
    catalog = region_catalog()
    for name in (a, b):
        if name not in catalog.names:
            raise ConfigError(f"unknown region {name!r}; expected one of {', '.join(catalog.names)}", key="--regions")
    return catalog.latency_ms(a, b) / 1e3


def network(scenario: Scenario, regions: list[str], links: Links, transport: str, rings: int = 1) -> Network:
    """The distribution's network: `rings` copies of the ring (ring r's stage s in the same region as ring 0's:
    nodes of one stage form a swarm group), the origin, and every delay between them."""
    if transport not in TRANSPORTS:
        raise ConfigError(f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}",
                          key="--transport")
    if rings < 1:
        raise ConfigError(f"expected --rings >= 1, got {rings}", key="--rings")
    cut = shards(scenario)
    nodes = tuple(Node(f"{shard.stage}" + (f"#{r + 1}" if rings > 1 else ""), region, s, shard.n_bytes,
                       links.down_bytes_s, links.up_bytes_s)
                  for r in range(rings) for s, (shard, region) in enumerate(zip(cut, regions, strict=True)))
    places = [links.origin] + [nd.region for nd in nodes]
    delays = tuple(tuple(one_way_s(scenario, a, b, links.local_one_way_s) for b in places) for a in places)
    return Network(links.origin, links.origin_up_bytes_s, nodes, delays, kernel=transport == "kernel",
                   initial_window=INITIAL_WINDOW_SEGMENTS * MSS_BYTES, window_cap=KERNEL_WINDOW_CAP_BYTES,
                   rto_min_s=RTO_MIN_S)
