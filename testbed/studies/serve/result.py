"""The serve study's result: a row per request rate (vLLM's figures measured beside the queueing model's, and the
model's error per percentile), the search for the highest rate meeting the SLO, and the comparisons of issue 54.

Every figure of a row is computed from its run's request records (agents.modes.serve.slo.serving_metrics); the
records themselves go to the JSON lines beside the result (`serve-SCENARIO-requests.jsonl`), not into its JSON.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agents.modes.serve.queueing import Prediction
from agents.modes.serve.requests import RequestRecord
from agents.modes.serve.settings import ServeSettings
from agents.modes.serve.slo import ServingMetrics
from testbed.core.records import JsonRecord

PERCENTILES = (("p50", "median"), ("p99", "p99"))  # (the study's name, ServingMetrics' and Prediction's prefix)
LATENCIES = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class ModelError(JsonRecord):
    """The queueing model's own error against the run, per percentile: (predicted / measured - 1) x 100, as Vidur
    reports its simulator's error against real runs (the run is the reference; None where it measured 0)."""

    p50_ttft: float | None
    p99_ttft: float | None
    p50_tpot: float | None
    p99_tpot: float | None
    p50_e2el: float | None
    p99_e2el: float | None

    @classmethod
    def of(cls, measured: ServingMetrics, predicted: Prediction | None) -> ModelError | None:
        if predicted is None:
            return None
        errors = {}
        for name, prefix in PERCENTILES:
            for latency in LATENCIES:
                m = getattr(measured, f"{prefix}_{latency}_ms")
                p = getattr(predicted, f"{prefix}_{latency}_ms")
                errors[f"{name}_{latency}"] = (p / m - 1) * 100 if m > 0 else None
        return cls(**errors)


@dataclass(frozen=True)
class ServeRow(JsonRecord):
    """One request rate: one run. `met` is whether its SLO attainment reached the study's target (None: no
    --goodput). `records` are the run's requests (the API's result has them; the JSON leaves them to the JSON
    lines file)."""

    rate_req_s: float
    workload: str  # as the run names it (agents.modes.serve.summary.describe)
    measured: ServingMetrics
    predicted: Prediction | None
    model_error_pct: ModelError | None
    met: bool | None = None
    dilation: float = 1.0
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)
    records: tuple[RequestRecord, ...] = ()

    def figure(self, percentile: str, latency: str, predicted: bool = False) -> float | None:
        """A row's p50 or p99 of ttft, tpot or e2el in ms, measured or predicted (None: no prediction)."""
        prefix = dict(PERCENTILES)[percentile]
        source = self.predicted if predicted else self.measured
        return None if source is None else getattr(source, f"{prefix}_{latency}_ms")


@dataclass(frozen=True)
class ServeSearch(JsonRecord):
    """The search for the highest rate whose SLO attainment is at least the target: the bracket it ended with
    (the highest rate measured meeting it, the lowest measured missing it) and why it ended there."""

    target_pct: float
    knee_rate_req_s: float  # where it started: the queueing model's knee (agents.modes.serve.queueing.knee_rate)
    highest_met_req_s: float | None  # None: missed at every rate tried
    lowest_missed_req_s: float | None  # None: met at every rate tried
    runs: int
    reason: str


@dataclass(frozen=True)
class ServeVariant(JsonRecord):
    """One ring a comparison serves the workload on: its own T_ring and knee, its runs, its search if it ran one."""

    label: str
    t_ring_s: float
    compute_s: float
    knee_rate_req_s: float
    wall_tpot_ms: float
    rows: tuple[ServeRow, ...] = ()
    search: ServeSearch | None = None


@dataclass(frozen=True)
class Comparison(JsonRecord):
    """A comparison of issue 54 item 7, a row of the report: its variants, or (none measured) why not."""

    kind: str  # one of COMPARISONS
    title: str
    note: str  # what was compared at which rate, or why it could not be
    variants: tuple[ServeVariant, ...] = ()


COMPARISONS = ("colocated", "placement", "speculation", "backend")


@dataclass(frozen=True)
class ServeResult(JsonRecord):
    """`testbed serve`: a scenario served at each rate (serve_rows, by rate), the workload it served (its
    [workload] settings; the rate is each row's), the SLO and its target attainment, the ring's light-load
    figures, the search (--search) and the comparisons (--compare)."""

    scenario: str
    shaper: str
    stages: int
    t_ring_s: float
    compute_s: float  # C: the stages' emulated single-token passes
    cap: int  # requests in the ring at once at most
    settings: ServeSettings
    goodput: str  # the SLO targets as vLLM's --goodput ("" : none)
    attainment_target_pct: float
    wall_tpot_ms: float  # a request alone: C + T_ring
    light_ttft_ms: float  # a request alone, the workload's prompt: Eq. 5
    knee_rate_req_s: float
    ceiling_tok_s: float  # the streams ceiling: cap tokens per lap of cap
    serve_rows: tuple[ServeRow, ...]
    search: ServeSearch | None = None
    comparisons: tuple[Comparison, ...] = ()
    requests_jsonl: str = ""  # where every request's record went (written by the command)

    def without_records(self) -> ServeResult:
        """The result as its JSON holds it: every row without its request records."""
        def bare(rows: tuple[ServeRow, ...]) -> tuple[ServeRow, ...]:
            return tuple(dataclasses.replace(row, records=()) for row in rows)

        return dataclasses.replace(self, serve_rows=bare(self.serve_rows), comparisons=tuple(
            dataclasses.replace(c, variants=tuple(dataclasses.replace(v, rows=bare(v.rows)) for v in c.variants))
            for c in self.comparisons))
