"""One node's shaping (netem.hostnet) and the node command's errors without torchrun (testbed.hosts.node)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from netem.base import ShaperOptions
from netem.hostnet import DirectShaper, EgressShaper, node_shaper
from netem.userspace import UserspaceShaper
from testbed.core.errors import ShapingError
from testbed.core.records import LinkSpec

LINKS = [LinkSpec(1, 2, delay_ms=40.0)]


def test_each_kind_builds_its_shaper_and_says_why():
    assert isinstance(node_shaper("none", LINKS, 3, "n1"), DirectShaper)
    assert isinstance(node_shaper("relay", LINKS, 3, "n1"), UserspaceShaper)
    egress = node_shaper("egress", LINKS, 3, "n1", iface="eth0")
    assert isinstance(egress, EgressShaper) and "eth0" in egress.reason
    assert egress.plan_lines() == ["egress eth0 -> stage 2: netem delay 40 ms jitter 0 ms loss 0% rate 0 Mbit/s"]


def test_unshaped_links_dial_the_peer_itself():
    peers = trio.run(node_shaper("none", LINKS, 3, "n1").connect, {2: ("10.0.0.3", 4567), 0: ("10.0.0.1", 1)})
    assert peers == {(1, 2): ("10.0.0.3", 4567)}


@pytest.mark.parametrize("kind, iface, match", [("egress", None, "--iface"), ("bogus", None, "unknown --shape"),
                                               ("none", None, "schedule"), ("egress", "eth0", "schedule")])
def test_bad_choices_are_named(kind, iface, match):
    options = ShaperOptions(schedule=("an event",)) if match == "schedule" else None
    with pytest.raises(ShapingError, match=match):
        node_shaper(kind, LINKS, 3, "n1", iface=iface, options=options)


def test_the_node_outside_torchrun_says_how_to_start_it():
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "testbed.node", "geo-ring", "--no-dashboard"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "runs under torchrun" in result.stderr and "Traceback" not in result.stderr
