"""The decode-mode seam: a new mode is one folder plus one registry line, and the whole testbed picks it up."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry

import agents.modes
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary
from testbed.launch.collector import RunCollector
from testbed.launch.runlog import RunLog, read_lap_log
from tests import echo_mode
from tests.echo_mode.facts import Echoed, EchoSummary
from tests.ringutil import RUN_TIMEOUT_S, ring_scenario

ECHO = echo_mode.INFO  # its card: ModeInfo("echo", "tests.echo_mode", metric_kind="echo")
PROMPT = "def echo(x):\n    return x\n"
DATA = Path(__file__).parent / "data"


@pytest.fixture
def echo_registered(monkeypatch):
    monkeypatch.setitem(agents.modes.MODES, "echo", ECHO)  # the one registry line


def test_an_unknown_mode_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match="decode.mode: expected one of plain, speculative"):
        ring_scenario([1.0, 1.0], mode="echo")


def test_a_registered_mode_runs_on_a_real_ring_and_is_summarized_and_exported(echo_registered, tmp_path):
    """Its runner runs on the agents, its typed facts come back with its laps (and out of the lap log), and its
    run-log part exports its own family: the run log, the collector and the summary name no mode."""
    from testbed.launch.launcher import run_scenario

    scenario = ring_scenario([2.0, 2.0, 2.0], compute_ms=3.0, tokens=len(PROMPT), mode="echo", prompt=PROMPT)
    log = RunLog(scenario, lap_log=tmp_path / "laps.jsonl")

    async def main():
        with trio.fail_after(RUN_TIMEOUT_S):
            return await run_scenario(scenario, "virtual", runlog=log, log=lambda m: None)

    summary = trio.run(main)
    log.close()
    assert summary.mode == "echo" and summary.text == PROMPT  # the ring carried every byte back in order
    assert summary.tokens == summary.laps == len(PROMPT)
    assert summary.measured_tok_s == pytest.approx(1 / (scenario.emulated_compute_s + scenario.t_ring_s), rel=1e-6)
    laps = read_lap_log(tmp_path / "laps.jsonl")
    echoed = [lap.facts for lap in laps if lap.kind == "decode"]
    assert echoed == [Echoed(i, byte) for i, byte in enumerate(PROMPT.encode())]
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    assert registry.get_sample_value("testbed_laps_total", {"kind": "echo"}) == len(PROMPT)
    assert registry.get_sample_value("testbed_echo_bytes_total") == len(PROMPT)  # its own family, from metrics.PART
    # its summary part (summary.py -> card.summary) is a field of the JSON of its own, and reads back typed
    assert summary.echo == EchoSummary(bytes=len(PROMPT), first=0, last=len(PROMPT) - 1) == summary.parts["echo"]
    assert json.loads(summary.to_json())["echo"] == {"bytes": len(PROMPT), "first": 0, "last": len(PROMPT) - 1}
    assert RunSummary.from_json(summary.to_json()) == summary and summary.spec is None


def test_a_summary_without_the_modes_part_reads_as_before(echo_registered):
    """The recorded summaries (tests/data) read back with every registered mode's field, null or not, where it was."""
    recorded = json.loads((DATA / "summary-speculative.json").read_text())
    summary = RunSummary.from_dict(recorded)
    assert summary.spec.k_star == recorded["spec"]["k_star"] and summary.streams is None and summary.echo is None
    written = json.loads(summary.to_json())
    assert written["spec"] == json.loads(summary.spec.to_json()) and written["echo"] is None
    assert list(written).index("spec") == list(recorded).index("spec")  # where the modes' fields always stood
    assert {"spec", "streams", "echo"} <= {f.name for f in dataclasses.fields(summary)}  # real fields, not a lookup
    assert "spec" in {f.name for f in dataclasses.fields(RunSummary)}
    with pytest.raises(AttributeError, match="no attribute 'spek'"):
        summary.spek
    with pytest.raises(ValueError, match=r"RunSummary.echo: unknown field\(s\) bites"):
        RunSummary.from_dict({**recorded, "echo": {"bites": 1, "first": 0, "last": 0}})


def test_the_registry_line_says_where_the_head_may_sit_and_which_laps_are_decode(monkeypatch):
    from testbed.scenario.config import scenario_from_dict
    from testbed.core.lapstats import DECODE_KINDS

    assert DECODE_KINDS == agents.modes.decode_lap_kinds() == ("decode", "overlap", "spec", "tree")  # every mode's lap_kind
    raw = {"stages": [{"name": f"s{i}"} for i in range(3)], "network": {"hops_ms": [1.0, 1.0, 1.0]},
           "decode": {"mode": "echo"}, "placement": {"head": "last"}}
    monkeypatch.setitem(agents.modes.MODES, "echo", ECHO)
    with pytest.raises(ConfigError, match="'last' runs plain decode or tree decode, not 'echo'") as info:
        scenario_from_dict(raw, "<test>")
    assert info.value.key == "placement.head"
    monkeypatch.setitem(agents.modes.MODES, "echo", dataclasses.replace(ECHO, heads=("entry", "last")))
    assert scenario_from_dict(raw, "<test>").placement.head == "last"  # the mode's own line allows it


def test_the_registry_line_says_what_a_mode_becomes_with_several_streams_or_an_edge_draft(monkeypatch):
    """Several streams and an edge draft turn a mode into another (plain -> streams, speculative -> dsd) by what its
    ModeInfo says, not by a mode named in the scenario rules."""
    from testbed.scenario.config import scenario_from_dict

    def scenario(decode, **more):
        return scenario_from_dict({"stages": [{"name": f"s{i}"} for i in range(3)],
                                   "network": {"hops_ms": [1.0, 1.0, 1.0]}, "decode": decode, **more}, "<test>")

    monkeypatch.setitem(agents.modes.MODES, "echo", ECHO)
    with pytest.raises(ConfigError, match="'echo' runs one stream; several streams need mode 'plain' or 'streams'"):
        scenario({"mode": "echo", "streams": 3})
    with pytest.raises(ConfigError, match="decode.mode must be 'speculative', not 'echo'"):
        scenario({"mode": "echo"}, spec={"placement": "edge"})
    monkeypatch.setitem(agents.modes.MODES, "echo", dataclasses.replace(ECHO, streams_as="echo", edge_as="echo"))
    assert scenario({"mode": "echo", "streams": 3}).decode.mode == "echo"
    assert scenario({"mode": "echo", "k": 4}, spec={"placement": "edge"}).decode.mode == "echo"
    assert scenario({"mode": "plain", "streams": 3}).decode.mode == "streams"
    assert scenario({"mode": "speculative", "k": 4}, spec={"placement": "edge"}).decode.mode == "dsd"
