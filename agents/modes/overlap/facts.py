"""Overlapped speculation's typed facts: a round's (LapRecord.facts of its "overlap" laps) and the run's (its
RunSummary part)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class OverlapRound(LapFacts):
    """A verified round of overlapped speculation (agents.modes.overlap). Its lap runs from the verdict before it to
    its own, so a run's laps tile its decode time; `lead_s` is when it left, from that previous verdict (negative: it
    was on the ring before that verdict came), `lap_s` its own lap, send to verdict."""

    k: int
    window: int
    accepted: int
    hit: bool  # all K accepted, and the target's next token was the guess the round after it was drafted from
    run: int  # the stretch of rounds between two misses it belongs to
    index: int  # its place in the run (0: drafted from the verified sequence after a miss)
    draft_s: float  # the draft passes held for it: K (index 0), or the guess and K
    draft_real_s: float
    passes: int
    overlap_sum: float  # sum over its drafts of sum_x min(p, q)
    lead_s: float
    lap_s: float
    in_flight: int  # rounds on the ring when it left, itself included
    dropped: int = 0  # a miss: the rounds drafted after it that were let go (sent or waiting)

    def draft_time_s(self) -> float:
        """What LapRecord's residual takes off besides compute and ring: the time from the previous verdict to its
        send, so the residual is the lap's own overhead."""
        return self.lead_s


@dataclass(frozen=True)
class OverlapSummary(JsonRecord):
    """Overlapped speculation measured next to its closed form (physics.overlap_run_s, overlap_rate) and next to
    synchronous speculation's r_spec at the same K."""

    k: float  # the K of every round, or their mean when K varied (auto: each run's own)
    k_last: int
    k_auto: bool
    window: int
    draft: str
    rounds: int
    runs: int
    hits: int
    hit_rate: float  # h: the share of rounds whose verdict let the next round stand
    all_accepted_rate: float  # the share of rounds that accepted all K
    guess_rate: float | None  # of those, the share whose next token was the draft's guess
    gamma_measured: float  # tokens per verified round
    alpha: float  # mean sum_x min(p, q) over the drafts
    acceptance_per_position: tuple[float, ...]  # S_i: the share of rounds that accepted drafts 0..i
    draft_per_token_s: float  # c_d as held
    verify_compute_s: float  # C: the lap's compute, entry and head included
    t_ring_s: float
    lap_s: float  # a round's lap, send to verdict, measured (C + T_ring + the lap's overhead)
    queue_free: bool  # every stage's work for a round fits in (K + 1) c_d: no round waits behind another
    discarded: int  # rounds sent and dropped after a miss (their frames still crossed the ring)
    measured_tok_s: float
    predicted_tok_s: float  # tokens / sum over the runs of overlap_run_s (the realized run lengths)
    error_pct: float
    expected_tok_s: float  # overlap_rate(Gamma measured, h measured): the i.i.d. closed form
    bound_tok_s: float  # overlap_bound: the same as W grows without end
    sync_predicted_tok_s: float  # r_spec = Gamma / (K c_d + C + T_ring): synchronous speculation at these K
    gain_measured: float  # measured / sync_predicted
    gain_predicted: float  # expected / sync_predicted
    plain_predicted_tok_s: float  # 1 / (C + T_ring)

    @property
    def headline(self) -> tuple[float, float, float]:
        return self.measured_tok_s, self.predicted_tok_s, self.error_pct
