"""The soak, shortened: a fast ring for 2,000 laps; no process may grow by as much as a leak of one frame a lap."""

import dataclasses
import json
import math

import pytest
import trio

from agents import wire
from agents.train import MODEL_CONFIGS
from testbed.bench import synthetic_lap_line
from testbed.config import load_scenario
from testbed.core.records import LapRecord
from testbed.soak import LAUNCHER, Footprint, RecordCost, Sample, SoakResult, analyse, soak, soak_report

LAPS = 2_000
WARMUP_FRACTION = 0.25  # the entry's allocators settle over its first context windows (~190 laps each)
# The smallest leak worth catching: every lap keeps one hidden-state frame as a middle stage forwards it.
FRAME_BYTES = wire.HEADER.size + 3 * wire.STAMP.size + 4 * MODEL_CONFIGS["target"].n_embd
LEAK_MB_PER_1000 = FRAME_BYTES * 1000 / 2**20  # ~0.68 MB per 1000 laps
# A leak of one frame a lap must fail with room for the fit's noise; measured here, the entry's allocators still
# settle by 0.15-0.3 MB per 1000 laps over laps 500-1900, the other agents and the relay by under 0.1.
SLOPE_BOUND_MB_PER_1000 = 0.75 * LEAK_MB_PER_1000
# The launcher's Python objects beyond its lap log: a leak of anything per lap is >= 1000 per 1000 laps.
LEAK_OBJECTS_PER_1000 = 100
RATE_DROP_LIMIT = 0.7  # the last tenth's rate over the first's: a per-lap cost growing with the laps shows here


def check(result: SoakResult) -> None:
    grown = {m.name: m.slope_mb_per_1000 for m in result.memory if m.name != LAUNCHER}
    assert len(grown) == 4, grown  # three agents and the relay were sampled
    assert all(math.isfinite(s) and s < SLOPE_BOUND_MB_PER_1000 for s in grown.values()), grown
    assert result.launcher_objects_per_1000 < LEAK_OBJECTS_PER_1000, result.launcher_objects_per_1000
    assert result.last_tenth_tok_s > RATE_DROP_LIMIT * result.first_tenth_tok_s, result


@pytest.mark.slow
def test_a_fast_ring_keeps_its_memory_flat_and_its_rate():
    result = trio.run(lambda: soak(LAPS, warmup_fraction=WARMUP_FRACTION))
    print("\n".join(soak_report(result)))
    assert result.laps >= LAPS * 0.95  # a context refill is a prefill lap, not a decode lap
    check(result)


def synthetic(leak_mb_per_1000: float = 0.0, leak_objects_per_lap: int = 0) -> SoakResult:
    """A soak's measurements made up: flat agents (one leaking `leak_mb_per_1000`), a launcher that grows by its lap
    records (and `leak_objects_per_lap` more objects), a steady rate."""
    per_record = RecordCost(2000, 6)
    samples = []
    for laps in range(0, LAPS + 1, 20):
        wobble = 0.05 * math.sin(laps / 37)  # RSS moves a page or two either way
        rss = {LAUNCHER: 230 + per_record.bytes * laps / 2**20, "hong-kong": 243 + wobble, "dublin": 240 - wobble,
               "new-york": 240 + leak_mb_per_1000 * laps / 1000, "relay": 26.0}
        samples.append(Sample(laps / 100, laps, laps, laps / 100, rss))
    warm, end = (Footprint(n, n, 50_000 + n * (per_record.tracked + leak_objects_per_lap), 0) for n in (500, 1900))
    return analyse(samples, [(500, 0.002, 0.007), (1900, 0.02, 0.007)], LAPS, 20.0, 150.0, per_record, warm, end)


def test_the_soak_check_passes_a_flat_run_and_fails_a_leak_of_one_frame_a_lap():
    check(synthetic())
    assert synthetic().process("new-york").slope_mb_per_1000 == pytest.approx(0.0, abs=0.05)
    with pytest.raises(AssertionError):
        check(synthetic(leak_mb_per_1000=LEAK_MB_PER_1000))
    with pytest.raises(AssertionError):
        check(synthetic(leak_objects_per_lap=1))


def test_what_a_lap_record_costs_is_measured_as_the_launcher_builds_it():
    scenario = load_scenario("geo-ring")
    records = [LapRecord.from_dict(json.loads(synthetic_lap_line(scenario, i))["record"]) for i in range(200)]
    cost = RecordCost.of(records)
    assert cost.tracked == 6  # the record, its stamps tuple, three stamps, the head timing
    assert 1000 < cost.bytes < 4000
    assert dataclasses.asdict(cost) == {"bytes": cost.bytes, "tracked": 6}
