"""The serve mode's part of the run log (ServeRequests: every request record its laps carried, the latest running
and waiting counts, O(1) a record) and its Prometheus families under vLLM's names, so existing Grafana boards work.

vLLM's families: the gauges vllm:num_requests_running / vllm:num_requests_waiting; the histograms
vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds (and its newer name,
vllm:inter_token_latency_seconds: every gap between a request's tokens), vllm:e2e_request_latency_seconds,
vllm:request_queue_time_seconds; the counters vllm:prompt_tokens_total, vllm:generation_tokens_total and
vllm:request_success_total (label finished_reason: "length", or "abort"). Each is labelled model_name, as vLLM's
are. A histogram observes a request when it ends (its record is the one source of its figures); the generation
counter counts every token as its lap reports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from agents.modes.serve.facts import ServeLap
from agents.modes.serve.requests import RequestRecord
from testbed.core.records import LapRecord
from testbed.launch.histogram import RunningHistogram, merge
from testbed.scenario.config import Scenario

# vLLM's own bucket bounds (vllm/v1/metrics/loggers.py), seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


class ServeRequests:
    """Every request record the run's laps carried (ServeLap.ended), by request index; the running and waiting
    counts of the latest step; the histograms and counters vLLM exports."""

    name = "serve"

    def __init__(self, scenario: Scenario, lap_buckets: tuple[float, ...], compute_buckets: tuple[float, ...]) -> None:
        self.scenario = scenario
        self.records: dict[int, RequestRecord] = {}
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = {"length": 0, "abort": 0}
        self.ttft = RunningHistogram(TTFT_BUCKETS)
        self.tpot = RunningHistogram(TPOT_BUCKETS)
        self.itl = RunningHistogram(TPOT_BUCKETS)
        self.e2e = RunningHistogram(LATENCY_BUCKETS)
        self.queue = RunningHistogram(LATENCY_BUCKETS)

    def add(self, records: list[LapRecord], compute: list[float], decode: bool) -> None:
        """Laps of the run (RunLog.add_laps): the serve mode's tokens, and the records and counts its facts carry."""
        if records[0].mode != "serve":
            return
        for lap in records:
            self.generation_tokens += lap.tokens
            facts = lap.facts
            if isinstance(facts, ServeLap):
                self.running, self.waiting = facts.running, facts.waiting
                for record in facts.ended:
                    if record.index not in self.records:
                        self.observe(record)

    def observe(self, record: RequestRecord) -> None:
        self.records[record.index] = record
        self.prompt_tokens += record.prompt_tokens
        self.finished["abort" if record.aborted else "length"] += 1
        if record.admitted is not None:
            self.queue.observe(record.admitted - record.arrival)
        if record.first_token is not None:
            self.ttft.observe(record.first_token - record.arrival)
        if record.finished is not None:
            self.e2e.observe(record.finished - record.arrival)
        if record.completed and len(record.token_times) > 1:
            times = record.token_times
            self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))
            for before, after in zip(times, times[1:]):
                self.itl.observe(after - before)

    @staticmethod
    def metrics(logs: Sequence[Any], current: Any) -> Iterator[Metric]:
        """Counters and histograms over every phase's run log (`logs`, the current phase's last); the gauges of the
        current phase (a serve run only)."""
        parts: list[ServeRequests] = [log.parts[ServeRequests.name] for log in logs]
        now: ServeRequests = current.parts[ServeRequests.name]
        model = [current.scenario.model]
        if current.scenario.decode.mode == "serve":
            for name, value, what in (("running", now.running, "Requests in the ring (prefilling or decoding)"),
                                      ("waiting", now.waiting, "Requests waiting in the entry's queue")):
                gauge = GaugeMetricFamily(f"vllm:num_requests_{name}", f"{what}, at the entry's latest step",
                                          labels=["model_name"])
                gauge.add_metric(model, value)
                yield gauge
        for name, attribute, what in (
                ("vllm:time_to_first_token_seconds", "ttft", "Time to first token: arrival to first token"),
                ("vllm:time_per_output_token_seconds", "tpot", "Time per output token after the first, per request"),
                ("vllm:inter_token_latency_seconds", "itl", "Every gap between consecutive tokens of a request"),
                ("vllm:e2e_request_latency_seconds", "e2e", "End-to-end request latency: arrival to last token"),
                ("vllm:request_queue_time_seconds", "queue", "Time a request waited in the queue for a slot")):
            buckets, total = merge([getattr(part, attribute) for part in parts])
            histogram = HistogramMetricFamily(name, what, labels=["model_name"])
            histogram.add_metric(model, buckets, total)
            yield histogram
        for name, attribute, what in (("vllm:prompt_tokens", "prompt_tokens", "Prompt tokens of ended requests"),
                                      ("vllm:generation_tokens", "generation_tokens", "Generated tokens")):
            counter = CounterMetricFamily(name, what, labels=["model_name"])
            counter.add_metric(model, sum(getattr(part, attribute) for part in parts))
            yield counter
        success = CounterMetricFamily("vllm:request_success", "Requests ended, by why (length: their output "
                                      "length; abort: their client went away)", labels=["model_name", "finished_reason"])
        for reason in ("length", "abort"):
            success.add_metric(model + [reason], sum(part.finished[reason] for part in parts))
        yield success


PART = ServeRequests  # its part of the run log (testbed.launch.runlog.lap_parts)
