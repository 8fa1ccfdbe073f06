"""Pure tests of the kernel netem planning: names, topology, addresses, qdisc parameters, bad input."""

from __future__ import annotations

import array
import ipaddress
import math
import statistics

import pytest

from testbed.core.records import LinkSpec
from netem.plan import (
    DEFAULT_LIMIT_PACKETS,
    FIFO_RATE_MBIT,
    IFNAMSIZ,
    LIMIT_HEADROOM,
    MTU_BYTES,
    NETEM_DIST_SCALE,
    NETEM_DIST_SIZE,
    ROOT_HANDLE,
    TC_H_ROOT,
    is_testbed_name,
    limit_packets,
    normal_distribution_table,
    plan_network,
    run_prefix,
    short_run_id,
)
from testbed.core.errors import ShapingError


def ring(n: int, delay_ms: float = 10.0, **kw) -> list[LinkSpec]:
    return [LinkSpec(i, (i + 1) % n, delay_ms, **kw) for i in range(n)]


def check_names(plan) -> None:
    for name in plan.names():
        assert name.startswith(plan.prefix)
        assert is_testbed_name(name)
        assert is_testbed_name(name, plan.prefix)
    for veth in plan.veths:
        assert len(veth.ifname_a) <= IFNAMSIZ and len(veth.ifname_b) <= IFNAMSIZ
    assert len(set(plan.names())) == len(plan.names())


def check_addresses(plan) -> None:
    subnets = [ipaddress.ip_network(v.subnet) for v in plan.veths]
    for i, a in enumerate(subnets):
        for b in subnets[i + 1:]:
            assert not a.overlaps(b)
    for v in plan.veths:
        net = ipaddress.ip_network(v.subnet)
        assert ipaddress.ip_address(v.address_a) in net and ipaddress.ip_address(v.address_b) in net
        assert v.address_a != v.address_b


def test_prefix_is_gr_plus_short_run_id():
    assert run_prefix("1a2b3c4d") == "gr1a2b3"
    assert short_run_id("ABCDEF99") == "abcde"
    hashed = run_prefix("run-2026-01-01")  # not hex: hashed into 5 hex digits, deterministically
    assert hashed == run_prefix("run-2026-01-01") and len(hashed) == 7
    assert is_testbed_name(hashed + "-s0")


def test_ring_of_three():
    plan = plan_network(ring(3), 3, "abcdef00")
    assert [ns.name for ns in plan.namespaces] == ["grabcde-s0", "grabcde-s1", "grabcde-s2"]
    assert [(v.a, v.b) for v in plan.veths] == [(0, 1), (0, 2), (1, 2)]
    check_names(plan)
    check_addresses(plan)
    q01 = plan.qdisc(0, 1)
    assert (q01.namespace, q01.ifname) == ("grabcde-s0", "grabcde-0-1")
    q20 = plan.qdisc(2, 0)
    assert (q20.namespace, q20.ifname) == ("grabcde-s2", "grabcde-2-0")
    # src dials dst's end of their pair
    assert plan.peer_hosts[(0, 1)] == plan.pair(0, 1).address_b
    assert plan.peer_hosts[(2, 0)] == plan.pair(0, 2).address_a
    for q in plan.qdiscs:
        assert q.handle == ROOT_HANDLE == 0x10000 and q.parent == TC_H_ROOT
        assert q.latency_ns == 10_000_000 and q.delay_us == 10_000
        assert q.jitter_ns == 0 and q.distribution is None and q.rate_bytes_s == 0


def test_ring_plus_extra_link_shares_the_pair():
    links = ring(3) + [LinkSpec(0, 2, 7.0, 1.0)]
    plan = plan_network(links, 3, "abcdef00")
    assert len(plan.veths) == 3  # 0->2 and 2->0 use the same pair, one direction each
    assert plan.qdisc(0, 2).ifname == "grabcde-0-2" and plan.qdisc(2, 0).ifname == "grabcde-2-0"
    assert plan.peer_hosts[(0, 2)] == plan.pair(0, 2).address_b


def test_star_and_full_mesh():
    star = [LinkSpec(0, i, 5.0) for i in range(1, 6)] + [LinkSpec(i, 0, 5.0) for i in range(1, 6)]
    plan = plan_network(star, 6, "12345678")
    assert [(v.a, v.b) for v in plan.veths] == [(0, i) for i in range(1, 6)]
    assert len(plan.qdiscs) == 10
    check_names(plan)
    check_addresses(plan)

    n = 5
    mesh = [LinkSpec(s, d, 1.0 + s + d / 10) for s in range(n) for d in range(n) if s != d]
    plan = plan_network(mesh, n, "12345678")
    assert len(plan.veths) == n * (n - 1) // 2
    assert len(plan.qdiscs) == n * (n - 1)
    assert len(plan.peer_hosts) == n * (n - 1)
    for link in mesh:  # every directed delay kept, on its own egress
        q = plan.qdisc(link.src, link.dst)
        assert q.latency_ns == round(link.delay_ms * 1e6)
        assert q.ifname == f"gr12345-{link.src}-{link.dst}"
    check_names(plan)
    check_addresses(plan)


def test_unlinked_stage_gets_namespace_but_no_veth():
    plan = plan_network([LinkSpec(0, 1, 1.0)], 3, "abcdef00")
    assert len(plan.namespaces) == 3 and len(plan.veths) == 1


def test_names_fit_ifnamsiz_up_to_large_stage_numbers():
    plan = plan_network([LinkSpec(998, 999, 1.0), LinkSpec(0, 999, 1.0)], 1000, "abcdef00")
    check_names(plan)
    with pytest.raises(ShapingError, match="IFNAMSIZ"):
        plan_network([LinkSpec(9998, 9999, 1.0)], 10000, "abcdef00")


def test_limit_sizing():
    # 100 Mbit/s, 1500-byte packets: 8333 packets/s; 100 ms -> 833 in flight; x1.5 -> 1250
    assert limit_packets(100.0, 0.0, 100.0) == math.ceil(LIMIT_HEADROOM * 100e6 / 8 / MTU_BYTES * 0.1)
    assert limit_packets(1.0, 0.0, 10.0) == DEFAULT_LIMIT_PACKETS  # never below netem's default
    # jitter widens the worst-case delay; no rate means a generous assumed rate
    assert limit_packets(100.0, 10.0, 100.0) > limit_packets(100.0, 0.0, 100.0)
    assert limit_packets(50.0, 0.0, 0.0) > limit_packets(50.0, 0.0, 1000.0)
    plan = plan_network([LinkSpec(0, 1, 140.0, rate_mbit=1000.0)], 2, "abcdef00")
    q = plan.qdisc(0, 1)
    packets_per_s = 1000e6 / 8 / MTU_BYTES
    assert q.limit_packets >= 1.5 * packets_per_s * 0.140


def test_rate_handling():
    links = [LinkSpec(0, 1, 10.0, rate_mbit=100.0), LinkSpec(1, 0, 10.0),
             LinkSpec(1, 2, 10.0, jitter_ms=2.0), LinkSpec(2, 1, 10.0, rate_mbit=40_000.0)]
    plan = plan_network(links, 3, "abcdef00")
    shaped = plan.qdisc(0, 1)
    # 100 Mbit/s of payload: netem counts each full segment's 66 header bytes on its 1,448 too
    assert shaped.rate_bytes_s == round(12_500_000 * 1514 / 1448) and not shaped.rate_is_fifo_only
    assert shaped.pyroute2_parameters()["rate"] == shaped.rate_bytes_s
    unshaped = plan.qdisc(1, 0)
    assert unshaped.rate_bytes_s == 0 and "rate" not in unshaped.pyroute2_parameters()
    jittered = plan.qdisc(1, 2)  # unlimited but jittered: a huge rate only to keep netem FIFO
    assert jittered.rate_is_fifo_only and jittered.rate_bytes_s == round(FIFO_RATE_MBIT * 1e6 / 8)
    assert jittered.distribution == "normal" and jittered.jitter_ns == 2_000_000
    fast = plan.qdisc(2, 1)  # above 32 bits of bytes/s: the u32 field saturates, RATE64 carries it
    assert fast.rate_bytes_s == round(5_000_000_000 * 1514 / 1448) and fast.pyroute2_parameters()["rate"] == 0xFFFFFFFF


def test_loss_and_seed_carried():
    plan = plan_network([LinkSpec(0, 1, 5.0, loss_pct=1.5, seed=42)], 2, "abcdef00")
    q = plan.qdisc(0, 1)
    assert q.loss_pct == 1.5 and q.seed == 42 and q.pyroute2_parameters()["loss"] == 1.5


def test_normal_table_matches_netem_format():
    raw = normal_distribution_table()
    table = array.array("h")
    table.frombytes(raw)
    assert len(table) == NETEM_DIST_SIZE
    assert list(table) == sorted(table)
    values = [v / NETEM_DIST_SCALE for v in table]
    assert abs(statistics.fmean(values)) < 0.01
    assert abs(statistics.pstdev(values) - 1.0) < 0.01  # netem multiplies by jitter: sigma = jitter
    assert table[NETEM_DIST_SIZE // 2] == 0


@pytest.mark.parametrize("links, n, match", [
    ([LinkSpec(0, 3, 1.0)], 3, "dst must be a stage"),
    ([LinkSpec(-1, 0, 1.0)], 3, "src must be a stage"),
    ([LinkSpec(1, 1, 1.0)], 3, "itself"),
    ([LinkSpec(0, 1, 1.0), LinkSpec(0, 1, 2.0)], 3, "twice"),
    ([LinkSpec(0, 1, -1.0)], 3, "delay_ms"),
    ([LinkSpec(0, 1, float("nan"))], 3, "delay_ms"),
    ([LinkSpec(0, 1, 1.0, jitter_ms=-0.5)], 3, "jitter_ms"),
    ([LinkSpec(0, 1, 1.0, loss_pct=101.0)], 3, "loss_pct"),
    ([LinkSpec(0, 1, 1.0, rate_mbit=-5.0)], 3, "rate_mbit"),
    ([LinkSpec(0, 1, 1.0, seed=-1)], 3, "seed"),
    ([LinkSpec(0, 1, 1e9)], 3, "delay_ms"),
    ([], 0, "n_stages"),
    (["0->1"], 3, "LinkSpec"),
])
def test_bad_input_raises_shaping_error(links, n, match):
    with pytest.raises(ShapingError, match=match):
        plan_network(links, n, "abcdef00")


def test_is_testbed_name_only_matches_generated_names():
    for ours in ("gr1a2b3-s0", "gr1a2b3-12", "gr1a2b3-0-1", "grfffff-s999", "gr00000-998-999"):
        assert (ours != "gr1a2b3-12") == is_testbed_name(ours), ours
    for foreign in ("gre0", "gretap0", "grafana-s0", "gr-test", "grkeep1-s0", "gr1a2b3", "xgr1a2b3-s0",
                    "gr1a2b3-s0x", "GR1A2B3-s0", "eth0", "lo"):
        assert not is_testbed_name(foreign), foreign
    assert is_testbed_name("gr1a2b3-s0", "gr1a2b3") and not is_testbed_name("gr1a2b3-s0", "grfffff")


# ------------------------------------------------------------------------------------------------
# plan without applying: what `python -m testbed plan` prints

PLAN_LINKS = [
    LinkSpec(0, 1, delay_ms=10.0),
    LinkSpec(1, 2, delay_ms=20.0, jitter_ms=2.0, loss_pct=1.0, rate_mbit=100.0, seed=7),
    LinkSpec(2, 0, delay_ms=30.0),
]


def _no_netem():
    from netem.probe import Capabilities

    return Capabilities(has_cap_net_admin=False, has_netns=False, has_veth=False, has_netem=False, detail="test")


def test_netem_plan_lines_are_tc_commands_with_microseconds_prefix_and_limit():
    from netem.base import ShaperOptions
    from netem.select import plan_lines

    backend, lines = plan_lines("netem", PLAN_LINKS, 3, "abcdef12", ShaperOptions(), probe_fn=_no_netem)
    assert backend == "netem" and lines[0].startswith("# backend netem:") and "could not run here" in lines[0]
    prefix = run_prefix("abcdef12")
    plan = plan_network(PLAN_LINKS, 3, "abcdef12")
    text = "\n".join(lines)
    for ns in plan.namespaces:
        assert f"ip netns add {ns.name}" in lines
    for veth in plan.veths:
        assert veth.ifname_a.startswith(prefix + "-") and veth.ifname_b.startswith(prefix + "-")
        assert f"link add {veth.ifname_a} type veth peer name {veth.ifname_b} netns {veth.namespace_b}" in text
        assert f"ethtool -K {veth.ifname_a} " in text and "gso off" in text and "tso off" in text and "gro off" in text
    qdisc_lines = [line for line in lines if " tc qdisc add " in line]
    assert len(qdisc_lines) == len(PLAN_LINKS)
    for q in plan.qdiscs:
        (line,) = [l for l in qdisc_lines if f" dev {q.ifname} " in l]
        assert f"netem delay {round(q.link.delay_ms * 1000)}us" in line
        assert f"limit {q.limit_packets}" in line
    jittered = plan.qdisc(1, 2)
    (line,) = [l for l in qdisc_lines if f" dev {jittered.ifname} " in l]
    assert "delay 20000us 2000us distribution normal loss 1% rate 104.558mbit" in line  # 100 of payload
    assert line.endswith("# link 1->2: 100 Mbit/s of payload, headers on top")
    # the lossy link's sender sends one segment a packet (netem drops segments, not GSO packets); the others keep GSO
    assert [l for l in lines if "gso_max_segs" in l] == [f"ip netns exec {jittered.namespace} ip link set dev "
                                                         f"{jittered.ifname} gso_max_segs 1"]


def test_netem_plan_lines_need_no_root_and_touch_nothing():
    from netem.kernel import KernelShaper

    shaper = KernelShaper(PLAN_LINKS, 3, "abcdef12")
    assert shaper.plan_lines() == shaper.plan_lines()  # pure: no kernel calls, same answer twice
    assert shaper.plan_lines()[0] == f"ip netns add {run_prefix('abcdef12')}-s0"


def test_relay_plan_lines_show_each_link_and_the_rto():
    from netem.base import ShaperOptions
    from netem.select import plan_lines

    backend, lines = plan_lines("auto", PLAN_LINKS, 3, "abcdef12", ShaperOptions(loss_rto_ms=250.0),
                                probe_fn=_no_netem)
    assert backend == "userspace" and lines[0].startswith("# backend userspace: auto: the userspace relay shapes the links; netem cannot: ")
    relay_lines = lines[1:]
    assert len(relay_lines) == len(PLAN_LINKS)
    for link, line in zip(sorted(PLAN_LINKS, key=lambda l: (l.src, l.dst)), relay_lines):
        assert line.startswith(f"relay {link.name}:") and f"delay {link.delay_ms:g} ms" in line
    (lossy,) = [l for l in relay_lines if l.startswith("relay 1->2:")]
    assert "jitter Normal(0, 2 ms)" in lossy and "loss 1%" in lossy and "+250 ms RTO" in lossy
    assert "rate 100 Mbit/s" in lossy and "serialization 0.12 ms" in lossy


def test_shaper_options_reach_the_backend_and_bad_ones_are_named():
    from netem.base import ShaperOptions
    from netem.select import choose_shaper

    shaper = choose_shaper("userspace", PLAN_LINKS, 3, "abcdef12", options=ShaperOptions(loss_rto_ms=300.0))
    assert shaper.options.loss_rto_ms == 300.0
    assert choose_shaper("userspace", PLAN_LINKS, 3, "abcdef12").options == ShaperOptions()
    with pytest.raises(ShapingError, match="loss_rto_ms"):
        ShaperOptions(loss_rto_ms=0)
