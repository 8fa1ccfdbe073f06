"""A kernel `NetworkPlan` written out as the iproute2/ethtool/tc commands that would build it (for `plan`).

Pure: nothing here runs a command or needs root. `netem.kernel.apply_plan` makes the same objects
with pyroute2 (plus what tc cannot express: the delay as nanoseconds and, before iproute2 6.3, the
PRNG seed), so these lines are what an operator would type to get the same network::

    ip netns add gr1a2b3-s0
    ...
    ip netns exec gr1a2b3-s0 tc qdisc add dev gr1a2b3-0-1 root handle 1: netem delay 10000us limit 1000 seed 0
"""

from __future__ import annotations

import shlex

from pyroute2.netlink.rtnl import rt_proto, rt_scope

from netem.nsutil import OFFLOADS_OFF, PAIR_ROUTE_PROTOCOL, PAIR_ROUTE_SCOPE
from netem.plan import NetemPlan, NetworkPlan, VethPlan
from testbed.core.records import BYTES_PER_MBIT



def _handle(handle: int) -> str:
    """tc's major:minor spelling of a handle (0x10000 is "1:")."""
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:" + (f"{minor:x}" if minor else "")


def _in(namespace: str, command: str) -> str:
    return f"ip netns exec {shlex.quote(namespace)} {command}"


def _veth_lines(v: VethPlan) -> list[str]:
    lines = [f"ip -n {v.namespace_a} link add {v.ifname_a} type veth peer name {v.ifname_b} netns {v.namespace_b}"]
    for namespace, ifname, address in (v.end(v.a), v.end(v.b)):
        network = v.subnet
        lines += [
            f"ip -n {namespace} addr add {address}/{v.prefixlen} dev {ifname}",
            f"ip -n {namespace} link set {ifname} up",
        ]
        if v.initial_window is not None:
            lines.append(f"ip -n {namespace} route replace {network} dev {ifname} src {address} "
                         f"scope {rt_scope[PAIR_ROUTE_SCOPE]} proto {rt_proto[PAIR_ROUTE_PROTOCOL]} "
                         f"initcwnd {v.initial_window} initrwnd {v.initial_window}")
    return lines


def netem_arguments(q: NetemPlan) -> str:
    """tc's netem arguments for one planned qdisc: delay/jitter in microseconds, loss in %, rate, limit."""
    parts = [f"delay {q.delay_us}us"]
    if q.jitter_us or q.distribution:
        parts.append(f"{q.jitter_us}us")  # tc's jitter is delay's second argument
    if q.distribution:
        parts.append(f"distribution {q.distribution}")
    if q.loss_pct:
        parts.append(f"loss {q.loss_pct:g}%")
    if q.rate_bytes_s:
        parts.append(f"rate {q.rate_bytes_s / BYTES_PER_MBIT:g}mbit")
    parts.append(f"limit {q.limit_packets}")
    parts.append(f"seed {q.seed}")
    return " ".join(parts)


def network_commands(plan: NetworkPlan) -> list[str]:
    """Every command, in apply order: namespaces, veth pairs (addresses, routes), sysctls, offloads, netem."""
    lines = []
    for ns in plan.namespaces:
        lines += [f"ip netns add {ns.name}", f"ip -n {ns.name} link set lo up"]
    for veth in plan.veths:
        lines += _veth_lines(veth)
    for ns in plan.namespaces:
        for key, value in ns.sysctls:
            lines.append(_in(ns.name, f"sysctl -w {shlex.quote(key.replace('/', '.') + '=' + value)}"))
        for veth in plan.veths:
            for stage in (veth.a, veth.b):
                namespace, ifname, _ = veth.end(stage)
                if namespace == ns.name:
                    offloads = " ".join(f"{feature} off" for feature in OFFLOADS_OFF)
                    lines.append(_in(ns.name, f"ethtool -K {ifname} {offloads}"))
    for q in plan.qdiscs:
        why = "  # link {}{}".format(q.link.name, ": rate only keeps jittered packets in order" if q.rate_is_fifo_only
                                      else f": {q.link.rate_mbit:g} Mbit/s of payload, headers on top"
                                      if q.rate_bytes_s else "")
        lines.append(_in(q.namespace, f"tc qdisc add dev {q.ifname} root handle {_handle(q.handle)} netem "
                                      f"{netem_arguments(q)}") + why)
        if q.loss_pct > 0:  # netem drops segments, not GSO packets (netem.kernel.segment_packets)
            lines.append(_in(q.namespace, f"ip link set dev {q.ifname} gso_max_segs 1"))
    for q in plan.ack_qdiscs:
        lines.append(_in(q.namespace, f"tc qdisc add dev {q.ifname} root handle {_handle(q.handle)} netem "
                                      f"{netem_arguments(q)}") + f"  # the ACKs of link {q.link.dst}->{q.link.src}")
    return lines
