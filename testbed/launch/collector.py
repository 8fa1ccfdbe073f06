"""Prometheus export: a custom collector that reads the run logs when Prometheus scrapes (nothing pushed per lap).

Counters and histograms add up over every phase served by one exporter (they never go backwards); gauges
describe the current phase. Exact hop-latency quantiles are exported as gauges next to the histogram:
histogram_quantile interpolates inside a bucket, so the gauges are what to plot or alert on.

A mode's own families (speculation's with vLLM's names, the streams mode's) come from its part of the run log
(testbed.launch.runlog.lap_parts: each part's `metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from agents.modes import MODES
from testbed.launch import predict
from testbed.launch.histogram import merge as _merge
from testbed.launch.runlog import RunLog, lap_parts
from testbed.launch.weights import weights_metrics
from testbed.scenario.config import Scenario

QUANTILES = {"p50": 50, "p99": 99}


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
        for part in lap_parts():
            yield from part.metrics(logs, current)
        yield from weights_metrics(current.weights)

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
        window_laps = GaugeMetricFamily("testbed_hop_latency_window_laps",
                                        "How many recent decode laps the exact hop-latency quantiles are over",
                                        labels=["hop"])
        for i, link in enumerate(current.scenario.ring):
            buckets, total = _merge([log.hops[i].latency for log in logs])
            hop_latency.add_metric([link.name], buckets, total)
            hop_bytes.add_metric([link.name], sum(log.hops[i].bytes_total for log in logs))
            configured.add_metric([link.name], link.delay_ms / 1e3)
            window = tuple(current.hops[i].window)  # one snapshot: laps go on arriving while Prometheus scrapes
            if window:
                values = np.percentile(np.array(window, float), list(QUANTILES.values()))
                for (name, _q), value in zip(QUANTILES.items(), values):
                    quantile_gauges[name].add_metric([link.name], float(value))
                window_laps.add_metric([link.name], len(window))
        yield from (hop_latency, hop_bytes, configured, *quantile_gauges.values(), window_laps)

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


def serve(registry: CollectorRegistry, port: int) -> tuple[str, int]:
    """Start the exporter on 127.0.0.1 (port 0 picks a free one); returns the bound address."""
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    host, bound_port = server.server_address[:2]
    return host, bound_port


def exported_metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry exports (e.g. testbed_lap_seconds_bucket, testbed_tokens_total)."""
    return {sample.name for family in registry.collect() for sample in family.samples}
