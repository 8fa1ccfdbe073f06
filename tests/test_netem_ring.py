"""Regression on the kernel netem backend: real rings in namespaces measure the wall r = 1/(C + T_ring).

The same test as tests/test_wall.py (userspace relay), with the hops shaped by netem qdiscs on veths
between one network namespace per agent. Predicted = 1/(C + T_ring) with C measured from the stage
stamps (summary.compute_s) and T_ring as configured.

Needs root and a kernel with sch_netem; skipped otherwise (with the probe's reason). On a kernel
without netem, run it inside user-mode-linux (~1.5 minutes there, ~40 s per ring, nearly all of it the
agents starting: importing torch from hostfs on one vCPU):

    python -m netem.uml --timeout 900 -- .venv/bin/python -m pytest -m netem tests/test_netem_ring.py -v

Overhead budget. The kernel backend is exercised inside user-mode-linux, which is much slower than the
host: one vCPU for the launcher and all agents (no SMP, PREEMPT_NONE, HZ=100), every syscall a
ptrace round trip, and hrtimers that fire late in proportion to the interval (measured there:
time.sleep(5 ms) +0.3 ms p50, sleep(20 ms) +0.8 ms, sleep(50 ms) +1.4 ms). Measured there with these
two rings (3 x 10 ms compute, 30 tokens), eight runs each, on the shared 2-core box:

    ring           per-hop p50 - configured  per-hop mean excess  lap residual  lap - (C + T_ring)  rate error
    [5, 5, 5]      0.9 .. 2.0 ms             1.6 .. 3.1 ms        2.0 .. 6.7 ms  7.1 .. 14.1 ms     -13 .. -22 %
    [15, 10, 20]   0.8 .. 2.9 ms             1.2 .. 2.7 ms        1.0 .. 4.1 ms  4.5 .. 10.0 ms      -6 .. -12 %

(self-check probes before the first lap: 0.8 .. 2.8 ms above configured; emulated compute C: 30.6 ..
37.2 ms for 30 ms configured; longer hops are later still: a [40, 30, 50] ring measured 2.4 .. 4.4 ms
per hop, which is why these rings stay at <= 20 ms hops.) No p50 ever came in under the configured
delay. The budgets below are the worst figure seen with ~1.3-1.4x headroom for a noisy shared box;
the rate tolerance is derived from them exactly as tests/ringutil.rate_tolerance derives the
userspace one: (n_hops x hop budget + lap residual budget) / (C + T_ring) = 20 ms over the lap, i.e.
~41 % for T_ring = 15 ms and ~26 % for 45 ms (worst lap excess seen: 14.1 ms). On a native kernel
with netem the overhead is far smaller and these bounds hold with room to spare.

Time dilation (testbed.run.dilation) divides the fixed part by D. Measured in UML on a quiet box (3 x 10 ms
compute, 30 tokens), undilated and at D = 8:

    ring           D   rate error  per-hop p50 - configured  lap residual
    [5, 5, 5]      1   -7.8 %      0.58 .. 0.68 ms           0.93 ms
    [5, 5, 5]      8   -0.66 %     0.059 .. 0.063 ms         0.11 ms
    [15, 10, 20]   1   -4.1 %      0.58 .. 0.60 ms           1.03 ms
    [15, 10, 20]   8   -0.47 %     0.067 .. 0.075 ms         0.12 ms

So these rings run at D = 10, and every budget above counts 1/D: the rate tolerance is 4.7% for T_ring =
15 ms and 3.3% for 45 ms (target <= 5%), the per-hop bound 0.4 ms + 1% of the delay.
"""

import pytest

from tests.ringutil import ring_scenario, run
from testbed.core import physics

pytestmark = pytest.mark.netem

NETEM_HOP_OVERHEAD_BUDGET_MS = 4.0  # per hop, p50 and mean: worst seen inside UML 2.9 (p50), 3.1 ms (mean)
NETEM_LAP_RESIDUAL_BUDGET_MS = 8.0  # entry node's own framing per lap: worst seen inside UML 6.7 ms
# emulated compute overshoot per stage, in the box's ms: worst seen inside UML 2.4 ms on a quiet host, 11 ms with
# its two cores busy (both guests and a pytest beside them); what it is there to catch, a padding applied twice or
# not dilated, is COMPUTE_MS x D = 100 ms
NETEM_STAGE_PAD_BUDGET_MS = 15.0
# Timers that fire late in proportion to the interval would not shrink with dilation: allowed for here, though
# measured in UML at D = 8 on a quiet box the hops were only 0.06-0.075 ms late at 40-160 ms (see above).
NETEM_TIMER_SLACK = 0.01
EARLY_MS = 0.05  # a hop is never early by more than this (netem's own timer slack)
COMPUTE_MS = 10.0
TOKENS = 20  # 19 decode laps at D = 10, 0.45 and 0.75 s each (issue 29: the netem suite at half its time)
RINGS = [[5.0, 5.0, 5.0], [15.0, 10.0, 20.0]]
DILATION = 10.0  # time dilation (testbed.run.dilation): the fixed budgets above count 1/D



@pytest.fixture(scope="module", params=RINGS, ids=lambda h: f"T_ring={sum(h):g}ms")
def ring(request, netem_capable):
    scenario = ring_scenario(request.param, compute_ms=COMPUTE_MS, tokens=TOKENS)
    s = run(scenario, shaper="netem", dilation=DILATION)
    lap_ms = s.wall_s / s.laps * 1e3 if s.laps else float("nan")
    print(f"\nnetem ring {request.param}: C {s.compute_s * 1e3:.2f} ms, lap {lap_ms:.2f} ms vs C + T_ring "
          f"{(s.compute_s + scenario.t_ring_s) * 1e3:.2f} ms, rate error {s.error_pct:+.1f} %, "
          f"per-hop p50 excess {[round(h.measured_ms_p50 - h.configured_ms, 3) for h in s.per_hop]} ms, "
          f"mean excess {(s.t_ring_measured_s - scenario.t_ring_s) * 1e3 / scenario.n_stages:.3f} ms/hop, "
          f"lap residual {s.lap_residual_ms:.3f} ms")
    return scenario, s


def netem_rate_tolerance(n_hops: int, lap_s: float, t_ring_s: float) -> float:
    """Relative tolerance of measured vs 1/(C + T_ring): the netem overhead budget (over D) over the lap it
    rides on, plus the timers' proportional lateness on the ring's delays."""
    fixed = (n_hops * NETEM_HOP_OVERHEAD_BUDGET_MS + NETEM_LAP_RESIDUAL_BUDGET_MS) / (lap_s * 1e3 * DILATION)
    return fixed + NETEM_TIMER_SLACK * t_ring_s / lap_s


def hop_budget_ms(delay_ms: float) -> float:
    return NETEM_HOP_OVERHEAD_BUDGET_MS / DILATION + NETEM_TIMER_SLACK * delay_ms


def test_measured_rate_matches_the_wall(ring):
    scenario, s = ring
    lap_s = s.compute_s + scenario.t_ring_s
    predicted = physics.wall_rate(s.compute_s, scenario.t_ring_s)
    assert s.predicted_tok_s == pytest.approx(predicted)
    tolerance = netem_rate_tolerance(scenario.n_stages, lap_s, scenario.t_ring_s)
    assert s.measured_tok_s == pytest.approx(predicted, rel=tolerance), (tolerance, s.per_hop)
    # never faster than the wall: every hop is at least its configured delay
    assert 1 / s.measured_tok_s >= lap_s - scenario.n_stages * EARLY_MS / 1e3
    n = scenario.n_stages
    assert n * (COMPUTE_MS - EARLY_MS) <= s.compute_s * 1e3 <= n * (COMPUTE_MS + NETEM_STAGE_PAD_BUDGET_MS / DILATION
                                                                     + NETEM_TIMER_SLACK * COMPUTE_MS)
    assert s.dilation.factor == DILATION
    assert s.tokens == s.laps == TOKENS - 1  # one token from the prefill lap, the rest from decode laps


def test_every_hop_measures_its_configured_latency(ring):
    scenario, s = ring
    assert len(s.per_hop) == scenario.n_stages
    for hop, link in zip(s.per_hop, scenario.ring):
        assert hop.hop == link.name
        # never early; late by no more than the overhead budget
        assert link.delay_ms - EARLY_MS <= hop.measured_ms_p50 <= link.delay_ms + hop_budget_ms(link.delay_ms), hop
        assert hop.bytes_per_lap > 128 * 4  # one [1, 1, 128] float32 hidden state plus header and stamps


def test_self_check_probes_measured_every_hop(ring):
    scenario, s = ring
    checks = s.self_check
    assert checks, "no self_check in the summary (probe frames before the first lap)"
    assert [c.hop for c in checks] == [link.name for link in scenario.ring]
    for check, link in zip(checks, scenario.ring):
        assert check.configured_ms == link.delay_ms
        assert link.delay_ms - EARLY_MS <= check.measured_ms_p50 <= link.delay_ms + hop_budget_ms(link.delay_ms)


def test_summary_contract(ring):
    scenario, s = ring
    for key in ("scenario", "shaper", "stages", "hops_ms", "tokens", "laps", "wall_s", "compute_s", "t_ring_s",
                "measured_tok_s", "predicted_tok_s", "per_hop", "overhead_ms_per_hop", "self_check"):
        assert key in s.to_dict()
    assert s.shaper == "netem" and s.stages == scenario.n_stages
    assert sorted(link["link"] for link in s.shaper_facts["links"]) == sorted(link.name for link in scenario.links)
    assert list(s.hops_ms) == [link.delay_ms for link in scenario.ring]
    assert s.t_ring_s == pytest.approx(scenario.t_ring_s)
    assert s.ttft.measured_s >= s.t_ring_s
