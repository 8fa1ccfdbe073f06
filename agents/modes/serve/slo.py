"""vLLM's serving figures from the serve mode's request records: TTFT, TPOT, ITL, E2EL and queueing percentiles,
throughputs, goodput for --goodput targets (as `vllm bench serve` computes them: benchmarks/benchmark_serving.py).

Definitions (every latency over the completed requests only; aborted ones are counted apart):
TTFT = first_token - arrival; TPOT = (E2EL - TTFT) / (output_tokens - 1) for a request of more than one token;
ITL = every gap between consecutive token times of every completed request; E2EL = finished - arrival;
queueing = admitted - arrival; duration = the last finish - the first arrival, over every record;
throughputs = completed requests (their tokens) / duration; percentiles by numpy.percentile (linear), and a figure
with no sample (no request of more than one token has a TPOT) is 0, as vLLM reports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agents.modes.serve.facts import ServingMetrics
from agents.modes.serve.requests import RequestRecord
from testbed.core.jsonrecord import JsonRecord

TARGETS = ("ttft", "tpot", "e2el")
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")


@dataclass(frozen=True)
class Goodput(JsonRecord):
    """SLO targets in ms (vLLM's --goodput): a request is good when it meets every target given."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str | Sequence[str]) -> Goodput:
        """'ttft:300 tpot:50 e2el:2000' (any subset, at least one; also the list argparse's nargs='+' gives)."""
        parts = text.split() if isinstance(text, str) else [p for item in text for p in item.split()]
        if not parts:
            raise ValueError("goodput: expected at least one target as name:ms (ttft, tpot, e2el), got none")
        targets: dict[str, float] = {}
        for part in parts:
            name, colon, value = part.partition(":")
            if name not in TARGETS:
                raise ValueError(f"goodput: {part!r}: the target must be one of {', '.join(TARGETS)}")
            if name in targets:
                raise ValueError(f"goodput: {part!r}: {name} is given twice")
            try:
                ms = float(value) if colon else math.nan
            except ValueError:
                ms = math.nan
            if not (math.isfinite(ms) and ms >= 0):
                raise ValueError(f"goodput: {part!r}: expected {name}:MS with MS a number >= 0 (milliseconds)")
            targets[name] = ms
        return cls(**{f"{name}_ms": ms for name, ms in targets.items()})

    def good(self, record: RequestRecord) -> bool:
        """It completed and met every target given (a one-token request has no TPOT and meets its target)."""
        if not record.completed:
            return False
        figures = request_ms(record)
        if figures["tpot"] is None:
            figures["tpot"] = 0.0
        return all(target is None or (figures[name] is not None and figures[name] <= target)
                   for name, target in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms)))

    def __str__(self) -> str:
        return " ".join(f"{name}:{getattr(self, f'{name}_ms'):g}" for name in TARGETS
                        if getattr(self, f"{name}_ms") is not None)


def request_ms(record: RequestRecord) -> dict[str, float | None]:
    """One record's own figures in ms (None where it has none: no first token, one token, never admitted)."""
    def ms(end: float | None, start: float | None) -> float | None:
        return None if end is None or start is None else (end - start) * 1e3

    ttft, e2el = ms(record.first_token, record.arrival), ms(record.finished, record.arrival)
    tpot = None
    if record.completed and ttft is not None and e2el is not None and record.output_tokens > 1:
        tpot = (e2el - ttft) / (record.output_tokens - 1)
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el, "queue": ms(record.admitted, record.arrival)}


def serving_metrics(records: Sequence[RequestRecord], goodput: Goodput | None = None) -> ServingMetrics:
    if not records:
        raise ValueError("serving_metrics: no request records (the run served no request)")
    done = [r for r in records if r.completed]
    first = min(r.arrival for r in records)
    last = max((r.finished for r in records if r.finished is not None), default=first)
    duration = last - first
    samples: dict[str, list[float]] = {name: [] for name in LATENCIES}
    for record in done:
        for name, value in request_ms(record).items():
            if value is not None:
                samples[name].append(value)
        samples["itl"] += (np.diff(record.token_times) * 1e3).tolist()
    figures: dict[str, float] = {}
    for name, values in samples.items():
        data = np.asarray(values) if values else np.zeros(1)
        figures |= {f"mean_{name}_ms": float(np.mean(data)), f"median_{name}_ms": float(np.median(data)),
                    f"std_{name}_ms": float(np.std(data)), f"p90_{name}_ms": float(np.percentile(data, 90)),
                    f"p99_{name}_ms": float(np.percentile(data, 99))}
    per_s = 1.0 / duration if duration > 0 else 0.0
    inputs, outputs = sum(r.prompt_tokens for r in done), sum(r.output_tokens for r in done)
    good = sum(goodput.good(r) for r in records) if goodput is not None else None
    return ServingMetrics(
        completed=len(done), aborted=sum(r.aborted for r in records), total_input_tokens=inputs,
        total_output_tokens=outputs, duration_s=duration, request_throughput=len(done) * per_s,
        output_throughput=outputs * per_s, total_token_throughput=(inputs + outputs) * per_s,
        request_goodput=None if good is None else good * per_s,
        slo_attainment_pct=None if good is None else 100.0 * good / len(records), **figures)


_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency", "queue": "Queueing Time"}


def markdown_table(metrics: ServingMetrics) -> str:
    """The result as vLLM prints it (`Serving Benchmark Result`), as a markdown table for the study's report."""
    rows = [("Successful requests", f"{metrics.completed}"), ("Aborted requests", f"{metrics.aborted}"),
            ("Benchmark duration (s)", f"{metrics.duration_s:.2f}"),
            ("Total input tokens", f"{metrics.total_input_tokens}"),
            ("Total generated tokens", f"{metrics.total_output_tokens}"),
            ("Request throughput (req/s)", f"{metrics.request_throughput:.2f}")]
    if metrics.request_goodput is not None:
        rows += [("Request goodput (req/s)", f"{metrics.request_goodput:.2f}"),
                 ("SLO attainment (%)", f"{metrics.slo_attainment_pct:.1f}")]
    rows += [("Output token throughput (tok/s)", f"{metrics.output_throughput:.2f}"),
             ("Total token throughput (tok/s)", f"{metrics.total_token_throughput:.2f}")]
    for name, title in _TITLES.items():
        rows.append((f"**{title}**", ""))
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            rows.append((f"{label} {name.upper()} (ms)", f"{getattr(metrics, f'{stat}_{name}_ms'):.2f}"))
    return "\n".join(["| Metric | Value |", "|---|---:|"] + [f"| {name} | {value} |" for name, value in rows]) + "\n"


def per_request_lines(records: Sequence[RequestRecord]) -> str:
    """One JSON line per record, its own ttft/tpot/e2el/queue ms added (as `vllm bench serve --save-detailed`)."""
    return "".join(json.dumps(record.to_dict() | {f"{name}_ms": value for name, value in request_ms(record).items()})
                   + "\n" for record in records)
