"""Prometheus export: a custom collector that reads the run logs when Prometheus scrapes (nothing pushed per lap).

Counters and histograms add up over every phase served by one exporter (they never go backwards); gauges
describe the current phase. Exact hop-latency quantiles are exported as gauges next to the histogram:
histogram_quantile interpolates inside a bucket, so the gauges are what to plot or alert on.

The streams mode (M sequences in flight) never labels by stream (M is unbounded): its gauges are over the
current phase's latest STREAMS_WINDOW_LAPS_PER_STREAM x M decode laps (runlog.StreamsWindow), and its
histograms observe once per decode lap (a stream's rate over that lap: tokens / lap time; each stage's queueing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from testbed.run import predict
from testbed.core.decode import MODES
from testbed.run import runlog
from testbed.run.runlog import SPEC_MAX_POSITIONS, RunLog, RunningHistogram
from testbed.scenario.config import Scenario

QUANTILES = {"p50": 50, "p99": 99}


def _merge(histograms: Sequence[RunningHistogram]) -> tuple[list[tuple[str, int]], float]:
    """Buckets and sum of several histograms over the same bounds (the phases of one scenario)."""
    first = histograms[0]
    merged = RunningHistogram(first.bounds)
    for h in histograms:
        if h.bounds != first.bounds:
            raise ValueError("phases under one exporter must share their histogram buckets (same network)")
        merged.counts = [a + b for a, b in zip(merged.counts, h.counts)]
        merged.sum += h.sum
    return merged.buckets(), merged.sum


class RunCollector:
    """Yields every testbed metric from the run logs (the current phase last) at each scrape."""

    def __init__(self, logs: Callable[[], Sequence[RunLog]]) -> None:
        self.logs = logs

    def describe(self) -> list[Metric]:
        return []  # families depend on the scenario; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        logs = list(self.logs())
        if not logs:
            return
        current = logs[-1]
        yield from self._laps(logs, current)
        yield from self._compute(logs, current.scenario)
        yield from self._hops(logs, current)
        yield from self._rates(current)
        yield from self._speculation(logs, current)
        yield from self._streams(logs, current)

    def _laps(self, logs: Sequence[RunLog], current: RunLog) -> Iterator[Metric]:
        """Laps, tokens and lap time per mode kind, and the current phase's dilation."""
        kinds = sorted({info.metric_kind for info in MODES.values()})

        laps = CounterMetricFamily("testbed_laps", "Decode laps completed", labels=["kind"])
        tokens = CounterMetricFamily("testbed_tokens", "Tokens generated", labels=["kind"])
        lap_seconds = HistogramMetricFamily(
            "testbed_lap_seconds", "Wall time of one lap around the ring (one token, or one speculation round)",
            labels=["kind"])
        for kind in kinds:
            laps.add_metric([kind], sum(log.modes[kind].laps for log in logs))
            tokens.add_metric([kind], sum(log.modes[kind].tokens for log in logs))
            buckets, total = _merge([log.modes[kind].lap_seconds for log in logs])
            lap_seconds.add_metric([kind], buckets, total)
        yield from (laps, tokens, lap_seconds)
        # Every seconds figure above and below is in the scenario's time; Prometheus's rate() divides by the
        # box's seconds, so rate(testbed_tokens_total) * testbed_time_dilation is the scenario's token rate.
        yield GaugeMetricFamily("testbed_time_dilation", "Time dilation of the current phase (1 = none): the box runs "
                                "this many times slower than the scenario", value=current.dilation.factor
                                if current.dilation is not None else 1.0)

    def _compute(self, logs: Sequence[RunLog], sc: Scenario) -> Iterator[Metric]:
        compute = HistogramMetricFamily(
            "testbed_stage_compute_seconds",
            "Per-lap compute of a stage: kind=real is the forward pass, kind=total includes emulated padding",
            labels=["stage", "kind"])
        for i, stage in enumerate(sc.stages):
            for kind in ("real", "total"):
                parts = [log.stages[i].real if kind == "real" else log.stages[i].compute for log in logs]
                buckets, total = _merge(parts)
                compute.add_metric([stage.name, kind], buckets, total)
        yield compute

    def _hops(self, logs: Sequence[RunLog], current: RunLog) -> Iterator[Metric]:
        """Per hop: latency histogram, bytes, configured latency, and the exact recent percentiles."""
        hop_latency = HistogramMetricFamily(
            "testbed_hop_latency_seconds", "Measured one-way latency of a hop (send stamp to receive stamp)",
            labels=["hop"])
        hop_bytes = CounterMetricFamily("testbed_hop_bytes", "Frame bytes sent over a hop", labels=["hop"])
        configured = GaugeMetricFamily("testbed_hop_configured_latency_seconds", "Configured one-way latency of a hop",
                                       labels=["hop"])
        quantile_gauges = {
            name: GaugeMetricFamily(f"testbed_hop_latency_{name}_seconds",
                                    f"Exact {q}th percentile of a hop's one-way latency over the current phase's "
                                    f"recent decode laps (plot and alert on this, not on histogram_quantile)",
                                    labels=["hop"])
            for name, q in QUANTILES.items()}
        for i, link in enumerate(current.scenario.ring):
            buckets, total = _merge([log.hops[i].latency for log in logs])
            hop_latency.add_metric([link.name], buckets, total)
            hop_bytes.add_metric([link.name], sum(log.hops[i].bytes_total for log in logs))
            configured.add_metric([link.name], link.delay_ms / 1e3)
            window = current.hops[i].window
            if window:
                values = np.percentile(np.fromiter(window, float), list(QUANTILES.values()))
                for (name, _q), value in zip(QUANTILES.items(), values):
                    quantile_gauges[name].add_metric([link.name], float(value))
        yield from (hop_latency, hop_bytes, configured, *quantile_gauges.values())

    def _rates(self, current: RunLog) -> Iterator[Metric]:
        """The wall's figures: measured and predicted rate, T_ring, C."""
        rate = GaugeMetricFamily("testbed_decode_rate_tokens_per_second",
                                 "Decode rate: kind=measured (tokens / wall time) or kind=predicted (the closed form)",
                                 labels=["kind"])
        ring = GaugeMetricFamily("testbed_ring_latency_seconds",
                                 "T_ring: kind=configured (sum of hop delays) or kind=measured", labels=["kind"])
        mean_compute = GaugeMetricFamily("testbed_compute_seconds",
                                         "C: mean per-lap compute summed over stages (kind=real or total)",
                                         labels=["kind"])
        ring.add_metric(["configured"], current.scenario.t_ring_s)
        for gauge, kind, value in ((rate, "measured", current.measured_tok_s),
                                   (rate, "predicted", predict.predicted_tok_s(current)),
                                   (ring, "measured", current.mean_ring_s),
                                   (mean_compute, "total", current.mean_compute_s),
                                   (mean_compute, "real", current.mean_real_s)):
            if value is not None:
                gauge.add_metric([kind], value)
        yield from (rate, ring, mean_compute)

    def _speculation(self, logs: Sequence[RunLog], current: RunLog) -> Iterator[Metric]:
        """Speculation counters with vLLM's names (spec_decode_num_drafts, ...), and its gauges."""
        for name, attribute, doc in (
                ("testbed_spec_decode_num_drafts", "spec_rounds", "Speculation rounds (vLLM: spec_decode_num_drafts)"),
                ("testbed_spec_decode_num_draft_tokens", "spec_draft_tokens", "Draft tokens proposed"),
                ("testbed_spec_decode_num_accepted_tokens", "spec_accepted_tokens", "Draft tokens accepted")):
            yield CounterMetricFamily(name, doc, value=sum(getattr(log, attribute) for log in logs))
        per_position = CounterMetricFamily("testbed_spec_decode_num_accepted_tokens_per_pos",
                                           "Draft tokens accepted at each position of the round (0-based)",
                                           labels=["position"])
        for position in range(SPEC_MAX_POSITIONS):
            per_position.add_metric([str(position)], sum(log.spec_accepted_per_position[position] for log in logs))
        yield per_position
        buckets, total = _merge([log.spec_draft_seconds for log in logs])
        draft = HistogramMetricFamily("testbed_spec_draft_seconds",
                                      "Time the draft spent proposing K tokens in one round")
        draft.add_metric([], buckets, total)
        yield draft
        alpha = GaugeMetricFamily("testbed_spec_acceptance_rate",
                                  "Estimated per-token acceptance rate alpha (E[sum min(p, q)])")
        gamma = GaugeMetricFamily("testbed_spec_gamma_tokens_per_round",
                                  "Tokens per round: kind=measured or kind=predicted Gamma(a,K)", labels=["kind"])
        k = GaugeMetricFamily("testbed_spec_k", "Draft length K of the latest round")
        if current.spec_rounds:
            alpha.add_metric([], current.spec_alpha)
            gamma.add_metric(["measured"], current.spec_gamma_measured)
            gamma.add_metric(["predicted"], predict.spec_gamma_predicted(current))
            k.add_metric([], current.spec_last_k)
        yield from (alpha, gamma, k)

    def _streams(self, logs: Sequence[RunLog], current: RunLog) -> Iterator[Metric]:
        """Streams mode: histograms over every phase, gauges of the current phase's recent laps (streams only)."""
        stages = [stage.name for stage in current.scenario.stages]
        buckets, total = _merge([log.stream_rate for log in logs])
        rate = HistogramMetricFamily("testbed_stream_rate_tokens_per_second",
                                     "Streams mode: one stream's decode rate over one lap (tokens / lap time), "
                                     "observed once per decode lap")
        rate.add_metric([], buckets, total)
        queue = HistogramMetricFamily("testbed_stage_queue_seconds",
                                      "Streams mode: how long a frame waited at a stage before its forward pass",
                                      labels=["stage"])
        for i, stage in enumerate(stages):
            buckets, total = _merge([log.stage_queue[i] for log in logs])
            queue.add_metric([stage], buckets, total)
        yield from (rate, queue)
        if not runlog.per_stream(current.scenario.decode.mode):
            return
        yield GaugeMetricFamily("testbed_streams_in_flight", "Streams mode: streams still decoding (decode.streams "
                                "less those that produced all their tokens)", value=current.streams_in_flight)
        window = current.streams_window()
        if window is None:
            return
        per_stream, aggregate, busy = predict.streams_rates(current, window)
        rates = GaugeMetricFamily("testbed_streams_aggregate_tokens_per_second",
                                  "Streams mode: tokens/s of all streams together over the recent laps, kind=measured "
                                  "or kind=predicted (physics.streams_rates)", labels=["kind"])
        rates.add_metric(["measured"], window.aggregate_tok_s)
        rates.add_metric(["predicted"], aggregate)
        yield rates
        yield GaugeMetricFamily("testbed_stream_rate_predicted_tokens_per_second",
                                "Streams mode: predicted decode rate of one stream (aggregate / M)", value=per_stream)
        utilization = GaugeMetricFamily("testbed_stage_utilization_ratio",
                                        "Streams mode: share of the recent laps' time a stage computed, kind=measured "
                                        "or kind=predicted", labels=["stage", "kind"])
        batch = GaugeMetricFamily("testbed_stage_batch_frames",
                                  "Streams mode: mean frames per forward pass of a stage over the recent laps",
                                  labels=["stage"])
        for stage, measured, predicted, frames in zip(stages, window.stage_busy, busy, window.stage_batch_mean):
            utilization.add_metric([stage, "measured"], measured)
            utilization.add_metric([stage, "predicted"], predicted)
            batch.add_metric([stage], frames)
        yield from (utilization, batch)


def serve(registry: CollectorRegistry, port: int) -> tuple[str, int]:
    """Start the exporter on 127.0.0.1 (port 0 picks a free one); returns the bound address."""
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    host, bound_port = server.server_address[:2]
    return host, bound_port


def exported_metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry exports (e.g. testbed_lap_seconds_bucket, testbed_tokens_total)."""
    return {sample.name for family in registry.collect() for sample in family.samples}
