"""The serve mode's typed facts: what a lap tells of the requests (ServeLap: those that ended in it, how many run
and wait), and the mode's part of RunSummary (ServeSummary: vLLM's figures of every request beside the predictions)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agents.modes.serve.requests import RequestRecord
from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


def scaled_record(record: RequestRecord, factor: float) -> RequestRecord:
    """A request's record on a clock `factor` times as fast (a dilated run's records, back in scenario time)."""
    def at(t: float | None) -> float | None:
        return None if t is None else t * factor

    return dataclasses.replace(record, arrival=record.arrival * factor, admitted=at(record.admitted),
                               first_token=at(record.first_token),
                               token_times=tuple(t * factor for t in record.token_times), finished=at(record.finished))


@dataclass(frozen=True)
class ServingMetrics(JsonRecord):
    """A serving run's figures under vLLM's benchmark names (times in ms, throughputs per second of duration)."""

    completed: int
    aborted: int
    total_input_tokens: int  # prompt tokens of the completed requests
    total_output_tokens: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    p90_e2el_ms: float
    p99_e2el_ms: float
    mean_queue_ms: float  # admitted - arrival: the wait for a slot in the ring
    median_queue_ms: float
    std_queue_ms: float
    p90_queue_ms: float
    p99_queue_ms: float
    request_goodput: float | None = None  # good requests / duration (req/s), with a Goodput
    slo_attainment_pct: float | None = None  # good requests / every request (aborted ones are not good)


@dataclass(frozen=True)
class Prediction(JsonRecord):
    """The model's figures for one workload at one rate (ms, requests/s, tokens/s), named as ServingMetrics'."""

    rate_req_s: float
    knee_rate_req_s: float
    regime: str  # "below the knee" | "above the knee"
    offered_load: float  # a = lambda E[S]: mean requests holding a slot (above the knee: the cap)
    running_mean: float  # the convoy a decoding request rides in, mean (itself included)
    wait_probability: float  # a request waits for a slot
    lap_ms: float  # tau: the mean decode lap
    mean_ttft_ms: float
    median_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    p90_e2el_ms: float
    p99_e2el_ms: float
    mean_queue_ms: float
    median_queue_ms: float
    p90_queue_ms: float
    p99_queue_ms: float
    duration_s: float
    request_throughput: float
    output_throughput: float
    saturation_output_tok_s: float


@dataclass(frozen=True)
class ServeLap(LapFacts):
    """On the first lap the entry reports after each of its steps: the requests that ended in that step (each
    once in the run: completed or aborted), and how many were running (admitted, not ended) and waiting in the
    queue when the step's frames left."""

    ended: tuple[RequestRecord, ...] = ()
    running: int = 0
    waiting: int = 0

    def time_scaled(self, factor: float) -> ServeLap:
        return dataclasses.replace(self, ended=tuple(scaled_record(r, factor) for r in self.ended))


@dataclass(frozen=True)
class ServeSummary(JsonRecord):
    """A serving run: its workload, the measured figures of its requests under vLLM's names (agents.modes.serve.slo)
    beside the predictions (the wall and Eq. 5 at light load, the queueing model between, the streams ceiling at
    saturation), and every request's record (the study writes them as JSON lines)."""

    workload: str  # what was served: arrivals, lengths, count, seed, concurrency cap
    cap: int  # requests in the ring at once at most (decode.streams, workload.max_concurrency, or the KV budget)
    measured: ServingMetrics
    wall_tpot_ms: float  # a request alone: a token a lap, C + T_ring
    light_ttft_ms: float  # a request alone, the workload's mean prompt: Eq. 5, C_prefill(P) + T_ring
    ceiling_tok_s: float  # cap requests in one convoy: cap / (sum_i [c_i + p_i (cap - 1)] + T_ring)
    predicted: Prediction | None  # the queueing model (agents.modes.serve.queueing): the requests as they ran
    records: tuple[RequestRecord, ...] = ()
    running: int = 0  # requests in the ring at the entry's latest step (live: the dashboard's)
    waiting: int = 0  # and in its queue
    kv_positions: int = 0  # K and V positions the ring's memory holds (Scenario.kv_positions; 0: no budget)
    tokens_per_lap: float = 1.0  # Gamma: a request's tokens a lap after its first (decode.speculate; 1: plain)

    @property
    def headline(self) -> tuple[float, float | None, float | None]:
        """(measured, predicted, error %) of the run's headline: output tokens a second."""
        measured = self.measured.output_throughput
        predicted = self.predicted.output_throughput if self.predicted is not None else None
        error = (measured / predicted - 1) * 100 if predicted else None
        return measured, predicted, error
