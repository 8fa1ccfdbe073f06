"""The decode-mode seam: a new mode is one module plus one registry line, and the whole testbed picks it up."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from tests.ringutil import ring_scenario, run
from testbed.run.collector import RunCollector
from testbed.core import decode
from testbed.core.decode import ModeInfo
from testbed.core.errors import ConfigError
from testbed.run.runlog import RunLog

ECHO = ModeInfo("echo", "tests.echo_mode:EchoMode", metric_kind="echo")
PROMPT = "def echo(x):\n    return x\n"


@pytest.fixture
def echo_registered(monkeypatch):
    monkeypatch.setitem(decode.MODES, "echo", ECHO)  # the one registry line


def test_an_unknown_mode_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match="decode.mode: expected one of plain, speculative"):
        ring_scenario([1.0, 1.0], mode="echo")


def test_a_registered_mode_runs_on_a_real_ring_and_is_summarized_and_exported(echo_registered):
    scenario = ring_scenario([2.0, 2.0, 2.0], compute_ms=3.0, tokens=len(PROMPT), mode="echo", prompt=PROMPT)
    summary = run(scenario)
    assert summary.mode == "echo" and summary.text == PROMPT  # the ring carried every byte back in order
    assert summary.tokens == summary.laps == len(PROMPT)
    assert summary.measured_tok_s == pytest.approx(1 / (scenario.emulated_compute_s + scenario.t_ring_s), rel=0.25)
    log = RunLog(scenario)
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    assert registry.get_sample_value("testbed_laps_total", {"kind": "echo"}) == 0


def test_the_registry_line_says_where_the_head_may_sit_and_which_laps_are_decode(monkeypatch):
    from testbed.scenario.config import scenario_from_dict
    from testbed.core.lapstats import DECODE_KINDS

    assert DECODE_KINDS == decode.decode_lap_kinds() == ("decode", "spec", "tree")  # every mode's lap_kind
    raw = {"stages": [{"name": f"s{i}"} for i in range(3)], "network": {"hops_ms": [1.0, 1.0, 1.0]},
           "decode": {"mode": "echo"}, "placement": {"head": "last"}}
    monkeypatch.setitem(decode.MODES, "echo", ECHO)
    with pytest.raises(ConfigError, match="'last' runs plain decode or tree decode, not 'echo'") as info:
        scenario_from_dict(raw, "<test>")
    assert info.value.key == "placement.head"
    monkeypatch.setitem(decode.MODES, "echo", dataclasses.replace(ECHO, heads=("entry", "last")))
    assert scenario_from_dict(raw, "<test>").placement.head == "last"  # the mode's own line allows it


def test_the_registry_line_says_what_a_mode_becomes_with_several_streams_or_an_edge_draft(monkeypatch):
    """Several streams and an edge draft turn a mode into another (plain -> streams, speculative -> dsd) by what its
    ModeInfo says, not by a mode named in the scenario rules."""
    from testbed.scenario.config import scenario_from_dict

    def scenario(decode, **more):
        return scenario_from_dict({"stages": [{"name": f"s{i}"} for i in range(3)],
                                   "network": {"hops_ms": [1.0, 1.0, 1.0]}, "decode": decode, **more}, "<test>")

    monkeypatch.setitem(decode.MODES, "echo", ECHO)
    with pytest.raises(ConfigError, match="'echo' runs one stream; several streams need mode 'plain' or 'streams'"):
        scenario({"mode": "echo", "streams": 3})
    with pytest.raises(ConfigError, match="decode.mode must be 'speculative', not 'echo'"):
        scenario({"mode": "echo"}, spec={"placement": "edge"})
    monkeypatch.setitem(decode.MODES, "echo", dataclasses.replace(ECHO, streams_as="echo", edge_as="echo"))
    assert scenario({"mode": "echo", "streams": 3}).decode.mode == "echo"
    assert scenario({"mode": "echo", "k": 4}, spec={"placement": "edge"}).decode.mode == "echo"
    assert scenario({"mode": "plain", "streams": 3}).decode.mode == "streams"
    assert scenario({"mode": "speculative", "k": 4}, spec={"placement": "edge"}).decode.mode == "dsd"
