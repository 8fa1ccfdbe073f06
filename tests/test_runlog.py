"""Run log -> summary and Prometheus export, on synthetic laps whose timings are known exactly."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from testbed.collector import RunCollector
from testbed.core.summary import RunSummary
from testbed.runlog import RunLog, latency_buckets
from testbed.summarize import summarize
from tests.fakes import (HOP_DELAYS_S, HOP_OVERHEAD_S, HOPS, SPEC_ACCEPTED, SPEC_DRAFT_S, SPEC_K, STAGE_COMPUTE_S,
                         fake_lap, fake_scenario)

LAPS = 50
C_S = 3 * STAGE_COMPUTE_S
T_RING_S = sum(HOP_DELAYS_S)
LAP_S = C_S + T_RING_S + 3 * HOP_OVERHEAD_S


def logged(mode: str, laps: int = LAPS) -> RunLog:
    log = RunLog(fake_scenario(mode))
    for i in range(laps):
        log.add_lap(fake_lap(i, i * 0.1, spec=mode == "speculative"))
    return log


def test_plain_summary_puts_the_measured_rate_next_to_the_wall():
    s = summarize(logged("plain"))
    assert s.tokens == s.laps == LAPS
    assert s.measured_tok_s == pytest.approx(1 / LAP_S)
    assert s.predicted_tok_s == pytest.approx(1 / (C_S + T_RING_S))  # the wall, from configured links
    assert s.compute_s == pytest.approx(C_S)
    assert s.t_ring_measured_s == pytest.approx(T_RING_S + 3 * HOP_OVERHEAD_S)
    for hop, delay in zip(s.per_hop, HOP_DELAYS_S):
        assert hop.measured_ms_p50 == pytest.approx((delay + HOP_OVERHEAD_S) * 1e3)
        assert hop.configured_ms == pytest.approx(delay * 1e3)
    assert s.overhead_ms_per_hop == pytest.approx(HOP_OVERHEAD_S * 1e3)
    assert s.text == "A" * LAPS


def test_speculative_summary_predicts_gamma_over_the_round():
    s = summarize(logged("speculative"))
    round_s = SPEC_DRAFT_S + C_S + T_RING_S
    assert s.spec.gamma_measured == pytest.approx(SPEC_ACCEPTED + 1)
    assert s.spec.k == SPEC_K and s.spec.rounds == LAPS
    assert s.predicted_tok_s == pytest.approx((SPEC_ACCEPTED + 1) / round_s)
    assert s.measured_tok_s == pytest.approx((SPEC_ACCEPTED + 1) / (round_s + 3 * HOP_OVERHEAD_S))
    assert s.spec.acceptance_per_position == pytest.approx((1.0, 1.0, 0.0, 0.0))


def test_summary_json_round_trips():
    s = summarize(logged("speculative"))
    assert RunSummary.from_json(s.to_json()) == s


def test_collector_reads_the_logs_at_scrape_time():
    plain, spec = logged("plain"), logged("speculative", 10)
    logs = [plain]
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: logs))
    assert registry.get_sample_value("testbed_laps_total", {"kind": "plain"}) == LAPS
    logs.append(spec)  # the next phase: counters add up, gauges follow the current phase
    assert registry.get_sample_value("testbed_laps_total", {"kind": "plain"}) == LAPS
    assert registry.get_sample_value("testbed_laps_total", {"kind": "speculative"}) == 10
    assert registry.get_sample_value("testbed_tokens_total", {"kind": "speculative"}) == 10 * (SPEC_ACCEPTED + 1)
    assert registry.get_sample_value("testbed_spec_decode_num_draft_tokens_total") == 10 * SPEC_K
    summary = summarize(spec)
    assert registry.get_sample_value("testbed_decode_rate_tokens_per_second", {"kind": "predicted"}) == \
        pytest.approx(summary.predicted_tok_s)
    for hop, name in zip(summary.per_hop, HOPS):
        p50 = registry.get_sample_value("testbed_hop_latency_p50_seconds", {"hop": name})
        assert p50 * 1e3 == pytest.approx(hop.measured_ms_p50)
        count = registry.get_sample_value("testbed_hop_latency_seconds_count", {"hop": name})
        assert count == LAPS + 10


def interpolated_quantile(buckets: tuple[float, ...], value: float) -> float:
    """What histogram_quantile(0.5) reads for a constant `value`: linear inside its bucket."""
    upper = next(b for b in buckets if b >= value)
    lower = max((b for b in buckets if b < value), default=0.0)
    return (lower + upper) / 2


@pytest.mark.parametrize("configured_s", [0.130, 0.040, 0.0113])
def test_run_buckets_resolve_the_configured_latency_to_half_a_percent(configured_s):
    buckets = latency_buckets([configured_s])
    assert interpolated_quantile(buckets, configured_s * 1.002) == pytest.approx(configured_s * 1.002, rel=0.005)
    # the old fixed buckets read a constant 130 ms as 125 ms
    assert interpolated_quantile((0.1, 0.15), 0.130) == pytest.approx(0.125)
