"""Several hosts on one box: network namespaces as hosts (tests/hostsutil.py), one torchrun per namespace.

Each namespace runs `torchrun --rdzv-backend=c10d --rdzv-endpoint=<h0>:PORT -m testbed.node`; torchrun forms
the group, the nodes meet in its store and run the ring over the namespaces' addresses.

- the geo ring, each node shaping its links out with the userspace relay: measured vs 1/(C + T_ring) within
  the one-box overhead budget (tests/ringutil.py), per-hop one-way latency with the clock offsets' bounds below
  0.5 ms, every offset estimate's bound containing the true offset (0: the namespaces share one clock);
- unshaped, the real network's hops predict the run (the prediction uses the probes' round trips);
- a node killed with SIGKILL mid-run, and Ctrl-C on the entry's torchrun, end every node with an error naming
  the node, and no process is left in any namespace.
(The kernel egress shaping, --shape egress, runs in user-mode-linux: tests/test_netem_nodes.py.)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.hostsutil import N, Hosts, assert_nothing_left, kill_worker, run_all, wait_for_agents
from tests.ringutil import REAL_HOP_OVERHEAD_BUDGET_MS, rate_tolerance
from testbed.api import scenario as load
from testbed.core import physics
from testbed.core.summary import RunSummary

pytestmark = [pytest.mark.fidelity,
              pytest.mark.skipif(os.geteuid() != 0, reason="namespaces as hosts need root")]


def test_the_geo_ring_across_three_hosts_meets_the_wall(hosts, tmp_path):
    out = tmp_path / "geo.json"
    codes, logs = run_all(hosts, tmp_path, "geo-ring", "--shape", "relay", "--tokens", "24", "--json", str(out))
    assert codes == [0, 0, 0], "\n".join(logs)
    assert_nothing_left(hosts)
    s = RunSummary.from_json(out.read_text())
    sc = load("geo-ring")
    predicted = physics.wall_rate(s.compute_s, sc.t_ring_s)
    assert s.measured_tok_s == pytest.approx(predicted, rel=rate_tolerance(sc.n_stages, s.compute_s + sc.t_ring_s, real=True))
    facts = s.shaper_facts
    assert [n["address"] for n in facts["nodes"]] == [hosts.address(i) for i in range(N)]
    for node in facts["nodes"][1:]:
        assert node["bound_ms"] < 0.25 and abs(node["offset_ms"]) <= node["bound_ms"] + 1e-3, node  # one clock: 0
    for hop, link in zip(facts["hops"], sc.ring):
        assert hop["bound_ms"] < 0.5, hop
        assert link.delay_ms - hop["bound_ms"] <= hop["min_ms"], hop  # never faster than the link's delay
        assert hop["p50_ms"] <= link.delay_ms + REAL_HOP_OVERHEAD_BUDGET_MS, hop  # the one-box per-hop budget
    assert facts["clock_violations"] == 0
    assert "offset ms" in logs[0] and "measured p50 ms" in logs[0]  # the entry's node table


def test_unshaped_hosts_are_predicted_from_the_measured_network(hosts, tmp_path):
    out = tmp_path / "plain.json"
    codes, logs = run_all(hosts, tmp_path, "geo-ring", "--tokens", "16", "--json", str(out))
    assert codes == [0, 0, 0], "\n".join(logs)
    s = RunSummary.from_json(out.read_text())
    hops = s.shaper_facts["hops"]
    assert [h["expected_ms"] for h in hops] == [130.0, 40.0, 110.0]  # the scenario's, reported as expected
    # the bridge, not the geo ring: its median well under a ms or two; a mean of a few laps may carry a late one
    # (a box busy beside the run: seen 1.8 and 2.2 ms against p50s of 0.4-0.5), still far from 40-130 ms
    assert all(h["p50_ms"] < 2.0 and h["mean_ms"] < 0.1 * h["expected_ms"] for h in hops), hops
    assert s.t_ring_s * 1e3 < 1.0  # the prediction's T_ring is the probes' (min RTT / 2 per hop)
    lap = 1 / s.measured_tok_s
    assert s.measured_tok_s == pytest.approx(physics.wall_rate(s.compute_s, s.t_ring_s),
                                             rel=rate_tolerance(N, lap, real=True))


def start_long_run(hosts: Hosts, tmp_path: Path, settle_s: float = 6.0):
    logs = [tmp_path / f"node{i}.log" for i in range(N)]
    procs = [hosts.start(i, "geo-ring", "--shape", "relay", "--tokens", "400", log=logs[i]) for i in range(N)]
    wait_for_agents(hosts)
    time.sleep(settle_s)
    return procs, logs


# 6 s: connected, probed and decoding (on a quiet box); 0.5 s: the nodes still meeting and connecting, where a node's
# death once went unseen until a start-up timeout (the heartbeats were watched only once every node was ready)
@pytest.mark.parametrize("settle_s", [6.0, 0.5], ids=["decoding", "starting"])
def test_a_killed_node_ends_the_run_naming_it(hosts, tmp_path, settle_s):
    procs, logs = start_long_run(hosts, tmp_path, settle_s)
    kill_worker(hosts, 2)
    killed = time.monotonic()
    code = procs[0].wait(timeout=60)
    took = time.monotonic() - killed
    entry = logs[0].read_text()
    assert code != 0 and "node 2 (new-york" in entry, entry
    assert took < 15, took  # heartbeat timeout 2 s, then teardown
    for proc in procs[1:]:
        proc.wait(timeout=60)
    assert_nothing_left(hosts)


def test_ctrl_c_on_the_entry_stops_every_node(hosts, tmp_path):
    procs, logs = start_long_run(hosts, tmp_path)
    os.killpg(procs[0].pid, signal.SIGINT)  # the terminal's Ctrl-C reaches the whole foreground group
    codes = [proc.wait(timeout=60) for proc in procs]
    assert all(code != 0 for code in codes), codes
    for log in logs[1:]:
        text = log.read_text()
        assert "node 0 (hong-kong" in text and "stopped" in text, text
    assert_nothing_left(hosts)
