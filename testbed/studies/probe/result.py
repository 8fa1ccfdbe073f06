"""The probe's records: a size of the ladder on a link (SizeRow), a link (LinkRow), a scenario's links and the region
matrix they give (ProbeResult: what `testbed probe --json` writes and `testbed search` reads)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.records import JsonRecord


@dataclass(frozen=True)
class SizeRow(JsonRecord):
    """One size of the ladder on one link: its one-way times (ms) and NetPIPE's throughput (size / time)."""

    size_bytes: int
    samples: int  # 0: skipped (see `skipped`)
    one_way_ms_p50: float = 0.0
    one_way_ms_p99: float = 0.0
    one_way_ms_min: float = 0.0
    mbit_s: float = 0.0  # size / median one-way time (NetPIPE's figure: latency included)
    skipped: str = ""


@dataclass(frozen=True)
class PingRow(JsonRecord):
    """One size's ping-pongs on one link (NetPIPE's own mode: a message and a reply of its size): round trips, ms."""

    size_bytes: int
    samples: int  # 0: skipped (see `skipped`)
    rtt_ms_p50: float = 0.0
    rtt_ms_p99: float = 0.0
    rtt_ms_min: float = 0.0
    skipped: str = ""


@dataclass(frozen=True)
class LinkRow(JsonRecord):
    """One directed link: what the scenario configured, and what came back."""

    link: str  # "0->1": agent src -> agent dst, as the scenario's links are named
    src: str  # the agents' regions (or stage names where a stage names no region)
    dst: str
    configured_ms: float
    configured_mbit: float  # 0: unlimited
    latency_ms: float  # median one-way time of the smallest size, less its serialization at the measured goodput
    latency_ms_p99: float
    latency_ms_min: float
    goodput_mbit: float  # payload Mbit/s, the slope from the smallest size to the largest (0: no rate showed)
    samples: int  # at the smallest size
    sizes: tuple[SizeRow, ...]
    # the one-way figures' error bound, ms: 0 where both ends read one clock; across hosts, the clock offset's
    # (remote.offset_hull: half the smallest clock-probe round trip, widened by any drift over the link)
    bound_ms: float = 0.0
    # the reply's way back: the scenario's link dst -> src where it has one, else the path as it is (0 configured)
    configured_rtt_ms: float = 0.0
    pings: tuple[PingRow, ...] = ()  # round trips by size (empty: none measured)

    @property
    def round_trip_ms(self) -> float | None:
        """The smallest measured size's median round trip (None: no ping-pong)."""
        return next((p.rtt_ms_p50 for p in self.pings if p.samples), None)

    @property
    def latency_error_ms(self) -> float:
        return self.latency_ms - self.configured_ms

    @property
    def goodput_error_pct(self) -> float | None:
        """Measured against the configured rate, where the link has one and the probe saw one."""
        if self.configured_mbit <= 0 or self.goodput_mbit <= 0:
            return None
        return (self.goodput_mbit / self.configured_mbit - 1) * 100


@dataclass(frozen=True)
class ProbeResult(JsonRecord):
    """Every link of one scenario on one backend, and the region matrix they give (what `testbed search` reads)."""

    scenario: str
    shaper: str
    dilation: float  # the links ran this many times slower; every figure here is divided back
    sizes_bytes: tuple[int, ...]
    samples: int
    seconds: float  # the probe's own time (simulated seconds on virtual time)
    probe_links: tuple[LinkRow, ...]  # the report part's key
    names: tuple[str, ...]
    one_way_ms: tuple[tuple[float, ...], ...]  # [from][to]
    fills: tuple[tuple[str, ...], ...]  # how each entry was had: measured, reverse, routed (link_table.fill_matrix)
    rate_mbit: float  # the slowest link's goodput (0: no link showed a rate)
