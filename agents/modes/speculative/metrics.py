"""Speculation's part of the run log (SpecRounds: O(1) per round) and its Prometheus families, with vLLM's names."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from agents.modes.speculative.facts import SpecRound
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.launch.histogram import RunningHistogram, merge
from testbed.scenario.config import Scenario

SPEC_MAX_POSITIONS = 32  # accepted-per-position counters exist up to this K


@dataclass
class RoundTotals:
    """Speculation rounds (all of a phase's, or those at one K): the sums their rates are figured from."""

    rounds: int = 0
    tokens: int = 0  # tokens the rounds produced (accepted drafts + one each)
    drafted: int = 0  # sum of K over the rounds
    draft_s: float = 0.0
    compute_s: float = 0.0
    duration_s: float = 0.0

    def add(self, lap: LapRecord, compute_s: float) -> None:
        self.rounds += 1
        self.tokens += lap.tokens
        self.drafted += lap.facts.k
        self.draft_s += lap.facts.draft_s
        self.compute_s += compute_s
        self.duration_s += lap.duration_s


class SpecRounds:
    """Every speculation round of a phase (laps of kind "spec": the speculative mode's, an edge client's), running:
    what the Prometheus families export, and what summary.summarize_totals reads past the run log's window."""

    name = "spec"

    def __init__(self, scenario: Scenario, lap_buckets: tuple[float, ...], compute_buckets: tuple[float, ...]) -> None:
        self.overall = RoundTotals()
        self.by_k: dict[int, RoundTotals] = {}
        self.accepted_tokens = 0
        self.overlap_sum = 0.0
        self.drafted_per_position: list[int] = []  # rounds that drafted a token at each position (0-based)
        self.accepted_per_position: list[int] = []  # ... and had it accepted
        self.draft_seconds = RunningHistogram(lap_buckets)
        self.last_round: SpecRound | None = None  # the latest round's facts (its K, draft, k_auto)

    def add(self, records: list[LapRecord], compute: list[float], decode: bool) -> None:
        """Laps of the run (RunLog.add_laps; rounds when their kind is "spec": one at a time, never batched)."""
        for record in records:
            if record.kind == "spec":
                self._add(record, sum(compute))

    def _add(self, record: LapRecord, compute_s: float) -> None:
        facts = record.facts
        self.overall.add(record, compute_s)
        self.by_k.setdefault(facts.k, RoundTotals()).add(record, compute_s)
        self.accepted_tokens += facts.accepted
        self.overlap_sum += facts.overlap_sum
        if facts.k > len(self.drafted_per_position):
            grow = facts.k - len(self.drafted_per_position)
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for position in range(facts.k):
            self.drafted_per_position[position] += 1
            self.accepted_per_position[position] += int(position < facts.accepted)
        self.draft_seconds.observe(facts.draft_s)
        self.last_round = facts

    @property
    def rounds(self) -> int:
        return self.overall.rounds

    @property
    def draft_tokens(self) -> int:
        return self.overall.drafted

    @property
    def k_counts(self) -> dict[int, int]:
        """Rounds at each K."""
        return {k: totals.rounds for k, totals in self.by_k.items()}

    @property
    def alpha(self) -> float | None:
        return self.overlap_sum / self.draft_tokens if self.draft_tokens else None

    @property
    def gamma_measured(self) -> float | None:
        return self.overall.tokens / self.rounds if self.rounds else None

    def gamma_predicted(self) -> float | None:
        """Gamma(alpha_hat, K) averaged over the rounds' K (seed 000, Eq. 6)."""
        alpha = self.alpha
        if alpha is None:
            return None
        return physics.gamma_mean(alpha, self.k_counts)

    def predicted_tok_s(self, log: Any) -> float | None:
        """r_spec = Gamma / (K c_d + C + T_ring) with the measured Gamma, K c_d and C (seed 000, Eq. 7), once there
        are rounds: the run's headline prediction (testbed.launch.predict)."""
        totals = self.overall
        if not totals.rounds:
            return None
        n = totals.rounds
        return (totals.tokens / n) / (totals.draft_s / n + totals.compute_s / n + log.scenario.t_ring_s
                                      + log.serialization_s)

    @staticmethod
    def metrics(logs: Sequence[Any], current: Any) -> Iterator[Metric]:
        """Speculation counters with vLLM's names (spec_decode_num_drafts, ...) over every phase's run log (`logs`,
        testbed.launch.runlog.RunLog, the current phase's last), and the current phase's gauges."""
        parts: list[SpecRounds] = [log.parts[SpecRounds.name] for log in logs]
        for name, attribute, doc in (
                ("testbed_spec_decode_num_drafts", "rounds", "Speculation rounds (vLLM: spec_decode_num_drafts)"),
                ("testbed_spec_decode_num_draft_tokens", "draft_tokens", "Draft tokens proposed"),
                ("testbed_spec_decode_num_accepted_tokens", "accepted_tokens", "Draft tokens accepted")):
            yield CounterMetricFamily(name, doc, value=sum(getattr(part, attribute) for part in parts))
        per_position = CounterMetricFamily("testbed_spec_decode_num_accepted_tokens_per_pos",
                                           "Draft tokens accepted at each position of the round (0-based)",
                                           labels=["position"])
        for position in range(SPEC_MAX_POSITIONS):
            per_position.add_metric([str(position)], sum(part.accepted_per_position[position] for part in parts
                                                         if position < len(part.accepted_per_position)))
        yield per_position
        buckets, total = merge([part.draft_seconds for part in parts])
        draft = HistogramMetricFamily("testbed_spec_draft_seconds",
                                      "Time the draft spent proposing K tokens in one round")
        draft.add_metric([], buckets, total)
        yield draft
        alpha = GaugeMetricFamily("testbed_spec_acceptance_rate",
                                  "Estimated per-token acceptance rate alpha (E[sum min(p, q)])")
        gamma = GaugeMetricFamily("testbed_spec_gamma_tokens_per_round",
                                  "Tokens per round: kind=measured or kind=predicted Gamma(a,K)", labels=["kind"])
        k = GaugeMetricFamily("testbed_spec_k", "Draft length K of the latest round")
        now: SpecRounds = current.parts[SpecRounds.name]
        if now.rounds:
            alpha.add_metric([], now.alpha)
            gamma.add_metric(["measured"], now.gamma_measured)
            gamma.add_metric(["predicted"], now.gamma_predicted())
            k.add_metric([], now.last_round.k)
        yield from (alpha, gamma, k)


PART = SpecRounds  # its part of the run log (testbed.launch.runlog.lap_parts)
