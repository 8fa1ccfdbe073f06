"""Prometheus export of the streams mode: laps of M streams in flight with known timings, read back at scrape time.

The laps are built as the streams mode reports them (head None, the lap ends where the entry takes the frame
up, Stamp.batch set) for two steady states whose figures follow from the construction alone:

- batching none, saturated: the frames form a train spaced by the slowest stage c_0, so every stream laps in
  M c_0, the ring carries 1 / c_0 tokens/s, and each frame waits M c_0 - (C + T_ring) at the entry;
- continuous batching: all M frames travel as one convoy, each stage runs them as one pass of c_i + p_i (M - 1).
"""

from __future__ import annotations

from typing import Final

import pytest
from prometheus_client import CollectorRegistry

from agents.modes.streams.metrics import STREAMS_WINDOW_LAPS_PER_STREAM
from testbed.core.records import LapRecord, Stamp
from testbed.launch.collector import RunCollector
from testbed.launch.runlog import RunLog
from testbed.scenario.config import scenario_from_dict
from tests.fakes import fake_lap, fake_scenario

STAGES: Final = ("entry", "middle", "last")
STAGE_COMPUTE_S: Final = (0.010, 0.006, 0.008)  # the entry is the bottleneck
PER_TOKEN_S: Final = 0.001  # continuous batching: the marginal cost of one more frame in a pass
HOP_S: Final = 0.005
T_RING_S: Final = 3 * HOP_S
TOKENS: Final = 10  # per stream: one from the prefill, the rest from decode laps
REAL_S: Final = 0.0005


def streams_scenario(streams: int, batching: str):
    return scenario_from_dict({
        "name": f"streams-{batching}",
        "decode": {"mode": "streams", "streams": streams, "batching": batching, "tokens": TOKENS},
        "stages": [{"name": name, "compute_ms": c * 1e3, "per_token_ms": PER_TOKEN_S * 1e3}
                   for name, c in zip(STAGES, STAGE_COMPUTE_S)],
        "network": {"hops_ms": [HOP_S * 1e3] * 3}}, "<test>")


def streams_lap(lap: int, stream: int, start: float, end: float, pass_s: tuple[float, ...], batch: int,
                kind: str = "decode") -> LapRecord:
    """One lap of one stream: each stage computes pass_s[i] as soon as the frame arrives, each hop takes HOP_S."""
    t, stamps = start, []
    for i, compute_s in enumerate(pass_s):
        stamps.append(Stamp(i, t, t, t + REAL_S, t + compute_s, t + compute_s, 560, batch=batch))
        t += compute_s + HOP_S
    return LapRecord(lap, kind, "streams", 1, 1, start, end, tuple(stamps), t, None, (65,), stream=stream)


def prefills(streams: int) -> list[LapRecord]:
    return [streams_lap(s, s, -1.0 + 0.1 * s, -0.95 + 0.1 * s, STAGE_COMPUTE_S, 1, kind="prefill")
            for s in range(streams)]


def train_laps(streams: int) -> list[LapRecord]:
    """batching none: the k-th lap of stream s starts at (k M + s) c_0 and ends M c_0 later, in end order."""
    c0, laps = STAGE_COMPUTE_S[0], []
    for k in range(TOKENS - 1):
        for s in range(streams):
            start = (k * streams + s) * c0
            laps.append(streams_lap(streams + len(laps), s, start, start + streams * c0, STAGE_COMPUTE_S, 1))
    return laps


def convoy_laps(streams: int) -> list[LapRecord]:
    """Continuous batching: every lap k of every stream starts at k * lap_s, each pass batched over all M."""
    pass_s = tuple(c + PER_TOKEN_S * (streams - 1) for c in STAGE_COMPUTE_S)
    lap_s = sum(pass_s) + T_RING_S
    return [streams_lap(streams + k * streams + s, s, k * lap_s, (k + 1) * lap_s, pass_s, streams)
            for k in range(TOKENS - 1) for s in range(streams)]


def scraped(log: RunLog) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    return registry


def test_a_saturated_train_exports_its_rates_queues_and_utilization():
    m = 6
    log = RunLog(streams_scenario(m, "none"))
    for lap in prefills(m):
        log.add_lap(lap)
    registry = scraped(log)
    assert registry.get_sample_value("testbed_streams_in_flight") == m
    assert registry.get_sample_value("testbed_streams_aggregate_tokens_per_second", {"kind": "measured"}) is None
    decode = train_laps(m)
    for lap in decode:
        log.add_lap(lap)

    c0 = STAGE_COMPUTE_S[0]
    value = registry.get_sample_value
    assert value("testbed_streams_in_flight") == 0
    assert value("testbed_streams_aggregate_tokens_per_second", {"kind": "measured"}) == pytest.approx(1 / c0)
    # min(M / (C + T_ring), 1 / c_max): 6 / 39 ms is more than the entry can serve
    assert value("testbed_streams_aggregate_tokens_per_second", {"kind": "predicted"}) == pytest.approx(1 / c0)
    assert value("testbed_stream_rate_predicted_tokens_per_second") == pytest.approx(1 / (m * c0))
    entry_wait_s = m * c0 - (sum(STAGE_COMPUTE_S) + T_RING_S)
    for stage, compute_s, wait_s in zip(STAGES, STAGE_COMPUTE_S, (entry_wait_s, 0.0, 0.0)):
        for kind in ("measured", "predicted"):
            assert value("testbed_stage_utilization_ratio", {"stage": stage, "kind": kind}) == \
                pytest.approx(compute_s / c0), (stage, kind)
        assert value("testbed_stage_batch_frames", {"stage": stage}) == pytest.approx(1.0)
        assert value("testbed_stage_queue_seconds_count", {"stage": stage}) == len(decode)
        assert value("testbed_stage_queue_seconds_sum", {"stage": stage}) == pytest.approx(len(decode) * wait_s)
    # each decode lap is one observation of its stream's rate, 1 / (M c_0)
    assert value("testbed_stream_rate_tokens_per_second_count") == len(decode)
    assert value("testbed_stream_rate_tokens_per_second_sum") == pytest.approx(len(decode) / (m * c0))
    assert value("testbed_stream_rate_tokens_per_second_bucket", {"le": "10.0"}) == 0
    assert value("testbed_stream_rate_tokens_per_second_bucket", {"le": "20.0"}) == len(decode)


def test_a_batched_convoy_exports_batches_and_the_batched_prediction():
    m = 4
    log = RunLog(streams_scenario(m, "continuous"))
    for lap in prefills(m) + convoy_laps(m):
        log.add_lap(lap)
    registry = scraped(log)

    pass_s = [c + PER_TOKEN_S * (m - 1) for c in STAGE_COMPUTE_S]
    lap_s = sum(pass_s) + T_RING_S
    value = registry.get_sample_value
    for kind in ("measured", "predicted"):
        assert value("testbed_streams_aggregate_tokens_per_second", {"kind": kind}) == pytest.approx(m / lap_s), kind
    assert value("testbed_stream_rate_predicted_tokens_per_second") == pytest.approx(1 / lap_s)
    for stage, stage_pass_s in zip(STAGES, pass_s):
        assert value("testbed_stage_batch_frames", {"stage": stage}) == pytest.approx(m)
        for kind in ("measured", "predicted"):
            assert value("testbed_stage_utilization_ratio", {"stage": stage, "kind": kind}) == \
                pytest.approx(stage_pass_s / lap_s), (stage, kind)
        assert value("testbed_stage_queue_seconds_sum", {"stage": stage}) == pytest.approx(0.0, abs=1e-12)


def test_gauges_follow_the_recent_window_not_the_whole_run():
    m = 2
    log = RunLog(streams_scenario(m, "none"))
    slow = [streams_lap(k, k % m, k * 1.0, k * 1.0 + 2.0, STAGE_COMPUTE_S, 1) for k in range(20)]
    fast_start = slow[-1].end
    fast = [streams_lap(20 + k, k % m, fast_start + k * 0.1, fast_start + k * 0.1 + 0.2, STAGE_COMPUTE_S, 1)
            for k in range(STREAMS_WINDOW_LAPS_PER_STREAM * m)]
    for lap in slow + fast:
        log.add_lap(lap)
    # the window holds only the fast laps: one ends every 0.1 s
    assert scraped(log).get_sample_value("testbed_streams_aggregate_tokens_per_second",
                                         {"kind": "measured"}) == pytest.approx(10.0)


def test_no_stream_label_and_no_streams_gauges_outside_the_streams_mode():
    log = RunLog(streams_scenario(3, "none"))
    for lap in prefills(3) + train_laps(3):
        log.add_lap(lap)
    labels = {name for family in scraped(log).collect() for sample in family.samples for name in sample.labels}
    assert "stream" not in labels
    plain = RunLog(fake_scenario("plain"))
    for i in range(10):
        plain.add_lap(fake_lap(i, i * 0.1, spec=False))
    registry = scraped(plain)
    assert registry.get_sample_value("testbed_streams_in_flight") is None
    assert registry.get_sample_value("testbed_stream_rate_tokens_per_second_count") == 0
    assert registry.get_sample_value("testbed_laps_total", {"kind": "plain"}) == 10
