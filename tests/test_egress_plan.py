"""Egress shaping on a real host, the parts that need no netem: the planned tree, u32 keys, input checks, clear errors."""

from __future__ import annotations

import ipaddress
import os
import secrets
import struct

import pytest

import netem.egress as egress
from netem.clean import clean_egress
from netem.egress import ROOT_HANDLE, EgressShaper, plan_egress, tc_handle, u32_keys
from testbed.core.errors import ShapingError
from testbed.core.records import LinkSpec

PEERS = [
    (LinkSpec(0, 1, delay_ms=40.0), "10.0.0.2", 4567),
    (LinkSpec(0, 2, delay_ms=5.0, jitter_ms=1.0, loss_pct=0.5, rate_mbit=100.0, seed=3), "10.0.0.3", 4567),
]


def tcp_header(dst: str, dport: int, ihl: int = 5, protocol: int = 6) -> bytes:
    """The first bytes of an IPv4 packet to dst:dport (IP header of `ihl` words, then the TCP ports)."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 60, 0, 0x4000, 64, protocol, 0,
                     ipaddress.IPv4Address("10.0.0.1").packed, ipaddress.IPv4Address(dst).packed)
    return ip + b"\0" * (4 * ihl - 20) + struct.pack("!HH", 40000, dport) + b"\0" * 16


def u32_matches(keys: tuple[str, ...], packet: bytes) -> bool:
    """What cls_u32 does with these keys: every 32-bit word at offset, masked, equals the value."""
    for key in keys:
        value_mask, _, offset = key.partition("+")
        value, _, mask = value_mask.partition("/")
        word = struct.unpack_from("!I", packet, int(offset))[0]
        if word & int(mask, 16) != int(value, 16):
            return False
    return True


def test_plan_builds_one_class_leaf_and_filter_per_peer():
    plan = plan_egress("eth0", PEERS)
    assert tc_handle(ROOT_HANDLE) == "6772:"
    assert [tc_handle(p.classid) for p in plan.peers] == ["6772:10", "6772:11"]
    assert [tc_handle(p.netem.handle) for p in plan.peers] == ["6773:", "6774:"]
    assert [p.netem.parent for p in plan.peers] == [p.classid for p in plan.peers]
    assert [p.filter_prio for p in plan.peers] == [1, 2]
    first, second = plan.peers
    assert first.netem.latency_ns == 40_000_000 and first.netem.rate_bytes_s == 0
    assert second.netem.jitter_ns == 1_000_000 and second.netem.distribution == "normal"
    assert second.netem.rate_bytes_s == round(12_500_000 * 1514 / 1448) and second.netem.loss_pct == 0.5 and second.netem.seed == 3
    assert plan.describe() == ["eth0: 10.0.0.2:4567 delay 40ms jitter 0ms loss 0% rate unlimited",
                               "eth0: 10.0.0.3:4567 delay 5ms jitter 1ms loss 0.5% rate 100mbit"]
    assert plan.peer(("10.0.0.3", 4567)) is second and plan.peer("10.0.0.2") is first


def test_plan_commands_are_the_tc_lines():
    lines = plan_egress("eth0", PEERS[:1], namespace="ns-a").commands()
    print("\n".join(lines))
    assert lines[0].startswith("ip netns exec ns-a tc qdisc add dev eth0 root handle 6772: htb default 0")
    assert "classid 6772:10 htb rate 32000mbit" in lines[1]
    assert "parent 6772:10 handle 6773: netem delay 40000us" in lines[2]
    assert lines[3].endswith("match ip dst 10.0.0.2/32 match ip dport 4567 0xffff flowid 6772:10")


def test_u32_keys_select_tcp_to_that_address_and_port_only():
    keys = u32_keys("10.0.0.2", 4567)
    assert u32_matches(keys, tcp_header("10.0.0.2", 4567))
    assert not u32_matches(keys, tcp_header("10.0.0.2", 4568))  # the clock probes' port
    assert not u32_matches(keys, tcp_header("10.0.0.3", 4567))
    assert not u32_matches(keys, tcp_header("10.0.0.2", 4567, protocol=17))  # UDP
    assert not u32_matches(keys, tcp_header("10.0.0.2", 4567, ihl=6))  # IP options: never misread


@pytest.mark.parametrize("peers, words", [
    ([], "1 to"),
    ([(LinkSpec(0, 1, delay_ms=1.0), "10.0.0.300", 1)], "IPv4"),
    ([(LinkSpec(0, 1, delay_ms=1.0), "fe80::1", 1)], "IPv4"),
    ([(LinkSpec(0, 1, delay_ms=1.0), "10.0.0.2", 0)], "port"),
    ([(LinkSpec(0, 1, delay_ms=1.0), "10.0.0.2", 5)] * 2, "twice"),
    ([(LinkSpec(0, 1, delay_ms=-1.0), "10.0.0.2", 5)], "delay_ms"),
    ([(LinkSpec(0, 1, delay_ms=1.0, loss_pct=101.0), "10.0.0.2", 5)], "loss_pct"),
    ([("not a link", "10.0.0.2", 5)], "LinkSpec"),
    ([(LinkSpec(0, 1, delay_ms=1.0), "10.0.0.2")], "(LinkSpec, ip, port)"),
])
def test_plan_rejects_bad_peers_naming_the_interface(peers, words):
    with pytest.raises(ShapingError, match="eth0") as info:
        plan_egress("eth0", peers)
    assert words in str(info.value)


@pytest.mark.parametrize("iface", ["", "a" * 16, "eth0/1", "eth 0", None])
def test_bad_interface_names_are_refused(iface):
    with pytest.raises(ShapingError, match="interface name"):
        EgressShaper(iface, "run")


def test_not_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(egress, "effective_capabilities", lambda: 0)
    shaper = EgressShaper("eth0", "run")
    with pytest.raises(ShapingError, match="shaping egress on eth0 needs CAP_NET_ADMIN: run as root"):
        shaper.apply(PEERS)
    assert shaper.describe() == []
    shaper.close()  # nothing applied: nothing to do


def test_change_and_describe_before_apply():
    shaper = EgressShaper("eth0", "run")
    with pytest.raises(ShapingError, match="not applied"):
        shaper.change(("10.0.0.2", 4567), delay_ms=1.0)
    assert shaper.describe() == []


# netlink writes need root: in the fidelity tier, so that the exact tier runs fully without it
def needs_root(test):
    return pytest.mark.fidelity(pytest.mark.skipif(os.geteuid() != 0, reason="needs root (netlink writes)")(test))


@needs_root
def test_missing_interface_is_named():
    with pytest.raises(ShapingError, match="interface gr-nosuch0 does not exist in this network namespace"):
        EgressShaper("gr-nosuch0", "run").apply(PEERS)
    with pytest.raises(ShapingError, match="interface gr-nosuch0 does not exist"):
        clean_egress("gr-nosuch0")


def _kernel_has_netem() -> bool:
    from netem.probe import probe

    return probe().has_netem


@needs_root
def test_missing_sch_netem_is_said_and_nothing_stays_behind():
    """On a kernel without sch_netem (like this project's hosts) apply fails naming it, and rolls back."""
    if _kernel_has_netem():
        pytest.skip("this kernel has sch_netem")
    from pyroute2 import IPRoute, netns

    name = f"egress-plan-{secrets.token_hex(3)}"
    netns.create(name)
    try:
        with IPRoute(netns=name, flags=0) as ipr:
            ipr.link("add", ifname="eg-a", kind="veth", peer="eg-b")
        with EgressShaper("eg-a", "run", namespace=name) as shaper:
            with pytest.raises(ShapingError, match=r"netem 6773: on eg-a .*sch_netem is not available"):
                shaper.apply(PEERS)
        with IPRoute(netns=name, flags=0) as ipr:
            index = ipr.link_lookup(ifname="eg-a")[0]
            assert all(msg["handle"] != ROOT_HANDLE for msg in ipr.get_qdiscs(index=index))
    finally:
        netns.remove(name)
