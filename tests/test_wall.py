"""Regression (exact tier): rings on simulated time measure the wall r = 1/(C + T_ring) to 1e-6.

The rings run on the virtual backend (netem.virtual): the same agents, frames and relay timing as on the box, but
every wait ends exactly on time, so what is left between the measured rate and 1/(C + T_ring) is a bug, not the
box's noise. Predicted = 1/(C + T_ring) with C measured from the stage stamps and, independently, with the
configured compute; T_ring as configured. The real-time overhead and its budget are the fidelity tier's
(tests/test_dilation.py, tests/test_fidelity.py).
"""

import numpy as np
import pytest

from tests.ringutil import EXACT, ring_scenario, run
from testbed.core import physics

RINGS = [[0.0, 0.0, 0.0], [5.0, 3.0, 8.0], [20.0, 15.0, 25.0], [40.0, 35.0, 45.0], [130.0, 40.0, 110.0]]
STAGE_COMPUTE_MS = 30.0  # C = 90 ms
TOKENS = 8


@pytest.fixture(scope="module")
def rings():
    results = []
    for hops in RINGS:
        scenario = ring_scenario(hops, compute_ms=STAGE_COMPUTE_MS, tokens=TOKENS)
        results.append((scenario, run(scenario)))
    return results


def test_lap_time_grows_one_for_one_with_t_ring(rings):
    t_ring = np.array([sc.t_ring_s for sc, _ in rings])
    lap_minus_c = np.array([1 / s.measured_tok_s - s.compute_s for _, s in rings])
    slope, intercept = np.polyfit(t_ring, lap_minus_c, 1)
    assert slope == pytest.approx(1.0, rel=EXACT) and abs(intercept) < 1e-9, (slope, intercept)


@pytest.mark.parametrize("index", range(len(RINGS)), ids=[f"T_ring={sum(h):g}ms" for h in RINGS])
def test_measured_rate_is_the_wall(rings, index):
    scenario, s = rings[index]
    configured = 1 / (scenario.emulated_compute_s + scenario.t_ring_s)
    assert s.predicted_tok_s == pytest.approx(configured, rel=EXACT)
    assert s.measured_tok_s == pytest.approx(physics.wall_rate(s.compute_s, scenario.t_ring_s), rel=EXACT)
    assert s.measured_tok_s == pytest.approx(configured, rel=EXACT)
    assert abs(s.error_pct) < EXACT * 100
    assert s.compute_s == pytest.approx(3 * STAGE_COMPUTE_MS / 1e3, rel=EXACT)
    assert s.tokens == s.laps == TOKENS - 1  # one token from the prefill lap, the rest one per decode lap


@pytest.mark.parametrize("index", range(len(RINGS)), ids=[f"T_ring={sum(h):g}ms" for h in RINGS])
def test_every_hop_measures_its_configured_latency(rings, index):
    scenario, s = rings[index]
    for hop, link in zip(s.per_hop, scenario.ring):
        assert hop.hop == link.name
        assert hop.measured_ms_p50 == pytest.approx(link.delay_ms, abs=1e-9)
        assert hop.measured_ms_p99 == pytest.approx(link.delay_ms, abs=1e-9)
        assert hop.bytes_per_lap > 128 * 4  # one [1, 1, 128] float32 hidden state plus header and stamps
    for check in s.self_check:
        assert check.measured_ms_p50 == pytest.approx(check.configured_ms, abs=1e-9)
    assert abs(s.overhead_ms_per_hop) < 1e-9


def test_summary_contract_and_what_a_virtual_run_means(rings):
    _, s = rings[-1]
    data = s.to_dict()
    for key in ("scenario", "shaper", "stages", "hops_ms", "tokens", "laps", "wall_s", "compute_s", "t_ring_s",
                "measured_tok_s", "predicted_tok_s", "per_hop", "overhead_ms_per_hop"):
        assert key in data
    assert s.shaper == "virtual" and s.stages == 3 and s.shaper_facts["backend"] == "virtual"
    meaning = s.shaper_facts["virtual"]
    assert "no simulated time" in meaning["forward_passes"] and "not applied" in meaning["dilation"]
    assert meaning["wall_clock_fields"] == ["agents", "history"]
    assert s.ttft.measured_s == pytest.approx(s.ttft.predicted_s, rel=EXACT)
    assert s.compute_real_s == 0.0  # the forward passes are real but take no simulated time
