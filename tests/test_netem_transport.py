"""Transport "kernel" on the netem backend: the kernel's TCP left untuned (but Reno, and no metrics saved), the ACKs'
way back delayed. (Real bytes over netem's links, testbed.launch.weights, are measured by `python -m testbed weights
--real netem`, inside user-mode-linux the guest's own cost: docs/studies/weights.md.)

Needs root and a kernel with sch_netem; on these machines it runs inside user-mode-linux:

    python -m netem.uml -- .venv/bin/python -m pytest -m netem tests/test_netem_transport.py -q
"""

from __future__ import annotations

import secrets

import pytest

from netem.base import ShaperOptions
from netem.kernel import KernelShaper
from netem.netlink import read_qdisc, read_routes
from netem.nsutil import read_sysctl
from testbed.core.records import LinkSpec

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
            assert read_sysctl(ns.name, "net/ipv4/tcp_no_metrics_save") == "1"  # every connection starts cold
            assert all(not route["initcwnd"] for route in read_routes(ns.name))
        for q in plan.ack_qdiscs:  # the way back of 0->1 is 1->0, delayed by 0->1's delay, no rate
            got = read_qdisc(q.namespace, q.ifname)
            assert got["kind"] == "netem" and got["latency_ns"] == round(q.link.delay_ms * 1e6)
            assert got["rate_bytes_s"] == 0
        assert sorted((q.link.src, q.link.dst) for q in plan.ack_qdiscs) == [(0, 2), (1, 0), (2, 1)]
