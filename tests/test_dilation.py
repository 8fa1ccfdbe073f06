"""Time dilation (testbed.launch.dilation): the box runs D times slower, the figures come back in scenario time.

Unit tests pin the arithmetic (records, scenarios, the choice of D); the slow tests run real rings side by
side undilated and dilated, and check that dilation divides the testbed's overhead by D while the
scenario's own figures (the wall, every hop's delay) stay where they were.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import trio

from testbed.scenario.config import load_scenario
from testbed.core import physics
from testbed.core.errors import ConfigError
from agents.modes.dsd.facts import DsdSummary
from agents.modes.speculative.settings import SpecSettings
from testbed.core.summary import DilationSummary, RunSummary
from testbed.launch.budget import MIN_SHARE_S, STUDY_BUDGET_S, plan_runs, run_budget, study_budget
from testbed.launch.dilation import (BUDGET_S, CALIBRATION_TOKENS, DILATION_MAX, TARGET_OVERHEAD, Calibration,
                              calibration_from, calibration_scenario, choose, lap_floor_s, parse_budget, parse_dilation,
                              resolve)
from testbed.core.lapstats import DECODE_KINDS
from testbed.launch.runlog import RunLog, read_lap_log
from testbed.launch.summarize import summarize
from tests.fakes import HOP_DELAYS_S, HOP_OVERHEAD_S, SPEC_DRAFT_S, fake_lap, fake_scenario
from tests.ringutil import REAL_HOP_OVERHEAD_BUDGET_MS, rate_tolerance, ring_scenario, run


def test_a_time_scaled_lap_scales_every_stamp_and_duration():
    lap = fake_lap(3, 10.0, spec=True)
    half = lap.time_scaled(0.5)
    assert half.duration_s == pytest.approx(lap.duration_s / 2)
    assert half.hop_latencies_s() == pytest.approx([h / 2 for h in lap.hop_latencies_s()])
    assert half.stage_compute_s() == pytest.approx([c / 2 for c in lap.stage_compute_s()])
    assert half.stage_real_s() == pytest.approx([c / 2 for c in lap.stage_real_s()])
    assert half.facts.draft_s == pytest.approx(SPEC_DRAFT_S / 2)  # "_s" fields are durations
    assert half.facts.k == lap.facts.k and half.facts.accepted == lap.facts.accepted
    assert half.ids == lap.ids and half.tokens == lap.tokens
    assert lap.time_scaled(1.0) is lap


def test_a_dilated_run_log_summarizes_to_the_undilated_figures():
    """Laps recorded on a box running D x slower, scaled back by 1/D, give the scenario's own figures."""
    d = 8.0
    plain, dilated = RunLog(fake_scenario("plain")), RunLog(fake_scenario("plain"))
    for i in range(20):
        plain.add_lap(fake_lap(i, i * 0.1, spec=False))
        slow = fake_lap(i, i * 0.1, spec=False).time_scaled(d)  # what the box would have stamped
        dilated.add_lap(slow.time_scaled(1 / d))
    dilated.dilation = DilationSummary(factor=d, requested="8", applied_ms=(32.0, 40.0, 48.0), reason="as requested")
    a, b = summarize(plain), summarize(dilated)
    assert a.dilation is None and b.dilation.factor == d
    assert RunSummary.from_json(b.to_json()) == b  # the JSON summary (and `testbed report`) reads it back
    assert b.measured_tok_s == pytest.approx(a.measured_tok_s)
    assert b.predicted_tok_s == pytest.approx(a.predicted_tok_s)
    for hop_a, hop_b, delay in zip(a.per_hop, b.per_hop, HOP_DELAYS_S):
        assert hop_b.measured_ms_p50 == pytest.approx(hop_a.measured_ms_p50)
        assert hop_b.measured_ms_p50 == pytest.approx((delay + HOP_OVERHEAD_S) * 1e3)


def test_a_dilated_scenario_multiplies_times_and_divides_rates():
    sc = load_scenario("geo-ring", ["network.rate_mbit=100", "network.jitter_ms=2"])
    slow = sc.dilated(4.0)
    assert [link.delay_ms for link in slow.links] == pytest.approx([4 * link.delay_ms for link in sc.links])
    assert [link.jitter_ms for link in slow.links] == pytest.approx([8.0] * 3)
    assert [link.rate_mbit for link in slow.links] == pytest.approx([25.0] * 3)
    assert [st.compute_ms for st in slow.stages] == pytest.approx([44.0] * 3)
    assert slow.decode.draft_ms == pytest.approx(4 * sc.decode.draft_ms)
    assert slow.loss_rto_ms == pytest.approx(4 * sc.loss_rto_ms)
    assert slow.t_ring_s == pytest.approx(4 * sc.t_ring_s)
    assert sc.dilated(1.0) == sc
    # base-path compensation: the base latency comes off each dilated delay, never below zero
    compensated = sc.dilated(2.0, (1.0, 100.0, 500.0))
    assert [link.delay_ms for link in compensated.links] == pytest.approx([259.0, 0.0, 0.0])


@pytest.mark.parametrize("bad", [0.5, 0.0, -2.0, float("nan")])
def test_a_dilation_below_one_is_an_error(bad):
    with pytest.raises(ConfigError, match="dilation"):
        load_scenario("geo-ring").dilated(bad)


def test_compensation_needs_one_base_latency_per_link():
    with pytest.raises(ConfigError, match="one base latency per link"):
        load_scenario("geo-ring").dilated(2.0, (1.0,))


@pytest.mark.parametrize("text, expected", [("auto", "auto"), ("AUTO", "auto"), ("8", 8.0), ("1", 1.0), (2.5, 2.5)])
def test_parse_dilation(text, expected):
    assert parse_dilation(text) == expected


@pytest.mark.parametrize("text", ["0.5", "fast", "", "1000"])
def test_parse_dilation_names_the_flag_and_the_range(text):
    with pytest.raises(ConfigError, match=r"--dilation.*\[1, 64\] or auto"):
        parse_dilation(text)


def test_auto_picks_the_smallest_whole_d_that_meets_the_target():
    sc = load_scenario("table2-regional")  # lap ~54 ms: a few ms of overhead needs D in the tens
    calibration = Calibration(base_ms=(1.0, 1.0, 1.0), overhead_ms=4.0, compute_s=0.033)
    lap_s = 0.033 + sc.t_ring_s
    chosen = choose(sc, calibration, budget_s=1e9)
    needed = 4.0e-3 / (TARGET_OVERHEAD * lap_s)
    assert chosen.needed == pytest.approx(needed)
    assert chosen.factor == min(DILATION_MAX, float(int(needed) + 1))
    assert (4.0e-3 / chosen.factor) <= TARGET_OVERHEAD * lap_s < 4.0e-3 / (chosen.factor - 1)
    assert chosen.applied_ms == pytest.approx(tuple(chosen.factor * link.delay_ms for link in sc.links))
    # compensation takes the hops' base out of the overhead that dilation must shrink
    compensated = choose(sc, calibration, compensate=True, budget_s=1e9)
    assert compensated.needed == pytest.approx(1.0e-3 / (TARGET_OVERHEAD * lap_s))
    assert compensated.applied_ms == pytest.approx(tuple(compensated.factor * link.delay_ms - 1.0
                                                         for link in sc.links))


def test_auto_stays_within_the_run_time_budget():
    sc = load_scenario("geo-ring")  # 48 tokens x 313 ms: a 40 s budget allows D = 2
    chosen = choose(sc, Calibration(base_ms=(1.0,) * 3, overhead_ms=6.0, compute_s=0.033))
    lap_s = 0.033 + sc.t_ring_s
    assert chosen.cap == int(BUDGET_S / (sc.decode.tokens * lap_s)) == 2
    assert chosen.factor == 2 < chosen.needed
    assert "budget" in chosen.reason
    # capped, the run says what the overhead it could not divide away leaves: -(O / D) / (lap + O / D)
    assert chosen.capped and chosen.budget_s == BUDGET_S and chosen.lap_ms == pytest.approx(lap_s * 1e3)
    assert chosen.expected_error_pct == pytest.approx(-100 * 3.0 / (lap_s * 1e3 + 3.0))
    assert f"{chosen.expected_error_pct:+.2f}% of the rate" in chosen.reason
    # a budget twice as long: the cap is what fits in it; one large enough leaves auto its own choice, uncapped
    assert choose(sc, Calibration((1.0,) * 3, 6.0, 0.033), budget_s=2 * BUDGET_S).cap == int(
        2 * BUDGET_S / (sc.decode.tokens * lap_s)) == 5
    free = choose(sc, Calibration((1.0,) * 3, 6.0, 0.033), budget_s=1e4)
    assert not free.capped and free.factor == math.ceil(free.needed)
    assert free.expected_error_pct > -100 * TARGET_OVERHEAD


@pytest.mark.parametrize("text", ["0", "-5", "soon", "1e9"])
def test_parse_budget_names_the_flag(text):
    with pytest.raises(ConfigError, match=r"--budget-s.*seconds in \(0, 86400\]"):
        parse_budget(text)


def test_the_summary_table_says_when_the_budget_capped_d():
    from dashboards.render import capped_caption

    sc = load_scenario("geo-ring")
    chosen = choose(sc, Calibration(base_ms=(1.0,) * 3, overhead_ms=6.0, compute_s=0.033))
    summary = summarize(RunLog(sc))
    assert capped_caption([summary]) is None
    caption = capped_caption([dataclasses.replace(summary, dilation=chosen)])
    assert "D = 2 capped" in caption and f"{chosen.expected_error_pct:+.2f}%" in caption and "--budget-s" in caption


def canned_calibration(scenario, base_ms: float, residual_ms: float):
    """A summary of a calibration run of `scenario`: every hop base_ms, plus residual_ms per lap."""
    log = RunLog(scenario)
    n = scenario.n_stages
    for i in range(CALIBRATION_TOKENS):
        lap = fake_lap(i, i * 0.1, spec=False)
        stamps, t = [], lap.start
        for j, stamp in enumerate(lap.stamps):
            compute = stamp.compute_end - stamp.compute_start
            recv = t if j == 0 else t + base_ms / 1e3
            stamps.append(dataclasses.replace(stamp, recv=recv, compute_start=recv, real_end=recv,
                                              compute_end=recv + compute, send=recv + compute))
            t = recv + compute
        ret = t + base_ms / 1e3
        head = dataclasses.replace(lap.head, start=ret, real_end=ret, end=ret)
        log.add_lap(dataclasses.replace(lap, stamps=tuple(stamps), return_recv=ret, head=head,
                                        end=ret + residual_ms / 1e3))
    assert n == len(log.scenario.ring)
    return summarize(log)


def test_resolve_calibrates_once_per_ring_and_reads_base_and_overhead():
    sc = fake_scenario("plain")
    runs = []

    async def fake_run(calibration):
        runs.append(calibration)
        assert all(link.delay_ms == 0 for link in calibration.links)
        assert calibration.decode.mode == "plain" and calibration.decode.tokens == CALIBRATION_TOKENS
        return canned_calibration(fake_scenario("plain"), base_ms=0.5, residual_ms=0.4)

    cache: dict = {}

    async def main():
        first = await resolve(sc, "auto", compensate=False, run=fake_run, log=lambda m: None, cache=cache)
        spec = dataclasses.replace(sc, decode=dataclasses.replace(sc.decode, mode="speculative").with_settings(SpecSettings, k=8))
        second = await resolve(spec, "auto", compensate=True, run=fake_run, log=lambda m: None, cache=cache)
        return first, second

    first, second = trio.run(main)
    assert len(runs) == 1  # the speculative phase of the same ring reuses the plain phase's calibration
    assert calibration_scenario(sc) == runs[0]
    assert first.overhead_ms == pytest.approx(3 * 0.5 + 0.4)
    assert first.requested == "auto" and not first.compensate and first.base_ms == ()
    assert second.compensate and second.base_ms == pytest.approx((0.5, 0.5, 0.5))
    assert second.applied_ms == pytest.approx(tuple(max(0.0, second.factor * d * 1e3 - 0.5) for d in HOP_DELAYS_S))


def test_resolve_skips_the_calibration_when_the_budget_allows_no_dilation():
    sc = load_scenario("geo-ring", ["decode.tokens=100000"])

    async def must_not_run(calibration):
        raise AssertionError("calibrated although D = 1 was certain")

    chosen = trio.run(lambda: resolve(sc, "auto", compensate=False, run=must_not_run, log=lambda m: None))
    assert chosen.factor == 1.0 and chosen.requested == "auto" and "budget" in chosen.reason


def test_edge_speculation_calibrates_as_itself_at_a_zero_round_trip():
    sc = load_scenario("edge-cloud", ["decode.mode=speculative", "spec.placement=edge", "spec.rtt_ms=20",
                                      "decode.k=4", "decode.tokens=40"])
    probe = calibration_scenario(sc)
    assert probe.decode.mode == "dsd" and probe.decode.settings(SpecSettings).k == sc.decode.settings(SpecSettings).k and probe.decode.tokens == CALIBRATION_TOKENS
    assert probe.spec.rtt_ms == 0.0 and probe.spec.placement == "edge" and probe.spec.clients == sc.spec.clients
    assert all(link.delay_ms == 0.0 for link in probe.links) and len(probe.links) == len(sc.links) == 2
    assert lap_floor_s(sc) == pytest.approx(sc.t_ring_s + 0.020)  # a round pays the edge's round trip
    assert lap_floor_s(load_scenario("geo-ring")) == pytest.approx(0.280)
    # a round's overhead is what it took beyond physics.dsd_round_s; its physics, the round at zero round trip
    part = SimpleNamespace(round_ms=64.0, predicted_round_ms=61.5)
    part.calibration_lap = lambda: DsdSummary.calibration_lap(part)  # the mode's own reading of its lap
    calibration = calibration_from(SimpleNamespace(mode="dsd", dsd=part), sc)
    assert calibration.overhead_ms == pytest.approx(2.5) and calibration.compute_s == pytest.approx(0.0615)
    chosen = choose(sc, calibration, budget_s=1e9)
    lap_s = 0.0615 + 0.020
    assert chosen.lap_ms == pytest.approx(lap_s * 1e3) and chosen.factor == math.ceil(2.5e-3 / (TARGET_OVERHEAD * lap_s))
    plain = calibration_scenario(load_scenario("edge-cloud", ["decode.mode=speculative", "spec.placement=colocated"]))
    assert plain.decode.mode == "plain"  # co-located speculation calibrates its ring as plain decode


def test_the_streams_mode_calibrates_its_convoy_not_one_frame():
    """A streams lap carries M frames over every hop (the testbed's cost of a lap grows with M), so the mode
    calibrates as itself: its own M streams at zero delay, the overhead what a stream's lap took beyond
    physics.streams_rates' with the measured passes. On virtual time that overhead is exactly 0 and the lap the
    passes' sum; a measured lap 3% over its physics is read as that."""
    from agents.modes.streams.facts import StreamsSummary
    from testbed.launch.launcher import run_scenario

    sc = load_scenario("geo-ring", ["decode.mode=streams", "decode.streams=16", 'decode.batching="continuous"',
                                    "decode.tokens=8"])
    probe = calibration_scenario(sc)
    assert probe.decode.mode == "streams" and probe.decode.streams == 16 and probe.decode.tokens == CALIBRATION_TOKENS
    assert all(link.delay_ms == 0.0 for link in probe.links)
    summary = trio.run(lambda: run_scenario(probe, "virtual", log=lambda m: None))
    calibration = calibration_from(summary, sc)
    passes_s = sum(summary.streams.stage_compute_ms) / 1e3
    assert calibration.overhead_ms == pytest.approx(0.0, abs=1e-6) and calibration.compute_s == pytest.approx(passes_s)
    part = SimpleNamespace(streams=16, aggregate_tok_s=100.0, aggregate_predicted_tok_s=103.0)
    overhead_ms, physics_s = StreamsSummary.calibration_lap(part)
    assert physics_s == pytest.approx(16 / 103) and overhead_ms == pytest.approx((16 / 100 - 16 / 103) * 1e3)


def _ran(wall_s: float, factor: float):
    """What StudyBudget.charge reads of a finished run: its prefill and decode wall (scenario time) and its D."""
    return SimpleNamespace(wall_s=wall_s, ttft=None, dilation=SimpleNamespace(factor=factor))


def test_a_study_shares_one_budget_over_the_runs_it_plans():
    assert run_budget(7.0, None)[:2] == (7.0, None)  # outside a study: what the run was given
    with study_budget(120.0) as budget:
        plan_runs(4)
        share, cache, counted = run_budget(7.0, None)
        assert share == 30.0 and cache is budget.calibrations  # 120 s over 4 runs; one calibration cache for all
        counted(_ran(10.0, 3.0))  # 10 s of scenario time at D = 3: 30 s of the box's
        assert budget.spent_s == 30.0 and budget.planned == 3 and budget.runs == 1
        counted(_ran(2.0, 5.0))  # a run that took less leaves more to the rest
        assert run_budget(7.0, None)[0] == pytest.approx((120.0 - 40.0) / 2)
        own: dict = {}
        assert run_budget(7.0, own)[1] is own  # a cache the caller gives is kept
        counted(_ran(100.0, 1.0))
        assert run_budget(7.0, None)[0] == MIN_SHARE_S  # spent: D = 1 from here on, and each run says so
    with study_budget(100.0) as budget:
        assert run_budget(7.0, None)[0] == 100.0  # a study that plans nothing: one run at a time, all that is left
        budget.spent_s = 90.0
        assert run_budget(7.0, None)[0] == pytest.approx(10.0)
    assert run_budget(7.0, None)[:2] == (7.0, None)  # and nothing is left open after the block


def test_every_study_runs_inside_one_budget_and_a_run_keeps_its_own():
    from testbed.cli import build_parser
    from testbed.studies import STUDIES
    from testbed.studies.base import Study

    assert build_parser().parse_args(["run", "geo-ring"]).budget_s == BUDGET_S
    for study in STUDIES.values():
        if study.scenario:
            assert study.parser().parse_args(["geo-ring"]).budget_s == STUDY_BUDGET_S, study.name
    seen = []
    probe = Study("probe", "a study that looks at its budget", lambda parser: None,
                  lambda args, console: seen.append(run_budget(7.0, None)[0]), lambda result, args, console: None)
    probe.measure(probe.parser().parse_args(["geo-ring", "--budget-s", "12"]), console=None)
    assert seen == [12.0]


# --- real rings (slow) -------------------------------------------------------------------------

METRO_HOPS_MS = [0.7, 0.7, 0.7]  # seed 000 Table 2's metro row: the testbed's overhead is ~10% of its lap
DILATION = 16.0


@pytest.fixture(scope="module")
def metro(tmp_path_factory):
    """The metro ring undilated and at D = 16, and the dilated run's laps (its lap log)."""
    scenario = ring_scenario(METRO_HOPS_MS, compute_ms=11.0, tokens=24)
    lap_log = tmp_path_factory.mktemp("metro") / "laps.jsonl"
    dilated = run_dilated(scenario, DILATION, lap_log=lap_log)
    laps = read_lap_log(lap_log)
    return scenario, run(scenario, "userspace"), dilated, [lap for lap in laps if lap.kind in DECODE_KINDS]


def run_dilated(scenario, dilation, compensate=False, lap_log=None):
    from testbed.launch.launcher import run_scenario

    async def main():
        with trio.fail_after(240):
            return await run_scenario(scenario, "userspace", log=lambda m: None, dilation=dilation,
                                      compensate=compensate, runlog=RunLog(scenario, lap_log=lap_log))

    return trio.run(main)


@pytest.mark.fidelity
def test_dilation_divides_the_overhead_and_keeps_the_wall(metro):
    scenario, plain, dilated, laps = metro
    lap_s = scenario.emulated_compute_s + scenario.t_ring_s
    # the figures are in scenario time: the same C and the same wall, whatever D
    assert dilated.dilation.factor == DILATION and dilated.dilation.requested == f"{DILATION:g}"
    t_ring_s = scenario.t_ring_s + dilated.serialization_s  # and the frames' bytes at the links' rates
    # A pass is padded to max(cost, D x its real forward pass) (agents.process.ring): C is the cost, but for a real pass that
    # ran past it on this busy box (a 20 ms stall is 320 ms at D = 16, +2% on the run's C in CI), read from the laps.
    costs = [stage.emulated_ms / 1e3 for stage in dilated.per_stage]
    padded = [sum(max(c, DILATION * r) for c, r in zip(costs, lap.stage_real_s())) for lap in laps]
    late = scenario.n_stages * REAL_HOP_OVERHEAD_BUDGET_MS / (scenario.emulated_compute_s * 1e3 * DILATION)
    assert len(laps) == dilated.laps and min(padded) == pytest.approx(scenario.emulated_compute_s)
    assert dilated.compute_s == pytest.approx(sum(padded) / len(padded), rel=late)
    assert dilated.predicted_tok_s == pytest.approx(physics.wall_rate(dilated.compute_s, t_ring_s))  # the measured C's
    # beyond that compute, within the overhead budget divided by D: 2 x tighter than undilated at D = 2, 16 x at D = 16
    tolerance = rate_tolerance(scenario.n_stages, lap_s, real=True)
    assert dilated.measured_tok_s == pytest.approx(dilated.predicted_tok_s, rel=tolerance / DILATION)
    assert abs(dilated.error_pct) < abs(plain.error_pct)  # measured side by side: dilation is what helps
    for hop, link in zip(dilated.per_hop, scenario.ring):
        assert link.delay_ms - 0.05 <= hop.measured_ms_p50 <= link.delay_ms + REAL_HOP_OVERHEAD_BUDGET_MS / DILATION, hop
    assert dilated.dilation.applied_ms == pytest.approx(tuple(DILATION * d for d in METRO_HOPS_MS))


@pytest.mark.fidelity
def test_auto_dilation_makes_a_short_ring_precise():
    scenario = ring_scenario(METRO_HOPS_MS, compute_ms=11.0, tokens=8)  # 8 laps: a large D stays short
    s = run_dilated(scenario, "auto")
    d = s.dilation
    assert d.requested == "auto" and not d.compensate and d.overhead_ms > 0
    assert d.factor == min(d.cap, max(1, -(-d.needed // 1)))  # the smallest whole D that meets the target
    assert d.applied_ms == pytest.approx(tuple(d.factor * h for h in METRO_HOPS_MS))
    lap_s = scenario.emulated_compute_s + scenario.t_ring_s
    assert s.measured_tok_s == pytest.approx(s.predicted_tok_s, rel=rate_tolerance(scenario.n_stages, lap_s, real=True) / d.factor)
    for hop, link in zip(s.per_hop, scenario.ring):
        assert link.delay_ms - 0.05 <= hop.measured_ms_p50 <= link.delay_ms + REAL_HOP_OVERHEAD_BUDGET_MS / d.factor, hop


@pytest.mark.fidelity
def test_compensation_takes_the_calibrated_base_off_each_link():
    """The mechanism, not a precision claim: the calibrated base is measured at zero delay, where the relay's
    own wake-up is not hidden behind a delay, so it can exceed what a delayed hop costs (see the bench)."""
    scenario = ring_scenario([2.0, 2.0, 2.0], compute_ms=11.0, tokens=8)
    s = run_dilated(scenario, 4.0, compensate=True)
    d = s.dilation
    assert d.factor == 4.0 and d.compensate and d.requested == "4" and len(d.base_ms) == 3
    assert all(b > 0 for b in d.base_ms)  # sockets and wake-ups cost something even at zero delay
    assert d.applied_ms == pytest.approx(tuple(max(0.0, 4.0 * 2.0 - b) for b in d.base_ms))
    for hop, applied in zip(s.per_hop, d.applied_ms):  # the shaper applied the compensated delay: never less
        assert hop.measured_ms_p50 >= applied / 4.0 - 0.05, (hop, d)


@pytest.mark.parametrize("bad", ["0.3", "fast", "65"])
def test_the_cli_rejects_a_bad_dilation_naming_the_option(bad, capsys):
    from testbed import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "geo-ring", "--dilation", bad])
    assert exit_info.value.code == 2
    assert f"argument --dilation: expected a number in [1, 64] or auto, got '{bad}'" in capsys.readouterr().err


def test_run_and_every_study_take_a_budget_and_refuse_a_bad_one(capsys):
    from testbed import cli
    from testbed.studies import STUDIES

    for study in STUDIES.values():  # every study that runs a scenario passes it on (budget_s=args.budget_s)
        args, _ = study.parser().parse_known_args((["geo-ring"] if study.scenario else []) + ["--budget-s", "5"])
        # a study that runs nothing on a real backend (acceptance: the models in-process), or only transfers whose
        # figures need no dilation (transport; weights' --real takes its own), has no budget to take
        assert args.budget_s == 5.0 if hasattr(args, "dilation") else study.name in (
            "bench", "acceptance", "transport", "weights"), study.name
    for command in ("run", "plan", "regimes", "whatif"):
        with pytest.raises(SystemExit) as exc:
            cli.main([command, *(["geo-ring"] if command != "whatif" else []), "--budget-s", "0"])
        assert exc.value.code == 2
        assert "--budget-s: expected seconds in (0, 86400], got '0'" in capsys.readouterr().err


def test_a_rated_links_serialization_is_physics_not_overhead():
    """At zero delay a rated link still takes bytes / rate a frame: calibration counts it as the lap's physics
    (the prediction has it), not as overhead for D to divide, nor as base latency to compensate."""
    sc = fake_scenario("plain")
    rated = dataclasses.replace(sc, links=tuple(dataclasses.replace(link, rate_mbit=1.0) for link in sc.links))
    serialization_ms = 560 / (1e6 / 8) * 1e3  # the fake laps' 560-byte frames at 1 Mbit/s: 4.48 ms a hop
    calibration = calibration_from(canned_calibration(rated, base_ms=0.5 + serialization_ms, residual_ms=0.4), rated)
    assert calibration.base_ms == pytest.approx((0.5, 0.5, 0.5))
    assert calibration.overhead_ms == pytest.approx(3 * 0.5 + 0.4)
    assert calibration.serialization_s == pytest.approx(3 * serialization_ms / 1e3)
    chosen = choose(rated, calibration, budget_s=1e9)
    assert chosen.lap_ms == pytest.approx((calibration.compute_s + rated.t_ring_s) * 1e3 + 3 * serialization_ms)


def test_a_study_row_shows_its_d_and_where_capped_the_error_left():
    from testbed.studies.base import dilation_cell, dilation_of

    sc = load_scenario("geo-ring")
    summary = summarize(RunLog(sc))
    assert dilation_of(summary) == {"dilation": 1.0, "capped_error_pct": None}
    capped = choose(sc, Calibration(base_ms=(1.0,) * 3, overhead_ms=6.0, compute_s=0.033))
    row = dilation_of(dataclasses.replace(summary, dilation=capped))
    assert row == {"dilation": 2.0, "capped_error_pct": capped.expected_error_pct}
    assert dilation_cell(**{"factor": row["dilation"], "capped_error_pct": row["capped_error_pct"]}) == \
        f"2 cap {capped.expected_error_pct:+.2f}%"
    free = choose(sc, Calibration(base_ms=(1.0,) * 3, overhead_ms=6.0, compute_s=0.033), budget_s=1e4)
    assert dilation_cell(**{"factor": free.factor, "capped_error_pct": dilation_of(
        dataclasses.replace(summary, dilation=free))["capped_error_pct"]}) == f"{free.factor:g}"


def test_a_run_is_charged_the_entrys_own_box_time_where_it_reported_it():
    """Many requests in flight (serve, streams) overlap their laps: the laps' summed time x D overcounts the run, so
    the budget charges what the entry reported it spent (AgentUsage.box_wall_s of stage 0)."""
    with study_budget(100.0) as budget:
        plan_runs(2)
        ran = SimpleNamespace(wall_s=40.0, ttft=None, dilation=SimpleNamespace(factor=4.0),
                              agents=(SimpleNamespace(stage=1, box_wall_s=99.0), SimpleNamespace(stage=0, box_wall_s=12.5)))
        run_budget(7.0, None)[2](ran)
        assert budget.spent_s == 12.5 and run_budget(7.0, None)[0] == pytest.approx(87.5)
