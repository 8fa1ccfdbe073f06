"""Prometheus metrics of a run: created by one function from a registry that is passed in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Buckets span LAN laps (sub-ms) to a global ring with speculation (~1 s).
LAP_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 1.0, 2.0, 5.0)
HOP_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
COMPUTE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
SPEC_MAX_POSITIONS = 32  # accepted-per-position labels are pre-created up to this K


@dataclass
class RunMetrics:
    """Every metric the testbed exports, all registered in one registry."""

    registry: CollectorRegistry
    lap_seconds: Histogram
    laps_total: Counter
    tokens_total: Counter
    stage_compute_seconds: Histogram
    hop_latency_seconds: Histogram
    hop_bytes_total: Counter
    hop_configured_latency_seconds: Gauge
    decode_rate_tokens_per_second: Gauge
    ring_latency_seconds: Gauge
    compute_seconds: Gauge
    spec_num_drafts_total: Counter
    spec_num_draft_tokens_total: Counter
    spec_num_accepted_tokens_total: Counter
    spec_num_accepted_tokens_per_pos_total: Counter
    spec_acceptance_rate: Gauge
    spec_gamma: Gauge
    spec_k: Gauge
    spec_draft_seconds: Histogram


def create_metrics(registry: CollectorRegistry, stages: list[str], hops: list[str]) -> RunMetrics:
    """Create (and pre-label) all metrics in `registry`.

    `stages` are stage names (label `stage`), `hops` are directed hop names like "0->1" (label `hop`).
    """
    m = RunMetrics(
        registry=registry,
        lap_seconds=Histogram(
            "testbed_lap_seconds", "Wall time of one lap around the ring (one token, or one speculation round)",
            ["kind"], buckets=LAP_BUCKETS_S, registry=registry),
        laps_total=Counter("testbed_laps_total", "Laps completed", ["kind"], registry=registry),
        tokens_total=Counter("testbed_tokens_total", "Tokens generated", ["kind"], registry=registry),
        stage_compute_seconds=Histogram(
            "testbed_stage_compute_seconds",
            "Per-lap compute of a stage: kind=real is the forward pass, kind=total includes emulated padding",
            ["stage", "kind"], buckets=COMPUTE_BUCKETS_S, registry=registry),
        hop_latency_seconds=Histogram(
            "testbed_hop_latency_seconds", "Measured one-way latency of a hop (send stamp to receive stamp)",
            ["hop"], buckets=HOP_BUCKETS_S, registry=registry),
        hop_bytes_total=Counter("testbed_hop_bytes_total", "Frame bytes sent over a hop", ["hop"], registry=registry),
        hop_configured_latency_seconds=Gauge(
            "testbed_hop_configured_latency_seconds", "Configured one-way latency of a hop", ["hop"],
            registry=registry),
        decode_rate_tokens_per_second=Gauge(
            "testbed_decode_rate_tokens_per_second",
            "Single-stream decode rate: kind=measured (tokens / wall time) or kind=predicted (the closed form)",
            ["kind"], registry=registry),
        ring_latency_seconds=Gauge(
            "testbed_ring_latency_seconds", "T_ring: kind=configured (sum of hop delays) or kind=measured",
            ["kind"], registry=registry),
        compute_seconds=Gauge(
            "testbed_compute_seconds", "C: mean per-lap compute summed over stages (kind=real or total)",
            ["kind"], registry=registry),
        spec_num_drafts_total=Counter(
            "testbed_spec_decode_num_drafts_total", "Speculation rounds (vLLM: spec_decode_num_drafts)",
            registry=registry),
        spec_num_draft_tokens_total=Counter(
            "testbed_spec_decode_num_draft_tokens_total", "Draft tokens proposed", registry=registry),
        spec_num_accepted_tokens_total=Counter(
            "testbed_spec_decode_num_accepted_tokens_total", "Draft tokens accepted", registry=registry),
        spec_num_accepted_tokens_per_pos_total=Counter(
            "testbed_spec_decode_num_accepted_tokens_per_pos_total",
            "Draft tokens accepted at each position of the round (0-based)", ["position"], registry=registry),
        spec_acceptance_rate=Gauge(
            "testbed_spec_acceptance_rate", "Estimated per-token acceptance rate alpha (E[sum min(p, q)])",
            registry=registry),
        spec_gamma=Gauge(
            "testbed_spec_gamma_tokens_per_round", "Tokens per round: kind=measured or kind=predicted Gamma(a,K)",
            ["kind"], registry=registry),
        spec_k=Gauge("testbed_spec_k", "Draft length K of the current round", registry=registry),
        spec_draft_seconds=Histogram(
            "testbed_spec_draft_seconds", "Time the draft spent proposing K tokens in one round",
            buckets=LAP_BUCKETS_S, registry=registry),
    )
    for stage in stages:
        for kind in ("real", "total"):
            m.stage_compute_seconds.labels(stage=stage, kind=kind)
    for hop in hops:
        m.hop_latency_seconds.labels(hop=hop)
        m.hop_bytes_total.labels(hop=hop)
        m.hop_configured_latency_seconds.labels(hop=hop)
    for kind in ("plain", "speculative"):
        m.lap_seconds.labels(kind=kind)
        m.laps_total.labels(kind=kind)
        m.tokens_total.labels(kind=kind)
    for kind in ("measured", "predicted"):
        m.decode_rate_tokens_per_second.labels(kind=kind)
        m.spec_gamma.labels(kind=kind)
    for kind in ("configured", "measured"):
        m.ring_latency_seconds.labels(kind=kind)
    for kind in ("real", "total"):
        m.compute_seconds.labels(kind=kind)
    for position in range(SPEC_MAX_POSITIONS):
        m.spec_num_accepted_tokens_per_pos_total.labels(position=str(position))
    return m


def serve(registry: CollectorRegistry, port: int) -> tuple[str, int]:
    """Start the exporter on 127.0.0.1 (port 0 picks a free one); returns the bound address."""
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    host, bound_port = server.server_address[:2]
    return host, bound_port


def exported_metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry exports (e.g. testbed_lap_seconds_bucket, testbed_tokens_total)."""
    names = set()
    for family in registry.collect():
        for sample in family.samples:
            names.add(sample.name)
    return names
