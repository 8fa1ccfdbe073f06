"""The echo mode's own [decode] key: checked by its rule and its own check through the one registry line, carried
to the agents typed, and read by its runner (no file outside this folder names it)."""

from __future__ import annotations

import pytest
import trio

import agents.modes
from testbed.core.decode import DecodeConfig
from testbed.core.errors import ConfigError
from testbed.launch.launcher import run_scenario
from testbed.scenario.config import load_scenario
from tests import echo_mode
from tests.echo_mode.facts import EchoSummary
from tests.echo_mode.settings import EchoSettings
from tests.ringutil import RUN_TIMEOUT_S, ring_scenario

PROMPT = "def echo(x):\n    return x\n"


@pytest.fixture(autouse=True)
def echo_registered(monkeypatch):
    monkeypatch.setitem(agents.modes.MODES, "echo", echo_mode.INFO)  # the one registry line, settings included


def test_its_key_is_checked_by_its_rule_and_its_own_check():
    assert ring_scenario([1.0, 1.0], mode="echo").decode.settings(EchoSettings) == EchoSettings(echo_stride=1)
    with pytest.raises(ConfigError, match=r"decode.echo_stride: expected an integer in \[1, 8\], got 9"):
        ring_scenario([1.0, 1.0], mode="echo", echo_stride=9)
    with pytest.raises(ConfigError, match="decode.echo_stride: expected a power of two, got 3") as info:
        ring_scenario([1.0, 1.0], mode="echo", echo_stride=3)
    assert info.value.key == "decode.echo_stride" and info.value.source == "<test>"


def test_its_key_is_set_from_the_command_line_and_crosses_to_the_agents_typed():
    scenario = load_scenario("geo-ring", ["decode.mode=echo", "decode.echo_stride=4"])
    assert scenario.decode.settings(EchoSettings).echo_stride == 4
    assert DecodeConfig.from_json(scenario.decode.to_json()) == scenario.decode
    with pytest.raises(ConfigError, match="decode.echo_strid: unknown key"):
        load_scenario("geo-ring", ["decode.echo_strid=4"])


def test_its_runner_reads_it():
    scenario = ring_scenario([2.0, 2.0], compute_ms=3.0, tokens=len(PROMPT), mode="echo", prompt=PROMPT,
                             echo_stride=2)

    async def main():
        with trio.fail_after(RUN_TIMEOUT_S):
            return await run_scenario(scenario, "virtual", log=lambda m: None)

    summary = trio.run(main)
    positions = range(0, len(PROMPT), 2)
    assert summary.text == PROMPT[::2] and summary.echo == EchoSummary(len(positions), 0, positions[-1])
