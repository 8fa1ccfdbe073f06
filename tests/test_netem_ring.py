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

Time dilation (testbed.launch.dilation) divides the fixed part by D. Measured in UML on a quiet box (3 x 10 ms
compute, 30 tokens), undilated and at D = 8:

    ring           D   rate error  per-hop p50 - configured  lap residual
    [5, 5, 5]      1   -7.8 %      0.58 .. 0.68 ms           0.93 ms
    [5, 5, 5]      8   -0.66 %     0.059 .. 0.063 ms         0.11 ms
    [15, 10, 20]   1   -4.1 %      0.58 .. 0.60 ms           1.03 ms
    [15, 10, 20]   8   -0.47 %     0.067 .. 0.075 ms         0.12 ms

So these rings run at D = 10, and every budget above counts 1/D: the rate tolerance is 4.7% for T_ring =
15 ms and 3.3% for 45 ms (target <= 5%), the per-hop bound 0.4 ms + 1% of the delay.

What the box adds is measured in the same run, as tests/test_fidelity.py does on the relay: a hop (and a probe) is
held by its fastest lap, since a late wake-up only ever adds to a hop while a wrong delay moves every lap; the rate
tolerance adds the hops' mean above their fastest lap. Fresh clones in CI, one guest beside the other, had seen
p50s 0.56-0.95 ms above the delay at T_ring = 45 ms while quiet runs measure 0.04-0.08 ms.
"""

import statistics
from dataclasses import dataclass

import pytest

from testbed.core import physics
from testbed.core.summary import RunSummary
from testbed.launch.runlog import RunLog
from testbed.scenario.config import Scenario
from tests.ringutil import ring_scenario, run

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
DILATION = 10.0  # time dilation (testbed.launch.dilation): the fixed budgets above count 1/D



@dataclass(frozen=True)
class NetemRing:
    scenario: Scenario
    summary: RunSummary
    hops_ms: list[list[float]]  # per hop, every decode lap's one-way latency
    probes_ms: list[list[float]]  # per hop, every self-check probe's

    def fastest_ms(self) -> list[float]:
        return [min(hop) for hop in self.hops_ms]

    def late_ms(self) -> list[float]:
        """Per hop: its mean decode lap above its fastest; the box's late wake-ups, measured in the same run."""
        return [statistics.fmean(hop) - min(hop) for hop in self.hops_ms]


def per_hop_ms(laps) -> list[list[float]]:
    return [[h * 1e3 for h in hop] for hop in zip(*(lap.hop_latencies_s() for lap in laps))]


@pytest.fixture(scope="module", params=RINGS, ids=lambda h: f"T_ring={sum(h):g}ms")
def ring(request, netem_capable):
    scenario = ring_scenario(request.param, compute_ms=COMPUTE_MS, tokens=TOKENS)
    log = RunLog(scenario)
    s = run(scenario, shaper="netem", dilation=DILATION, runlog=log)
    ring = NetemRing(scenario, s, per_hop_ms([lap for lap in log.laps if lap.kind == "decode"]), per_hop_ms(log.probes))
    lap_ms = s.wall_s / s.laps * 1e3 if s.laps else float("nan")
    print(f"\nnetem ring {request.param}: C {s.compute_s * 1e3:.2f} ms, lap {lap_ms:.2f} ms vs C + T_ring "
          f"{(s.compute_s + scenario.t_ring_s) * 1e3:.2f} ms, rate error {s.error_pct:+.1f} %, "
          f"per-hop p50 excess {[round(h.measured_ms_p50 - h.configured_ms, 3) for h in s.per_hop]} ms, "
          f"fastest lap's {[round(f - link.delay_ms, 3) for f, link in zip(ring.fastest_ms(), scenario.ring)]} ms, "
          f"mean excess {(s.t_ring_measured_s - scenario.t_ring_s) * 1e3 / scenario.n_stages:.3f} ms/hop, "
          f"lap residual {s.lap_residual_ms:.3f} ms")
    return ring


def netem_rate_tolerance(n_hops: int, lap_s: float, t_ring_s: float, late_ms: float = 0.0) -> float:
    """Relative tolerance of measured vs 1/(C + T_ring): the netem overhead budget (over D) over the lap it
    rides on, plus the timers' proportional lateness on the ring's delays, plus `late_ms` a lap measured in the run
    (the hops' mean above their fastest lap: the box's late wake-ups, which a testbed's fixed overhead is not)."""
    fixed = (n_hops * NETEM_HOP_OVERHEAD_BUDGET_MS + NETEM_LAP_RESIDUAL_BUDGET_MS) / (lap_s * 1e3 * DILATION)
    return fixed + NETEM_TIMER_SLACK * t_ring_s / lap_s + late_ms / (lap_s * 1e3)


def hop_budget_ms(delay_ms: float) -> float:
    return NETEM_HOP_OVERHEAD_BUDGET_MS / DILATION + NETEM_TIMER_SLACK * delay_ms


def test_measured_rate_matches_the_wall(ring):
    scenario, s = ring.scenario, ring.summary
    lap_s = s.compute_s + scenario.t_ring_s
    predicted = physics.wall_rate(s.compute_s, scenario.t_ring_s)
    assert s.predicted_tok_s == pytest.approx(predicted)
    tolerance = netem_rate_tolerance(scenario.n_stages, lap_s, scenario.t_ring_s, sum(ring.late_ms()))
    assert s.measured_tok_s == pytest.approx(predicted, rel=tolerance), (tolerance, s.per_hop)
    # never faster than the wall: every hop is at least its configured delay
    assert 1 / s.measured_tok_s >= lap_s - scenario.n_stages * EARLY_MS / 1e3
    n = scenario.n_stages
    assert n * (COMPUTE_MS - EARLY_MS) <= s.compute_s * 1e3 <= n * (COMPUTE_MS + NETEM_STAGE_PAD_BUDGET_MS / DILATION
                                                                     + NETEM_TIMER_SLACK * COMPUTE_MS)
    assert s.dilation.factor == DILATION
    assert s.tokens == s.laps == TOKENS - 1  # one token from the prefill lap, the rest from decode laps


def test_every_hop_measures_its_configured_latency(ring):
    """Never early; the fastest lap late by no more than the overhead budget. A late wake-up on a busy host only adds
    to a hop (inside UML with another guest beside it, p50s 0.6-0.95 ms late), a wrong delay moves every lap of the
    hop, its fastest included (tests/test_fidelity.py holds the relay's hops the same way)."""
    scenario, s = ring.scenario, ring.summary
    assert len(s.per_hop) == scenario.n_stages
    for hop, link, fastest in zip(s.per_hop, scenario.ring, ring.fastest_ms()):
        assert hop.hop == link.name
        assert link.delay_ms - EARLY_MS <= fastest <= link.delay_ms + hop_budget_ms(link.delay_ms), (hop, fastest)
        assert hop.bytes_per_lap > 128 * 4  # one [1, 1, 128] float32 hidden state plus header and stamps


def test_self_check_probes_measured_every_hop(ring):
    """The probes go round while the agents start, each hop held as the laps are (its fastest probe)."""
    scenario, checks = ring.scenario, ring.summary.self_check
    assert checks, "no self_check in the summary (probe frames before the first lap)"
    assert [c.hop for c in checks] == [link.name for link in scenario.ring]
    for check, link, probes in zip(checks, scenario.ring, ring.probes_ms):
        assert check.configured_ms == link.delay_ms
        assert check.measured_ms_p50 == pytest.approx(statistics.median(probes))
        assert link.delay_ms - EARLY_MS <= min(probes) <= link.delay_ms + hop_budget_ms(link.delay_ms), probes


def test_summary_contract(ring):
    scenario, s = ring.scenario, ring.summary
    for key in ("scenario", "shaper", "stages", "hops_ms", "tokens", "laps", "wall_s", "compute_s", "t_ring_s",
                "measured_tok_s", "predicted_tok_s", "per_hop", "overhead_ms_per_hop", "self_check"):
        assert key in s.to_dict()
    assert s.shaper == "netem" and s.stages == scenario.n_stages
    assert sorted(link["link"] for link in s.shaper_facts["links"]) == sorted(link.name for link in scenario.links)
    assert list(s.hops_ms) == [link.delay_ms for link in scenario.ring]
    assert s.t_ring_s == pytest.approx(scenario.t_ring_s)
    assert s.ttft.measured_s >= s.t_ring_s
