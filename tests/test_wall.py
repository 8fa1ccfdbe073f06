"""Regression: real rings on loopback measure the wall r = 1/(C + T_ring) (time-scaled hop latencies).

Predicted = 1/(C + T_ring) with C measured from the stage stamps and T_ring as configured. The rings run
time-dilated x5 (testbed.dilation): the box's fixed costs shrink five times in scenario time. Two checks:

- across rings, the measured lap time grows one for one with the configured T_ring: the fitted slope of
  (lap - C) against T_ring is 1 within 3% (a constant testbed overhead cancels out of the slope);
- each ring's measured rate is within the testbed's overhead budget (tests/ringutil.py) divided by the
  dilation of the formula (0.8-1.8% here), and each hop's measured one-way latency is within the per-hop
  budget divided by the dilation (0.4 ms) of its configuration.

The budget is the box's milliseconds and each tolerance divides it by the dilated lap, so the share of a
tolerance that the box's overhead uses does not depend on D: x5 rather than x10 halves the run (laps and
self-check probes) at the same margins; the slope (a fixed 3%) stays within 1% at x5. The 8 tokens keep
each hop's median over 7 decode laps, so one slow lap does not move it.
"""

import numpy as np
import pytest

from tests.ringutil import HOP_OVERHEAD_BUDGET_MS, LAP_RESIDUAL_BUDGET_MS, rate_tolerance, ring_scenario, run
from testbed.core import physics

pytestmark = pytest.mark.slow

RINGS = [[0.0, 0.0, 0.0], [5.0, 3.0, 8.0], [20.0, 15.0, 25.0], [40.0, 35.0, 45.0]]  # T_ring 0, 16, 60, 120 ms
STAGE_COMPUTE_MS = 30.0  # C = 90 ms: long enough that the ~5 ms/lap testbed overhead is a few percent
SLOPE_TOLERANCE = 0.03
DILATION = 5.0
TOKENS = 8


@pytest.fixture(scope="module")
def rings():
    results = []
    for hops in RINGS:
        scenario = ring_scenario(hops, compute_ms=STAGE_COMPUTE_MS, tokens=TOKENS)
        results.append((scenario, run(scenario, dilation=DILATION)))
    return results


def test_lap_time_grows_one_for_one_with_t_ring(rings):
    # Rings whose hops all have a delay: there the relay's own wake-up hides behind the delay, so the
    # overhead is the same on every ring (on a zero-delay hop it is not; that ring is checked below).
    delayed = [(sc, s) for sc, s in rings if all(link.delay_ms >= 2 for link in sc.ring)]
    assert len(delayed) >= 3
    t_ring = np.array([sc.t_ring_s for sc, _ in delayed])
    lap_minus_c = np.array([1 / s.measured_tok_s - s.compute_s for _, s in delayed])
    slope, intercept = np.polyfit(t_ring, lap_minus_c, 1)
    assert slope == pytest.approx(1.0, abs=SLOPE_TOLERANCE), (slope, intercept)
    # the intercept is the testbed's own overhead per lap: within budget
    assert 0 <= intercept * 1e3 <= (3 * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / DILATION


@pytest.mark.parametrize("index", range(len(RINGS)), ids=[f"T_ring={sum(h):g}ms" for h in RINGS])
def test_measured_rate_matches_the_wall(rings, index):
    scenario, s = rings[index]
    predicted = physics.wall_rate(s.compute_s, scenario.t_ring_s)
    tolerance = rate_tolerance(scenario.n_stages, s.compute_s + scenario.t_ring_s, DILATION)
    # independent of the measured C: the closed form at the configured compute and links (a stage that
    # wakes late overshoots its padding: the same overhead budget bounds it)
    configured = 1 / (scenario.emulated_compute_s + scenario.t_ring_s)
    assert s.predicted_tok_s == pytest.approx(configured, rel=tolerance)
    assert s.measured_tok_s == pytest.approx(predicted, rel=tolerance), (tolerance, s.per_hop)
    assert s.measured_tok_s < predicted  # overhead only ever adds time
    assert s.compute_s == pytest.approx(0.090, abs=0.002)  # 3 x 30 ms emulated, padded precisely
    assert s.tokens == s.laps == TOKENS - 1  # one token from the prefill lap, the rest one per decode lap
    assert s.dilation.factor == DILATION


@pytest.mark.parametrize("index", range(len(RINGS)), ids=[f"T_ring={sum(h):g}ms" for h in RINGS])
def test_every_hop_measures_its_configured_latency(rings, index):
    scenario, s = rings[index]
    for hop, link in zip(s.per_hop, scenario.ring):
        assert hop.hop == link.name
        # never early; late by no more than the overhead budget
        assert link.delay_ms - 0.05 <= hop.measured_ms_p50 <= link.delay_ms + HOP_OVERHEAD_BUDGET_MS / DILATION, hop
        assert hop.bytes_per_lap > 128 * 4  # one [1, 1, 128] float32 hidden state plus header and stamps
    for check in s.self_check:
        assert check.measured_ms_p50 >= check.configured_ms - 0.05


def test_summary_contract(rings):
    _, s = rings[-1]
    for key in ("scenario", "shaper", "stages", "hops_ms", "tokens", "laps", "wall_s", "compute_s", "t_ring_s",
                "measured_tok_s", "predicted_tok_s", "per_hop", "overhead_ms_per_hop"):
        assert key in s.to_dict()
    assert s.shaper == "userspace" and s.stages == 3 and s.shaper_facts["backend"] == "userspace"
    assert s.ttft.measured_s >= s.t_ring_s
