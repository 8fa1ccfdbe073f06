"""Several hosts with kernel egress shaping: namespaces as hosts (tests/hostsutil.py), each node shaping its own
eth0 per peer with netem (`testbed.hosts.node --shape egress`, netem.hostnet + netem.egress).

Needs root and sch_netem (plus sch_htb and cls_u32): on this project's kernel, inside user-mode-linux:
    python -m netem.uml --timeout 900 -- .venv/bin/python -m pytest -m netem tests/test_netem_nodes.py -v

- the geo ring (scaled x0.1: hops 13, 4, 11 ms) runs through torchrun with every node's hop shaped on its
  egress: each hop's measured one-way latency is at least its delay (less the clock bound) and within the
  user-mode-linux per-hop budget above it (tests/test_netem_ring.py measured 0.8-2.9 ms there at D = 1);
  the entry's summary lists what its egress shaper applied; no egress qdisc is left on any host;
- a node killed with SIGKILL leaves no qdisc either: its keeper process removes them when the node's pipe
  closes (the node's egress shaper alone in its namespace, killed; no torchrun needed for that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.test_netem_egress import classful_modules  # noqa: F401 - autouse: insmod htb and u32 inside UML
from tests.hostsutil import N, ROOT, assert_nothing_left, run_all
from testbed.api import scenario as load
from testbed.core.summary import RunSummary

pytestmark = pytest.mark.netem
UML_HOP_BUDGET_MS = 4.0  # tests/test_netem_ring.py: per-hop p50 - configured 0.8-2.9 ms in UML at D = 1
SCENARIO = ("geo-ring", "--set", "scale=0.1", "--shape", "egress")


def test_egress_shaped_hosts_run_the_ring(hosts, tmp_path):
    out = tmp_path / "egress.json"
    codes, logs = run_all(hosts, tmp_path, *SCENARIO, "--tokens", "12", "--json", str(out))
    assert codes == [0] * N, "\n".join(logs)
    assert_nothing_left(hosts)
    s = RunSummary.from_json(out.read_text())
    facts = s.shaper_facts
    print("\n".join([*facts["applied"], *(line for line in logs[0].splitlines() if not line.startswith("["))]))
    assert facts["backend"] == "egress" and facts["iface"] == "eth0"
    assert len(facts["applied"]) == 1 and f"{hosts.address(1)}:" in facts["applied"][0], facts["applied"]
    for hop, link in zip(facts["hops"], load("geo-ring", overrides=["scale=0.1"]).ring):
        assert hop["min_ms"] >= link.delay_ms - hop["bound_ms"], hop  # the netem delay is there
        # and no more than it: held by the hop's fastest lap, not its median. Across hosts inside UML the median of
        # 11 laps rides on the guest's wake-ups (seen: 0->1 p50 +5.1 ms, min +0.7 ms in one run, the next within
        # budget); the fastest lap is the delay netem applied plus the path, which a wrong delay would move.
        assert hop["min_ms"] <= link.delay_ms + UML_HOP_BUDGET_MS, hop


# A node's egress shaper (netem.hostnet.EgressShaper, what testbed.hosts.node builds for --shape egress), alone in
# host 2's namespace: no torchrun and no torch, so the check costs seconds where a killed three-node run cost 77 s
# inside user-mode-linux (the run ending by name when a node dies is tests/test_nodes.py's, on the relay).
SHAPER_ALONE = """
import trio
from netem.hostnet import EgressShaper
from testbed.core.records import LinkSpec

async def main():
    shaper = EgressShaper([LinkSpec(2, 0, 11.0)], 3, "killed", iface="eth0")
    await shaper.connect({{0: ("{peer}", 29500)}})
    print("applied", flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


def test_a_killed_egress_node_leaves_no_qdisc(hosts):
    node = subprocess.Popen(["ip", "netns", "exec", hosts.names[2], sys.executable, "-c",
                             SHAPER_ALONE.format(peer=hosts.address(0))],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        assert node.stdout is not None
        assert node.stdout.readline().strip() == "applied", node.stdout.read()
        assert "6772:" in hosts.qdiscs(2), hosts.qdiscs(2)
        assert any("netem.hostnet" in cmd for cmd in hosts.processes(2).values()), hosts.processes(2)
        os.kill(node.pid, signal.SIGKILL)  # as a crash would: no aclose, only the keeper's stdin closing
        node.wait(timeout=30)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    assert_nothing_left(hosts)  # the keeper saw EOF, removed its qdiscs and exited
