"""Run log -> summary and Prometheus export, on synthetic laps whose timings are known exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from testbed.launch.collector import RunCollector
from testbed.core.facts import PrefillChunk
from agents.modes.speculative.facts import SpecRound
from testbed.core.lapstats import SKETCH_RELATIVE_ACCURACY, SKETCH_RESOLUTION, QuantileSketch
from testbed.core.records import LapRecord
from testbed.core.summary import RunSummary
from testbed.launch.runlog import RunLog, latency_buckets, read_lap_log
from testbed.launch.summarize import summarize
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


def test_a_lap_record_is_the_plain_data_asdict_gives_and_reads_back():
    """JsonRecord.to_dict/from_dict (a conversion planned once per type) against dataclasses.asdict and the
    record itself, on a lap with stamps, a head, ids and a mode's typed facts (under "extra", with their class's
    name); a bad field is still named, and so are facts of no known class or with a field they lack."""
    lap = dataclasses.replace(fake_lap(3, 0.3, spec=True), ids=(65, 66))
    plain = dataclasses.asdict(lap)
    plain["extra"] = {"facts": "SpecRound", **plain.pop("facts")}
    assert lap.to_dict() == plain and plain["extra"]["k"] == SPEC_K and plain["extra"]["draft_s"] == SPEC_DRAFT_S
    assert LapRecord.from_json(lap.to_json()) == lap and isinstance(LapRecord.from_json(lap.to_json()).facts, SpecRound)
    chunk = dataclasses.replace(lap, facts=PrefillChunk(1, 2))
    assert LapRecord.from_json(chunk.to_json()) == chunk and LapRecord.from_dict(fake_lap(1, 0.0, spec=False).to_dict()).facts is None
    data = lap.to_dict()
    data["stamps"][1]["colour"] = "red"
    with pytest.raises(ValueError, match=r"LapRecord.stamps\[1\]: unknown field\(s\) colour"):
        LapRecord.from_dict(data)
    for facts, message in (({"facts": "Gossip", "k": 4}, "facts 'Gossip' is not one of"),
                           ({"k": 4}, "facts None is not one of"),
                           ({**plain["extra"], "per_position": [1]}, r"\(SpecRound\): unknown field\(s\) per_position")):
        with pytest.raises(ValueError, match=message):
            LapRecord.from_dict({**lap.to_dict(), "extra": facts})


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
        # the quantiles' window is the current phase's decode laps only
        assert registry.get_sample_value("testbed_hop_latency_window_laps", {"hop": name}) == 10


def test_a_mode_s_part_of_the_run_log_comes_with_its_registry_line(monkeypatch):
    """The seam: a registered mode's metrics.PART is fed every lap by the run log (every mode's laps: this one counts
    speculation's tokens) and exports its own families through the collector; neither names it."""
    import agents.modes
    from tests import echo_mode

    monkeypatch.setitem(agents.modes.MODES, "echo", echo_mode.INFO)
    log = logged("speculative", 10)
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    assert registry.get_sample_value("testbed_echo_tokens_total") == 10 * (SPEC_ACCEPTED + 1) == log.decode_tokens
    assert registry.get_sample_value("testbed_spec_decode_num_drafts_total") == 10  # the shipped parts still export
    monkeypatch.delitem(agents.modes.MODES, "echo")
    assert "echoes" not in logged("speculative", 1).parts  # no line, no part


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


def varied(mode: str, laps: int, window_laps: int, **kwargs) -> RunLog:
    """A run of `laps` laps whose hops jitter and whose rounds vary K (to 5) and acceptance: a two-chunk prompt first."""
    log = RunLog(fake_scenario(mode), window_laps=window_laps, **kwargs)
    first = fake_lap(0, 0.0, spec=False)
    for chunk in range(2):
        log.add_lap(dataclasses.replace(first, kind="prefill", mode=mode, n_tok=16, ids=(),
                                        facts=PrefillChunk(chunk, 2)))
    for i in range(laps):
        lap = fake_lap(i, i * 0.1, spec=mode == "speculative")
        if mode == "speculative":
            k = 2 + i % 4
            lap = dataclasses.replace(lap, facts=dataclasses.replace(lap.facts, k=k, accepted=(i * 7) % (k + 1),
                                                                     overlap_sum=0.3 * k + 0.01 * (i % 5),
                                                                     draft_s=0.001 * k * (1 + 0.1 * (i % 3))))
        stamps = tuple(dataclasses.replace(s, recv=s.recv + 1e-4 * ((i * 13 + s.stage) % 10)) for s in lap.stamps)
        log.add_lap(dataclasses.replace(lap, stamps=stamps))
    return log


def assert_close(whole, windowed, path: str = "summary") -> None:
    """Equal but for rounding, and percentiles (in ms) within the sketch's accuracy, twice over."""
    if isinstance(whole, dict):
        assert whole.keys() == windowed.keys(), path
        for key in whole:
            assert_close(whole[key], windowed[key], f"{path}.{key}")
    elif isinstance(whole, list | tuple):
        assert len(whole) == len(windowed), path
        for i, (a, b) in enumerate(zip(whole, windowed)):
            assert_close(a, b, f"{path}[{i}]")
    elif isinstance(whole, float):
        if "_p" in path or "overhead" in path:
            assert windowed == pytest.approx(whole, rel=2 * SKETCH_RELATIVE_ACCURACY, abs=2 * SKETCH_RESOLUTION * 1e3), path
        else:
            assert windowed == pytest.approx(whole, rel=1e-9, abs=1e-12), path
    else:
        assert windowed == whole, path


@pytest.mark.parametrize("mode", ["plain", "speculative"])
def test_a_run_longer_than_the_window_is_summarized_over_every_lap(mode):
    laps = 600
    whole, windowed = varied(mode, laps, window_laps=10_000), varied(mode, laps, window_laps=64)
    assert whole.complete and not windowed.complete and len(windowed.laps) == 64
    a, b = (summarize(log).to_dict() for log in (whole, windowed))
    for summary in (a, b):
        del summary["history"]  # stamped with the launcher's clock
    assert b["laps"] == laps and b["ttft"]["chunks"] == 2 and len(b["text"]) == (laps if mode == "plain" else 0)
    assert_close(a, b)


def test_every_lap_is_streamed_to_the_lap_log(tmp_path):
    path = tmp_path / "laps.jsonl"
    log = varied("plain", 100, window_laps=16, lap_log=path)
    log.close()
    records = read_lap_log(path)
    assert len(records) == log.lap_count == 102 and records[-16:] == list(log.laps)
    assert [r.kind for r in records[:3]] == ["prefill", "prefill", "decode"]


def test_the_quantile_sketch_reads_within_its_relative_accuracy():
    values = [0.0005 * (1 + (i * 37 % 1000) / 100) for i in range(5000)] + [-0.001, 0.0, 0.13, 0.1301]
    sketch = QuantileSketch()
    for value in values:
        sketch.add(value)
    for q, got in zip((0, 1, 50, 99, 100), sketch.percentiles([0, 1, 50, 99, 100])):
        assert got == pytest.approx(float(np.percentile(values, q)), rel=SKETCH_RELATIVE_ACCURACY,
                                    abs=SKETCH_RESOLUTION)
    assert QuantileSketch().percentiles([50]) == [None]


@pytest.mark.parametrize("window", [LAPS * 4, 8])
def test_the_laps_of_one_batch_frame_count_as_each_lap_alone(window):
    """RunLog.add_laps (a BATCH frame's streams, sharing their stamps) gives the summary and the aggregates that adding
    each lap alone gives, from the window's laps and from the running totals alike."""
    apart, together = (RunLog(fake_scenario("plain"), window_laps=window) for _ in range(2))
    for i in range(LAPS):
        first = fake_lap(4 * i, i * 0.1, spec=False)
        batch = [dataclasses.replace(first, lap=4 * i + s, stream=s) for s in range(4)]
        for lap in batch:
            apart.add_lap(dataclasses.replace(lap, stamps=tuple(dataclasses.replace(st) for st in lap.stamps)))
        together.add_laps(batch)
    a, b = summarize(apart).to_dict(), summarize(together).to_dict()
    a.pop("history"), b.pop("history")
    assert a == b
    assert together.lap_count == 4 * LAPS and together.decode_tokens == apart.decode_tokens
    assert [h.latency.count for h in together.hops] == [h.latency.count for h in apart.hops]
    assert [s.compute.counts for s in together.stages] == [s.compute.counts for s in apart.stages]
    # the frame crossed each hop once a lap, not once a stream
    assert [h.bytes_total for h in together.hops] == [h.bytes_total // 4 for h in apart.hops]
