"""Tensor parallelism's typed facts: a token's (its "decode" laps' LapRecord.facts) and the run's (its RunSummary part)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class TpToken(LapFacts):
    """A token of tensor-parallel decoding (agents.modes.tp): compute per segment, the head, and the all-reduces' wait."""

    segment_s: float
    head_s: float
    comm_s: float
    collectives: int
    messages: int
    ranks: int


@dataclass(frozen=True)
class TpSummary(JsonRecord):
    """Tensor parallelism over the links (agents.modes.tp): per-token latency next to physics.tp_token_s, and what PP
    would take on the same links (seed 000, Eq. 8)."""

    allreduce: str
    ranks: int
    layers: int
    tokens: int  # decode tokens measured
    token_ms: float  # mean per-token latency (rank 0: embed to sampled token)
    token_ms_p99: float
    predicted_token_ms: float  # physics.tp_token_s: configured links, measured segment and head compute
    error_pct: float
    segment_ms: float  # mean compute of one segment (half a layer), padding included
    head_ms: float
    comm_ms: float  # mean per token waiting on all-reduces
    messages_per_token: float  # sent by rank 0
    bytes_per_token: float  # sent by rank 0
    pp_predicted_token_ms: float  # C + T_ring on the same links: the configured compute of the stages
    ratio_predicted: float  # predicted_token_ms / pp_predicted_token_ms: the exact ratio for this all-reduce
    ratio_bound: float  # Eq. 8: 4 L / N

    @property
    def headline(self) -> tuple[float, float, float]:
        return 1e3 / self.token_ms, 1e3 / self.predicted_token_ms, self.error_pct
