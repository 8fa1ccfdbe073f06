"""Netlink glue for the kernel backend: the netem RTM_NEWQDISC message, and reading qdiscs, links and routes back.

The netem qdisc goes as a hand-built RTM_NEWQDISC because pyroute2 0.9's netem helper cannot send a
delay distribution table, 64-bit latency/jitter or a PRNG seed; `NetemOptions` below adds those
attributes to pyroute2's own netem options class, and the same class decodes the kernel's dump for
`read_qdisc`.
"""

from __future__ import annotations

import errno
import socket
from functools import lru_cache
from typing import Any

from pyroute2.netlink.rtnl import RTM_NEWQDISC

from netem.plan import TC_H_ROOT, U32_MAX, NetemPlan, normal_distribution_table
from testbed.core.errors import ShapingError

RT_TABLE_MAIN = 254  # include/uapi/linux/rtnetlink.h (pyroute2 has no name for it)

# pyroute2 compiles a class's nla_map once and caches it in class attributes that a subclass
# inherits when the parent happened to be compiled first (e.g. by the probe's plain tc() call): the
# subclass would then silently encode with the parent's map. Each subclass gets its own empty cache.
_OWN_NLA_CACHE = {"_nlmsg_base__compiled_nla": False, "_nlmsg_base__t_nla_map": None,
                  "_nlmsg_base__r_nla_map": None}


@lru_cache(maxsize=1)  # one class pair per process
def netem_message_classes() -> tuple[type, type]:
    """(NetemOptions, NetemTcmsg): pyroute2's netem classes with every TCA_NETEM_* attribute."""
    from pyroute2.netlink.rtnl.tcmsg import sched_netem, tcmsg

    class NetemOptions(sched_netem.options):
        """tc_netem_qopt + the nested attributes of include/uapi/linux/pkt_sched.h (TCA_NETEM_*)."""

        nla_map = (
            ("TCA_NETEM_UNSPEC", "none"),
            ("TCA_NETEM_CORR", "netem_corr"),
            ("TCA_NETEM_DELAY_DIST", "cdata"),
            ("TCA_NETEM_REORDER", "netem_reorder"),
            ("TCA_NETEM_CORRUPT", "netem_corrupt"),
            ("TCA_NETEM_LOSS", "cdata"),
            ("TCA_NETEM_RATE", "netem_rate"),
            ("TCA_NETEM_ECN", "uint32"),
            ("TCA_NETEM_RATE64", "uint64"),
            ("TCA_NETEM_PAD", "none"),
            ("TCA_NETEM_LATENCY64", "int64"),
            ("TCA_NETEM_JITTER64", "int64"),
            ("TCA_NETEM_SLOT", "cdata"),
            ("TCA_NETEM_SLOT_DIST", "cdata"),
            ("TCA_NETEM_PRNG_SEED", "uint64"),
        )

    class NetemTcmsg(tcmsg):
        @staticmethod
        def get_options(self, *argv, **kwarg):
            if self.get_attr("TCA_KIND") == "netem":
                return NetemOptions
            return tcmsg.get_options(self, *argv, **kwarg)

    for cls in (NetemOptions, NetemTcmsg):
        for name, value in _OWN_NLA_CACHE.items():
            setattr(cls, name, value)
    return NetemOptions, NetemTcmsg


def ipr_in(namespace: str):
    """An IPRoute inside an existing namespace (flags=0: never creates one by accident)."""
    from pyroute2 import IPRoute

    return IPRoute(netns=namespace, flags=0)


def translate(what: str, exc: BaseException) -> ShapingError:
    """A pyroute2/OS error as a ShapingError that says what we were doing and the errno's name."""
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return ShapingError(f"{what}: {name} {exc}".replace(":  ", ": "))


def link_index(ipr, ifname: str, namespace: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise ShapingError(f"interface {ifname} did not appear in namespace {namespace}")
    return found[0]


def netem_message(q: NetemPlan, index: int):
    """The RTM_NEWQDISC message for one planned netem qdisc on interface `index`."""
    from pyroute2.netlink.rtnl.tcmsg import sched_netem

    _, netem_tcmsg = netem_message_classes()
    options = sched_netem.get_parameters(q.pyroute2_parameters())
    options["delay"] = int(options["delay"])  # psched ticks; pyroute2 computes them as floats
    options["jitter"] = int(options["jitter"])
    extra = [["TCA_NETEM_LATENCY64", q.latency_ns], ["TCA_NETEM_JITTER64", q.jitter_ns]]
    if q.rate_bytes_s > U32_MAX:
        extra.append(["TCA_NETEM_RATE64", q.rate_bytes_s])
    if q.distribution == "normal":
        extra.append(["TCA_NETEM_DELAY_DIST", normal_distribution_table()])
    extra.append(["TCA_NETEM_PRNG_SEED", q.seed])
    options["attrs"] = list(options["attrs"]) + extra
    msg = netem_tcmsg()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = index
    msg["handle"] = q.handle
    msg["parent"] = q.parent
    msg["attrs"] = [("TCA_KIND", "netem"), ("TCA_OPTIONS", options)]
    return msg


def request(ipr, msg, msg_type: int, flags: int):
    """Send one message and wait for the kernel's answer."""
    # pyroute2 0.9.7's sync nlm_request reads status['nlm_generator'], which IPRoute never sets
    ipr.status["nlm_generator"] = False
    return ipr.nlm_request(msg, msg_type, flags)


def _tick_in_usec() -> float:
    from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

    return tick_in_usec


def decode_qdisc(msg) -> dict:
    """Flatten one RTM_NEWQDISC message (decoded with NetemTcmsg) into plain numbers.

    The kernel reports netem's delay and jitter twice: as psched ticks in tc_netem_qopt (64 ns each
    on modern kernels: ticks / tick_in_usec = microseconds) and as nanoseconds in
    TCA_NETEM_LATENCY64/JITTER64 (since 4.15); loss as a fraction of 2**32 - 1; rate in bytes/s.
    """
    kind = msg.get_attr("TCA_KIND")
    out: dict[str, Any] = {"kind": kind, "handle": msg["handle"], "parent": msg["parent"], "index": msg["index"]}
    opts = msg.get_attr("TCA_OPTIONS")
    if kind != "netem" or opts is None:
        return out
    attrs = dict((name, value) for name, value in opts.get("attrs", []) if name != "UNKNOWN")
    ticks = _tick_in_usec()
    out["delay_ticks"] = opts["delay"]
    out["jitter_ticks"] = opts["jitter"]
    out["delay_us"] = opts["delay"] / ticks
    out["jitter_us"] = opts["jitter"] / ticks
    out["latency_ns"] = attrs.get("TCA_NETEM_LATENCY64")
    out["jitter_ns"] = attrs.get("TCA_NETEM_JITTER64")
    out["limit"] = opts["limit"]
    out["loss_pct"] = opts["loss"] / U32_MAX * 100
    rate = attrs.get("TCA_NETEM_RATE", {}).get("rate", 0) if attrs.get("TCA_NETEM_RATE") else 0
    out["rate_bytes_s"] = attrs.get("TCA_NETEM_RATE64", rate)
    out["rate_mbit"] = out["rate_bytes_s"] * 8 / 1e6
    out["seed"] = attrs.get("TCA_NETEM_PRNG_SEED")  # None: the kernel ignored it (before 6.4)
    return out


def read_qdisc(namespace: str, ifname: str, ipr=None) -> dict | None:
    """The root qdisc of `ifname` in `namespace`, from the kernel (None when the interface has none)."""
    if ipr is None:
        with ipr_in(namespace) as own:
            return read_qdisc(namespace, ifname, own)
    _, netem_tcmsg = netem_message_classes()
    index = link_index(ipr, ifname, namespace)
    ipr.asyncore.marshal.msg_map[RTM_NEWQDISC] = netem_tcmsg  # this socket's own copy of the map
    for msg in ipr.get_qdiscs(index=index):
        if msg["parent"] == TC_H_ROOT:
            return decode_qdisc(msg)
    return None


def verify(q: NetemPlan, got: dict | None) -> list[str]:
    """Differences between a planned netem qdisc and what the kernel reports (empty when they agree)."""
    if got is None or got.get("kind") != "netem":
        return [f"{q.ifname}: expected a root netem qdisc, kernel has {got and got.get('kind')}"]
    problems = []
    ticks_us = 1 / _tick_in_usec() + 1e-9

    def check(name: str, want: float, have: float | None, tolerance: float) -> None:
        if have is None or abs(want - have) > tolerance:
            problems.append(f"{q.ifname}: {name} planned {want}, kernel reports {have}")

    if got.get("latency_ns") is not None:
        check("latency_ns", q.latency_ns, got["latency_ns"], 0)
        check("jitter_ns", q.jitter_ns, got["jitter_ns"], 0)
    else:
        check("delay_us", q.latency_ns / 1e3, got["delay_us"], 1 + ticks_us)
        check("jitter_us", q.jitter_ns / 1e3, got["jitter_us"], 1 + ticks_us)
    check("limit", q.limit_packets, got["limit"], 0)
    check("loss_pct", q.loss_pct, got["loss_pct"], 1e-6)
    check("rate_bytes_s", q.rate_bytes_s, got["rate_bytes_s"], 0)
    if q.loss_pct > 0:  # one segment a packet, so netem drops segments (netem.kernel.segment_packets)
        check("gso_max_segs", 1, got.get("gso_max_segs"), 0)
    return problems


def read_links(namespace: str) -> dict[str, dict]:
    """{ifname: {"index", "state", "addresses": ["10.201.0.1/30", ...]}} of every link in `namespace`."""
    with ipr_in(namespace) as ipr:
        links = {}
        for msg in ipr.get_links():
            links[msg.get_attr("IFLA_IFNAME")] = {"index": msg["index"], "state": msg.get_attr("IFLA_OPERSTATE"),
                                                  "addresses": []}
        by_index = {v["index"]: k for k, v in links.items()}
        for msg in ipr.get_addr():
            name = by_index.get(msg["index"])
            if name is not None:
                links[name]["addresses"].append(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}")
        return links


def read_routes(namespace: str) -> list[dict]:
    """Main-table IPv4 routes in `namespace`: dst, dst_len, oif, and the initcwnd/initrwnd metrics."""
    with ipr_in(namespace) as ipr:
        out = []
        for msg in ipr.route("dump", table=RT_TABLE_MAIN, family=socket.AF_INET):
            metrics = msg.get_attr("RTA_METRICS")
            m = dict(metrics["attrs"]) if metrics else {}
            out.append({"dst": msg.get_attr("RTA_DST"), "dst_len": msg["dst_len"], "oif": msg.get_attr("RTA_OIF"),
                        "initcwnd": m.get("RTAX_INITCWND"), "initrwnd": m.get("RTAX_INITRWND")})
        return out
