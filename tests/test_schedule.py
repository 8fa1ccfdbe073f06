"""A moving network (issue 15): link schedules and traces, applied live by the relay; partitions."""

import time

import pytest
import trio

from netem.userspace import LinkTiming
from testbed.scenario.config import scenario_from_dict
from testbed.core.errors import AgentFailed, ConfigError, leaf_errors
from tests.ringutil import run


def scenario(schedule, hops=(10.0, 10.0), tokens=60, **network):
    return scenario_from_dict({"stages": [{"name": "a", "compute_ms": 5.0}, {"name": "b", "compute_ms": 5.0}],
                               "network": {"hops_ms": list(hops), "schedule": schedule, **network},
                               "decode": {"tokens": tokens, "temperature": 0.0}}, "<test>")


def test_events_are_sorted_scaled_and_named(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text("# t_s delay_ms\n0 5\n0.5 7.5\n2 20\n")
    sc = scenario_from_dict({"stages": [{"name": "a"}, {"name": "b"}], "scale": 2.0,
                             "network": {"hops_ms": [1.0, 1.0], "schedule": [
                                 {"link": "1->0", "at_s": 3.0, "down_s": 0.5},
                                 {"link": "0->1", "trace": str(trace)}]}}, "<test>")
    assert [(e.link, e.at_s, e.delay_ms, e.down_s) for e in sc.schedule] == [
        ("0->1", 0.0, 10.0, 0.0), ("0->1", 1.0, 15.0, 0.0), ("0->1", 4.0, 40.0, 0.0), ("1->0", 6.0, None, 1.0)]
    dilated = sc.dilated(3.0).schedule
    assert dilated[-1].at_s == 18.0 and dilated[-1].down_s == 3.0 and dilated[1].delay_ms == 45.0


@pytest.mark.parametrize("event, key, words", [
    ({"link": "0->5", "at_s": 1, "delay_ms": 5}, "network.schedule[0].link", "no link 0->5"),
    ({"link": "0-1", "at_s": 1, "delay_ms": 5}, "network.schedule[0].link", "like"),
    ({"link": "0->1", "at_s": 1, "delay_ms": 5, "down_s": 1}, "network.schedule[0]", "either"),
    ({"link": "0->1", "delay_ms": 5}, "network.schedule[0].at_s", "at_s"),
    ({"link": "0->1", "at_s": 1, "loss_pct": 101}, "network.schedule[0].loss_pct", "100"),
    ({"link": "0->1", "trace": "/nonexistent/trace.txt"}, "network.schedule[0]", "cannot read"),
])
def test_bad_events_name_the_key(event, key, words):
    with pytest.raises(ConfigError) as info:
        scenario([event])
    assert info.value.key == key and words in str(info.value)


def test_the_relay_swaps_its_timing_and_holds_a_partition():
    events = ({"at_s": 1.0, "delay_ms": 50.0}, {"at_s": 2.0, "down_s": 0.5})
    timing = LinkTiming(0.010, events=events)
    assert timing.deadline(0.5, 100) == pytest.approx(0.510)  # no origin yet: the schedule has not started
    timing.origin = 10.0
    assert timing.deadline(10.5, 100) == pytest.approx(10.510)
    assert timing.deadline(11.2, 100) == pytest.approx(11.250)  # delay 50 ms from t = 1 s
    assert timing.deadline(12.1, 100) == pytest.approx(12.550)  # down from 2 s to 2.5 s: sent when back
    assert timing.deadline(12.6, 100) == pytest.approx(12.650)


def test_a_delay_change_shows_in_the_laps_and_a_short_partition_only_delays_them():
    from testbed.launch.launcher import run_scenario
    from testbed.launch.runlog import RunLog

    sc = scenario([{"link": "0->1", "at_s": 1.0, "delay_ms": 30.0}, {"link": "1->0", "at_s": 2.0, "down_s": 0.4}],
                  tokens=70)
    log = RunLog(sc)

    async def main():
        with trio.fail_after(120):
            return await run_scenario(sc, "virtual", runlog=log, log=lambda m: None)

    summary = trio.run(main)
    assert summary.generated_tokens == 70 and summary.shaper == "virtual"
    origin = log.schedule_origin
    laps = [lap for lap in log.laps if lap.kind == "decode"]
    before = [lap.hop_latencies_s()[0] for lap in laps if lap.end < origin + 0.9]
    after = [lap.hop_latencies_s()[0] for lap in laps if lap.start > origin + 1.1]
    assert before and after
    # 10 ms, then 30 ms on 0->1, exactly (simulated time): none before the change took the new delay
    assert all(abs(h - 0.010) < 1e-9 for h in before) and all(abs(h - 0.030) < 1e-9 for h in after), (before, after)
    held = [lap.hop_latencies_s()[1] for lap in laps if origin + 1.9 < lap.start < origin + 2.4]
    # a frame that met the partition waited for its end (origin + 2.4 s), then for the link's 10 ms
    met = [lap for lap in laps if origin + 1.9 < lap.start < origin + 2.4 and lap.hop_latencies_s()[1] > 0.011]
    assert met and all(abs(lap.stamps[1].send + lap.hop_latencies_s()[1] - (origin + 2.4 + 0.010)) < 1e-9
                       for lap in met)
    assert max(held) == pytest.approx(0.4, abs=0.1)


def test_a_partition_longer_than_the_lap_timeout_ends_the_run_naming_the_link():
    sc = scenario([{"link": "1->0", "at_s": 1.0, "down_s": 30.0}], tokens=100_000, lap_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(BaseException) as info:
        run(sc)
    took = time.monotonic() - started
    failures = [e for e in leaf_errors(info.value) if isinstance(e, AgentFailed)]
    assert failures and "link 1->0 is down by the schedule" in str(failures[0]), info.value
    assert "no frame from upstream within 1.5 s" in str(failures[0])
    assert took < 1.0 + 1.5 + 2.0 + 10.0  # the partition, the timeout, 2 s to report, the agents' start


def test_the_dashboard_marks_schedule_events():
    from dashboards.render import render, schedule_line
    from testbed.launch.runlog import RunLog
    from testbed.launch.summarize import summarize

    sc = scenario([{"link": "0->1", "at_s": 1.0, "delay_ms": 30.0}, {"link": "1->0", "at_s": 5.0, "down_s": 0.4}])
    log = RunLog(sc)
    log.schedule_origin = time.monotonic() - 2.0  # two seconds into the run: the first event happened
    summary = summarize(log)
    assert [(at, happened) for at, _, happened in summary.schedule] == [(1.0, True), (5.0, False)]
    text = schedule_line(summary, 120).plain
    assert "*1s 0->1 delay_ms 30" in text and " 5s 1->0 down for 0.4 s" in text and "(1/2 done)" in text
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(render(summary, 120, 40))
    assert "schedule" in console.export_text()


def test_both_backends_plan_the_schedule():
    from netem.base import ShaperOptions
    from netem.kernel import KernelShaper
    from netem.userspace import UserspaceShaper

    sc = scenario([{"link": "0->1", "at_s": 1.0, "delay_ms": 30.0}, {"link": "1->0", "at_s": 2.0, "down_s": 0.4}])
    options = ShaperOptions(schedule=sc.schedule)
    for shaper in (UserspaceShaper(list(sc.links), 2, "t1", options), KernelShaper(list(sc.links), 2, "t1", options)):
        lines = shaper.plan_lines()
        assert any("1 s" in line and "0->1 delay_ms 30" in line for line in lines), lines
        assert any("2 s" in line and "1->0 down for 0.4 s" in line for line in lines), lines
