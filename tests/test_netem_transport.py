"""Transport "kernel" on the netem backend: the kernel's TCP left untuned (but Reno), the ACKs' way back delayed, and
a checkpoint's shards fetched over the links as real bytes (testbed.launch.weights).

Needs root and a kernel with sch_netem; on these machines it runs inside user-mode-linux:

    python -m netem.uml -- .venv/bin/python -m pytest -m netem tests/test_netem_transport.py -q
"""

from __future__ import annotations

import os
import secrets

import pytest
import trio

from netem.kernel import KernelShaper
from netem.netlink import read_qdisc, read_routes
from netem.nsutil import read_sysctl
from netem.base import ShaperOptions
from testbed.core.records import LinkSpec
from testbed.launch.weights import Route, distribute, predict_node_s
from agents.weights import manifest

pytestmark = [pytest.mark.netem, pytest.mark.usefixtures("netem_capable")]

RING = [LinkSpec(0, 1, delay_ms=10.0, rate_mbit=100.0), LinkSpec(1, 2, delay_ms=20.0), LinkSpec(2, 0, delay_ms=5.0)]


async def test_kernel_transport_leaves_the_kernel_defaults_and_delays_the_acks():
    shaper = KernelShaper(RING, 3, secrets.token_hex(4), ShaperOptions(transport="kernel"))
    assert not shaper.warm_windows  # a cold connection stays cold: no warm-up frame before the first lap
    async with shaper:
        plan = shaper.plan
        for ns in plan.namespaces:
            assert read_sysctl(ns.name, "net/ipv4/tcp_congestion_control") == "reno"
            assert read_sysctl(ns.name, "net/ipv4/tcp_slow_start_after_idle") == "1"  # the kernel's default
            assert all(not route["initcwnd"] for route in read_routes(ns.name))
        for q in plan.ack_qdiscs:  # the way back of 0->1 is 1->0, delayed by 0->1's delay, no rate
            got = read_qdisc(q.namespace, q.ifname)
            assert got["kind"] == "netem" and got["latency_ns"] == round(q.link.delay_ms * 1e6)
            assert got["rate_bytes_s"] == 0
        assert sorted((q.link.src, q.link.dst) for q in plan.ack_qdiscs) == [(0, 2), (1, 0), (2, 1)]


DILATION = 4.0  # the guest moves every byte through Python and ptrace'd syscalls: D divides that against the link


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    origin = tmp_path_factory.mktemp("origin")
    for i in range(2):
        (origin / f"stage{i}.safetensors").write_bytes(os.urandom(2 * 2**20 + 777 * i))
    return origin, [[f"stage{i}.safetensors"] for i in range(2)]


@pytest.fixture(scope="module")
def guest_cost(shards, tmp_path_factory):
    """Each node's fetch over links of no delay and no rate limit, in the same guest: what the guest itself takes
    (HTTP in Python, hashing, ptrace'd syscalls), the budget a shaped fetch may exceed its closed form by."""
    origin, files = shards
    done = trio.run(lambda: distribute([Route(0.0), Route(0.0)], files, origin, tmp_path_factory.mktemp("free"),
                                       shaper_kind="netem", streams=4))
    return [node.seconds for node in done.nodes]


@pytest.mark.parametrize("transport", ["kernel"])  # "tuned" on netem measured the same way (docs/studies/weights.md)
def test_shards_cross_netem_links_at_their_closed_form(transport, shards, guest_cost, tmp_path):
    """Two nodes fetch 2 MiB each from an origin 20 and 40 ms away at 50 Mbit/s, with 4 range streams, at D = 4: the
    files arrive whole, and each node's time is its closed form's (handshakes included: netem delays them), never
    less (the links shaped every byte) and at most three times the guest's own cost (measured alike, divided by D)
    more."""
    origin, files = shards
    routes = [Route(20.0, 50.0), Route(40.0, 50.0)]
    done = trio.run(lambda: distribute(routes, files, origin, tmp_path / "nodes", shaper_kind="netem",
                                       transport=transport, streams=4, dilation=DILATION))
    manifest_bytes = len(manifest.dumps(manifest.build(origin)))
    for node in done.nodes:
        name = files[node.node][0]
        assert (tmp_path / "nodes" / f"node{node.node}" / name).read_bytes() == (origin / name).read_bytes()
        predicted = predict_node_s(routes[node.node], [(origin / name).stat().st_size], 4, transport, True,
                                   manifest_bytes, manifest.CHUNK_BYTES)
        budget = 0.03 * predicted + 3 * guest_cost[node.node] / DILATION
        print(f"{transport} node {node.node}: {node.seconds:.3f} s, closed form {predicted:.3f} s "
              f"({(node.seconds / predicted - 1) * 100:+.1f}%), the guest's own {guest_cost[node.node]:.3f} s at D = 1")
        assert 0.97 * predicted < node.seconds < predicted + budget, (node.node, node.seconds, predicted, budget)
