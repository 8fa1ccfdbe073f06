"""Edge speculation's facts: the cloud's verify passes, the edge clients' rounds and requests."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts


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
