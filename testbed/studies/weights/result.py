"""The weights study's records: a node's and a strategy's simulated and predicted times, the streams a path needs,
and the whole result (one JSON object, key `weights`)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.jsonrecord import JsonRecord
from testbed.studies.weights.real import RealRow


@dataclass(frozen=True)
class NodeRow(JsonRecord):
    """One node under one strategy: its shard, its path to the origin, when it was ready, and the prediction."""

    node: str
    region: str
    shard_bytes: int
    origin_rtt_ms: float
    cap_bytes_s: float  # the rate bound: least of its downlink, its connections' windows, its origin share
    predicted_s: float
    simulated_s: float

    @property
    def error_pct(self) -> float:
        return (self.simulated_s / self.predicted_s - 1) * 100


@dataclass(frozen=True)
class StrategyRow(JsonRecord):
    """One strategy on one placement and transport: the ring's ready time, simulated and predicted."""

    placement: str  # "geo" (the stages' regions) or "co-located" (every node in one region)
    transport: str
    strategy: str
    streams: int  # connections per node to the origin
    ring_ready_s: float  # simulated: the last node's ready time
    predicted_s: float
    bound: str  # "client-server" or "peer-to-peer"
    bound_s: float  # the bound's F / rate terms alone
    tolerance_s: float  # the swarm's chunk pipeline (0 for the streams)
    origin_bytes: float
    peer_bytes: float
    distinct_bytes: float  # what the origin must send at least once
    rounds: int  # TCP rounds the simulation ran (transport "kernel")
    restarts: int  # slow-start restarts after idle
    nodes: tuple[NodeRow, ...]

    @property
    def copies(self) -> float:
        """The origin's bytes in copies of what it had to send (a swarm's ~1; N for N nodes of one shard)."""
        return self.origin_bytes / self.distinct_bytes

    @property
    def error_pct(self) -> float:
        return (self.ring_ready_s / self.predicted_s - 1) * 100


@dataclass(frozen=True)
class StreamsRow(JsonRecord):
    """P parallel streams on one path, under transport "kernel", one node alone: its rate beside the link's."""

    node: str
    rtt_ms: float
    streams: int
    simulated_bytes_s: float  # the shard over its time less the one-way delay
    predicted_bytes_s: float  # min(link, P x window_cap / RTT)
    link_bytes_s: float

    @property
    def of_link(self) -> float:
        return self.simulated_bytes_s / self.link_bytes_s


@dataclass(frozen=True)
class WeightsResult(JsonRecord):
    """Time to a ready ring for every strategy, placement and transport, with the inputs that set it."""

    distribution: str  # "MODEL on SCENARIO from ORIGIN"
    scenario: str
    model: str
    model_bytes: int
    dtype: str
    regions: tuple[str, ...]  # the geo ring's, per stage
    colocated: str  # the co-located ring's region
    origin: str
    origin_up_mbit: float
    down_mbit: float
    up_mbit: float
    rings: int  # copies of the ring: nodes of one stage form a swarm group
    chunk_bytes: int
    weights_rows: tuple[StrategyRow, ...]  # the report part's key
    streams: tuple[StreamsRow, ...]  # the farthest node's path, P = 1 .. the fewest that reach 95%
    slowest_path: str  # the node whose path to the origin has the longest RTT
    one_stream_slowdown: float  # that path: link rate / (window_cap / RTT)
    streams_needed: int  # the closed form: ceil(0.95 x rate x RTT / window_cap)
    streams_needed_simulated: int  # the fewest P whose simulated rate is within 5% of the link's
    real_rows: tuple[RealRow, ...] = ()  # --real: a checkpoint's shards as real bytes over a backend's links
