"""Edge speculation's facts: the cloud's verify passes, the edge clients' rounds and requests, the run's summary."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class DsdVerify(LapFacts):
    """The cloud's verify (or prompt) pass for one edge client (agents.modes.dsd): its wait behind other clients'
    passes, K, the batch it ran in, and sum min(q, p) over its drafts where the round had any."""

    client: int
    queue_s: float
    k: int
    batch: int = 1
    overlap_sum: float | None = None


@dataclass(frozen=True)
class DsdRound(LapFacts):
    """An edge client's round (agents.modes.dsd): K drafted, `accepted` kept; `ready`: the drafts it began with,
    drafted while the last round was verified (pipelined); `wait_s` send to verdict-in-hand, `verdict_s` send to
    the verdict's arrival; `hit`: the guess was right and the next round is drafted."""

    k: int
    accepted: int
    draft_s: float
    draft_real_s: float
    ready: int
    overlap_sum: float
    wait_s: float
    verdict_s: float
    hit: bool
    client: int
    draft: str

    def draft_time_s(self) -> float:
        return self.draft_s


@dataclass(frozen=True)
class DsdRequest(LapFacts):
    """An edge client's whole request: `rounds` rounds from its prompt to its last token."""

    client: int
    rounds: int


@dataclass(frozen=True)
class DsdSummary(JsonRecord):
    """Edge drafts, entry verification (agents.modes.dsd): rounds and requests next to physics.dsd_round_s."""

    clients: int
    pipelined: bool
    k: int
    rtt_ms: float
    rounds: int
    tokens_per_round: float  # Gamma, measured
    alpha_hat: float | None
    draft_ms_per_token: float  # t_d, from the rounds drafted after their verdict
    verify_ms: float  # t_v: the entry's verify laps (the ring, its compute and the head)
    queue_ms: float  # a round's wait at the entry behind other clients' rounds
    hit_rate: float  # pipelined: rounds whose drafts were ready from the last round's wait
    round_ms: float  # verdict to verdict, at the edge
    predicted_round_ms: float  # physics.dsd_round_s with the measured t_d, t_v, hit rate (and queueing)
    request_ms: float  # a client's whole request: the prompt sent to the last verdict (mean over the clients)
    predicted_request_ms: float
    request_tokens: float
    aggregate_tok_s: float  # every client's tokens over the stretch where all of them were decoding
    predicted_aggregate_tok_s: float  # min(E Gamma / round, b Gamma / t_v): the clients, or the saturated server
    server_busy: float  # the entry's verify passes over the run's rounds
    batch_mean: float  # clients' rounds per verify pass (decode.batching = "continuous" on a one-node cloud)
    bytes_up_per_round: int
    bytes_down_per_round: int
    error_pct: float  # request latency

    def calibration_lap(self) -> tuple[float, float]:
        """At zero round trip (testbed.launch.dilation): (what a round took beyond physics.dsd_round_s, ms; that
        physics, s). A lap of edge speculation is a round."""
        return max(0.0, self.round_ms - self.predicted_round_ms), self.predicted_round_ms / 1e3

    @property
    def headline(self) -> tuple[float, float, float]:
        return (self.aggregate_tok_s, self.predicted_aggregate_tok_s,
                (self.aggregate_tok_s / self.predicted_aggregate_tok_s - 1) * 100)
