"""The virtual backend (netem.virtual): the same agents on simulated time, deterministic and exact."""

from __future__ import annotations

import dataclasses
import json

import pytest
import trio

from netem.virtual import WALL_CLOCK_FIELDS
from testbed import api
from testbed.scenario.config import scenario_from_dict
from testbed.core import physics, virtual_time
from testbed.core.errors import AgentFailed, ConfigError, leaf_errors
from testbed.launch.launcher import run_scenario
from testbed.launch.runlog import RunLog
from tests.ringutil import EXACT, ring_scenario, run


def run_logged(scenario, lap_log):
    log = RunLog(scenario, lap_log=lap_log)
    summary = trio.run(lambda: run_scenario(scenario, "virtual", runlog=log, log=lambda m: None))
    log.close()
    return summary


def without_wall_clock(summary) -> str:
    data = summary.to_dict()
    for key in WALL_CLOCK_FIELDS:
        data.pop(key)
    return json.dumps(data, sort_keys=True, default=str)


def test_the_same_scenario_and_seed_give_byte_identical_laps_and_summaries(tmp_path):
    """Speculation on a ring with jitter and loss on every link, and 4 streams under continuous batching: twice
    each; the lap logs are byte for byte the same, and the summaries but for the named wall-clock fields."""
    jittery = api.scenario("geo-ring", overrides=["scale=0.1", "decode.tokens=40", "decode.mode=\"speculative\"",
                                                  "decode.k=\"auto\"", "network.jitter_ms=2.0", "network.loss_pct=3.0"])
    batched = ring_scenario([3.0, 2.0, 4.0], compute_ms=2.0, tokens=12, mode="streams", streams=4,
                            batching="continuous")
    for name, scenario in (("spec", jittery), ("streams", batched)):
        first = run_logged(scenario, tmp_path / f"{name}-1.jsonl")
        second = run_logged(scenario, tmp_path / f"{name}-2.jsonl")
        laps = (tmp_path / f"{name}-1.jsonl").read_bytes()
        assert laps and laps == (tmp_path / f"{name}-2.jsonl").read_bytes()
        assert without_wall_clock(first) == without_wall_clock(second)
        assert first.shaper_facts["virtual"]["wall_clock_fields"] == list(WALL_CLOCK_FIELDS)


def test_the_scheduler_hook_virtual_time_relies_on_is_there():
    """virtual_time makes Trio's scheduler deterministic through two names of trio._core._run: a Trio that
    renames them must fail here, not make virtual runs quietly random."""
    from trio._core import _run

    assert hasattr(_run, "_r") and hasattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING")

    async def order() -> list[int]:
        seen: list[int] = []

        async def task(i: int) -> None:
            await trio.sleep(1.0)  # all wake at the same simulated moment: the scheduler picks the order
            seen.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(task, i)
        return seen

    runs = [virtual_time.run_sync(order) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2] and sorted(runs[0]) == list(range(20))
    assert virtual_time.run_sync(order, seed=1) != runs[0]  # the order is the seed's, not creation order


def test_stages_that_only_forward_make_long_rings_exact():
    n = 40
    stages = [{"name": f"s{i}", "compute_ms": 1.5, **({} if i < 6 else {"layers": 0})} for i in range(n)]
    sc = scenario_from_dict({"name": "long", "stages": stages, "network": {"hops_ms": [2.0] * n},
                             "decode": {"tokens": 6}}, "<test>")
    s = run(sc)
    assert s.stages == n and s.measured_tok_s == pytest.approx(physics.wall_rate(n * 1.5e-3, n * 2e-3), rel=EXACT)
    assert len(s.token_ids) == 6


def test_a_lap_of_zero_simulated_time_is_refused_by_name():
    with pytest.raises(ConfigError, match="no simulated time"):
        run(ring_scenario([0.0, 0.0], compute_ms=0.0, tokens=4))


def test_a_crashed_agent_is_named_and_the_run_ends(monkeypatch):
    """An agent task that raises ends the run with AgentFailed naming it and its last words, as a process would."""
    from agents.process.stage import PipelineStage

    real_run = PipelineStage.run

    def crash(self, hidden, pos, stream=0):
        if self.plan.stage == 2 and pos > 20:
            raise RuntimeError("stage 2 fell over")
        return real_run(self, hidden, pos, stream)

    monkeypatch.setattr(PipelineStage, "run", crash)
    with pytest.raises(BaseException) as info:
        run(ring_scenario([1.0, 1.0, 1.0], compute_ms=1.0, tokens=30))
    failures = [e for e in leaf_errors(info.value) if isinstance(e, AgentFailed)]
    assert failures and "2 (s2)" in str(failures[0]) and "stage 2 fell over" in str(failures[0]), info.value


def test_dilation_does_not_apply_and_says_so():
    said = []
    sc = ring_scenario([2.0, 2.0], compute_ms=1.0, tokens=4)
    s = trio.run(lambda: run_scenario(sc, "virtual", log=said.append, dilation=5.0))
    assert s.dilation is None and any("does not apply" in line for line in said)


def test_the_plan_names_the_in_memory_links(capsys):
    from testbed import cli

    assert cli.main(["plan", "geo-ring", "--shaper", "virtual"]) == 0
    out = capsys.readouterr().out
    assert "backend virtual" in out and "in-memory link 0->1 on simulated time: stage 0 -> stage 1, delay 130 ms" in out


def test_schedules_and_rates_follow_the_relays_model_exactly():
    """10 Mbit/s on every link: each hop is its delay plus the frame's serialization at the link rate, exactly."""
    sc = ring_scenario([4.0, 4.0, 4.0], compute_ms=2.0, tokens=8)
    sc = dataclasses.replace(sc, links=tuple(dataclasses.replace(link, rate_mbit=10.0) for link in sc.links))
    s = run(sc)
    for hop, link in zip(s.per_hop, sc.ring):
        assert hop.measured_ms_p50 == pytest.approx(link.delay_ms + hop.bytes_per_lap * 8 / 10e6 * 1e3, rel=EXACT)
    assert s.measured_tok_s == pytest.approx(s.predicted_tok_s, rel=EXACT)


def test_an_in_memory_connection_delivers_in_order_and_says_when_either_end_closed():
    from testbed.core.transport import memory_connection

    async def main() -> None:
        a, b = memory_connection()
        await a.send_all(b"one ")
        await a.send_all(memoryview(b"two"))
        assert await b.receive_some(5) == b"one t" and await b.receive_some() == b"wo"
        async with trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def read() -> None:
                got.append(await b.receive_some())

            nursery.start_soon(read)
            await trio.sleep(1)
            await a.aclose()  # the writer's close: what was sent, then the end
        assert got == [b""]
        c, d = memory_connection()
        await d.aclose()  # the reader's close: the writer's next send fails
        with pytest.raises(trio.BrokenResourceError):
            await c.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await d.receive_some()

    virtual_time.run_sync(main)
