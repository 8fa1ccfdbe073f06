"""Shapes this host's own egress per destination (real hosts): an htb root with one netem leaf per peer, chosen by u32.

    with EgressShaper("eth0", run_id) as shaper:          # nothing touched yet
        shaper.plan_lines(peers)                          # the same tree as tc commands, applies nothing
        shaper.apply([(LinkSpec(0, 1, delay_ms=40.0), "10.0.0.2", 4567)])
        shaper.describe()    # ["eth0: 10.0.0.2:4567 delay 40ms jitter 0ms loss 0% rate unlimited"]
        shaper.change(("10.0.0.2", 4567), delay_ms=10.0)  # tc qdisc change, read back
    # the root qdisc is deleted on every exit path; the kernel puts its default back

The tree (handles as ints: 0x67720000 is 6772:, "gr" in ASCII, the marker `netem.clean` looks for)::

    dev eth0
    root 6772: htb default 0 ----------------- unclassified packets: htb's direct queue (no class,
     |                                          no rate, no delay): clock probes, ssh, everything else
     +- class 6772:10 htb rate 32gbit -- leaf 6773: netem delay/jitter/loss/rate of peer 0
     +- class 6772:11 htb rate 32gbit -- leaf 6774: netem ... of peer 1
    filter prio 1: u32 IPv4 IHL 5, TCP, dst 10.0.0.2/32, dport 4567 -> 6772:10
    filter prio 2: ...                                              -> 6772:11

Only the data-plane connection to a peer's listen port is shaped (SYN, data, ACKs); replies take the
peer's own egress. htb, not prio: kernels build htb in (this project's host has htb, no prio), and it
has no 16-band limit. Its classes never limit (PEER_CLASS_RATE_MBIT, 1 ms burst): delay, jitter, loss
and rate are netem's own, from `netem.plan.plan_netem` as for a namespace link. The u32 match checks
IHL 5 (no IP options: TCP starts at byte 20); a packet with options goes unshaped, never misread.

Previous state: only a kernel default root (handle 0: noqueue, pfifo_fast, fq_codel, mq) is replaced;
deleting ours makes the kernel attach its default again. Any other root is someone's configuration,
a 6772: root a leftover (`python -m testbed clean` removes it): apply refuses both.
"""

from __future__ import annotations

import errno
import ipaddress
import os
from dataclasses import dataclass, replace
from typing import Callable

from pyroute2 import netns
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC

from netem.commands import netem_arguments
from netem.netlink import decode_qdisc, ipr_in, netem_message, netem_message_classes, request, translate, verify
from netem.plan import IFNAMSIZ, TC_H_ROOT, NetemPlan, plan_netem, validate
from netem.probe import CAP_NET_ADMIN, effective_capabilities
from testbed.core.errors import ShapingError
from testbed.core.records import BYTES_PER_MBIT, LinkSpec

EGRESS_MAJOR = 0x6772  # "gr"
ROOT_HANDLE = EGRESS_MAJOR << 16  # 6772: -- fixed, so `testbed clean` finds a leftover on any interface
FIRST_PEER_MINOR = 0x10  # peer i: class 6772:<10+i>, netem leaf <6773+i>:
MAX_PEERS = 0xFFFF - EGRESS_MAJOR - 1  # leaf majors stay below ffff: (the ingress handle)
PEER_CLASS_RATE_MBIT = 32_000.0  # never the bottleneck of an emulated WAN link; fits htb's 32-bit rate
CLASS_BURST_S = 1e-3  # a token bucket of 1 ms at the class rate
ETH_P_IP = 0x0800
IPPROTO_TCP = 6
NEW_FLAGS = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL  # `tc ... add`: fail if it exists
CHANGE_FLAGS = NLM_F_REQUEST | NLM_F_ACK  # `tc qdisc change`
NETEM_FIELDS = ("delay_ms", "jitter_ms", "loss_pct", "rate_mbit")

Peer = tuple[LinkSpec, str, int]  # (the link's shaping, the peer's IPv4 address, its listen TCP port)


def tc_handle(handle: int) -> str:
    """tc's spelling of a handle: 0x67720000 is "6772:", 0x67720010 is "6772:10"."""
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:" + (f"{minor:x}" if minor else "")


def u32_keys(ip: str, port: int) -> tuple[str, ...]:
    """pyroute2's "value/mask+offset" keys (offsets in the IPv4 header) selecting TCP to ip:port."""
    return (
        "0x05000000/0x0f000000+0",  # IHL 5: no IP options, the TCP header starts at byte 20
        f"0x{IPPROTO_TCP << 16:08x}/0x00ff0000+8",  # protocol (byte 9)
        f"0x{int(ipaddress.IPv4Address(ip)):08x}/0xffffffff+16",  # destination address
        f"0x{port:08x}/0x0000ffff+20",  # destination port (TCP header bytes 2-3)
    )


@dataclass(frozen=True)
class PeerPlan:
    """One shaped destination: its htb class, netem leaf and u32 filter."""

    link: LinkSpec
    ip: str
    port: int
    classid: int
    netem: NetemPlan  # handle = the leaf's, parent = classid
    filter_prio: int
    keys: tuple[str, ...]

    def line(self, iface: str) -> str:
        link = self.link
        rate = f"{link.rate_mbit:g}mbit" if link.rate_mbit else "unlimited"
        return (f"{iface}: {self.ip}:{self.port} delay {link.delay_ms:g}ms jitter {link.jitter_ms:g}ms "
                f"loss {link.loss_pct:g}% rate {rate}")


@dataclass(frozen=True)
class EgressPlan:
    """Everything EgressShaper.apply creates on one interface, in creation order."""

    iface: str
    namespace: str  # "" is this process's own network namespace
    peers: tuple[PeerPlan, ...]

    def peer(self, dst: tuple[str, int] | str) -> PeerPlan:
        """The peer at (ip, port), or at ip when only one peer has that address."""
        found = [p for p in self.peers if ((p.ip, p.port) == tuple(dst) if isinstance(dst, tuple) else p.ip == dst)]
        if len(found) != 1:
            known = ", ".join(f"{p.ip}:{p.port}" for p in self.peers)
            raise ShapingError(f"{self.iface}: {'no' if not found else 'more than one'} shaped peer {dst!r} "
                               f"(shaped: {known or 'none'})")
        return found[0]

    def describe(self) -> list[str]:
        return [p.line(self.iface) for p in self.peers]

    def commands(self) -> list[str]:
        """The same tree as tc commands (what an operator would type; the delay goes as ns via netlink)."""
        dev = f"dev {self.iface}"
        rate = f"{PEER_CLASS_RATE_MBIT:g}mbit"
        lines = [f"tc qdisc add {dev} root handle {tc_handle(ROOT_HANDLE)} htb default 0"
                 "  # unclassified: htb's direct queue, unshaped"]
        for p in self.peers:
            lines += [
                f"tc class add {dev} parent {tc_handle(ROOT_HANDLE)} classid {tc_handle(p.classid)} htb "
                f"rate {rate} ceil {rate}",
                f"tc qdisc add {dev} parent {tc_handle(p.classid)} handle {tc_handle(p.netem.handle)} netem "
                f"{netem_arguments(p.netem)}",
                f"tc filter add {dev} parent {tc_handle(ROOT_HANDLE)} protocol ip prio {p.filter_prio} u32 "
                f"match u8 0x05 0x0f at 0 match ip protocol {IPPROTO_TCP} 0xff match ip dst {p.ip}/32 "
                f"match ip dport {p.port} 0xffff flowid {tc_handle(p.classid)}",
            ]
        return [f"ip netns exec {self.namespace} {line}" if self.namespace else line for line in lines]


def check_iface(iface: str) -> None:
    if not isinstance(iface, str) or not iface or len(iface) > IFNAMSIZ or any(c in iface for c in "/: \t\n"):
        raise ShapingError(f"interface name must be 1-{IFNAMSIZ} characters without '/', ':' or spaces, "
                           f"got {iface!r}")


def validate_link(link: LinkSpec, where: str) -> None:
    """`netem.plan.validate` for one link on its own (its stages only need to be distinct ints >= 0)."""
    stages = [s for s in (link.src, link.dst) if isinstance(s, int) and not isinstance(s, bool) and s >= 0]
    try:
        validate([link], max(stages, default=0) + 1)
    except ShapingError as exc:
        raise ShapingError(f"{where}: {exc}") from exc


def _peer_netem(link: LinkSpec, namespace: str, iface: str, classid: int, leaf: int) -> NetemPlan:
    return replace(plan_netem(link, namespace, iface), handle=leaf, parent=classid)


def plan_egress(iface: str, peers: list[Peer], namespace: str = "") -> EgressPlan:
    """The tree for `peers` (pure: checks every input, touches nothing)."""
    check_iface(iface)
    peers = list(peers)
    if not 1 <= len(peers) <= MAX_PEERS:
        raise ShapingError(f"{iface}: egress shaping needs 1 to {MAX_PEERS} peers, got {len(peers)}")
    planned: list[PeerPlan] = []
    seen: set[tuple[str, int]] = set()
    for i, peer in enumerate(peers):
        if not isinstance(peer, tuple) or len(peer) != 3:
            raise ShapingError(f"{iface}: peer {i} must be (LinkSpec, ip, port), got {peer!r}")
        link, ip, port = peer
        if not isinstance(link, LinkSpec):
            raise ShapingError(f"{iface}: peer {i}: expected LinkSpec, got {type(link).__name__}")
        validate_link(link, f"{iface}: peer {i}")
        try:
            ip = str(ipaddress.IPv4Address(ip))
        except (ValueError, TypeError) as exc:
            raise ShapingError(f"{iface}: peer {i} ({link.name}): ip must be an IPv4 address, got {ip!r}") from exc
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 0xFFFF:
            raise ShapingError(f"{iface}: peer {i} ({link.name}): port must be in 1..65535, got {port!r}")
        if (ip, port) in seen:
            raise ShapingError(f"{iface}: peer {ip}:{port} is given twice")
        seen.add((ip, port))
        classid = ROOT_HANDLE | (FIRST_PEER_MINOR + i)
        planned.append(PeerPlan(link, ip, port, classid,
                                _peer_netem(link, namespace, iface, classid, (EGRESS_MAJOR + 1 + i) << 16),
                                filter_prio=i + 1, keys=u32_keys(ip, port)))
    return EgressPlan(iface, namespace, tuple(planned))


# applying and reading back (thin: one pyroute2 call per planned object)

def open_ipr(namespace: str = ""):
    """An IPRoute in `namespace` (must exist), or in this process's own namespace for ""."""
    from pyroute2 import IPRoute

    try:
        return ipr_in(namespace) if namespace else IPRoute()
    except Exception as exc:
        raise translate(f"opening netlink in {_where(namespace)}", exc) from exc


def _where(namespace: str) -> str:
    return f"network namespace {namespace}" if namespace else "this network namespace"


def root_qdisc(ipr, index: int) -> dict | None:
    """The root qdisc of interface `index` ({"kind", "handle", ...}), or None."""
    for msg in ipr.get_qdiscs(index=index):
        if msg["parent"] == TC_H_ROOT:
            return {"kind": msg.get_attr("TCA_KIND"), "handle": msg["handle"], "index": msg["index"]}
    return None


def read_tree(ipr, index: int) -> dict:
    """From the kernel: {"root": root qdisc, "leaves": {classid: decoded netem}, "filters": {prio: classid}}."""
    _, netem_tcmsg = netem_message_classes()
    ipr.asyncore.marshal.msg_map[RTM_NEWQDISC] = netem_tcmsg  # this socket's own copy of the map
    leaves = {}
    for msg in ipr.get_qdiscs(index=index):
        if msg["parent"] >> 16 == EGRESS_MAJOR and msg["parent"] != TC_H_ROOT:
            leaves[msg["parent"]] = decode_qdisc(msg)
    filters = {}
    for msg in ipr.get_filters(index=index, parent=ROOT_HANDLE):
        options = msg.get_attr("TCA_OPTIONS")
        classid = options.get_attr("TCA_U32_CLASSID") if options is not None else None
        if classid is not None:
            filters[msg["info"] >> 16] = classid
    return {"root": root_qdisc(ipr, index), "leaves": leaves, "filters": filters}


def check_tree(plan: EgressPlan, got: dict) -> list[str]:
    """Differences between the plan and the kernel's read-back (empty when they agree)."""
    root = got["root"]
    if not root or root["kind"] != "htb" or root["handle"] != ROOT_HANDLE:
        return [f"{plan.iface}: expected root htb {tc_handle(ROOT_HANDLE)}, kernel has {root}"]
    problems = []
    for p in plan.peers:
        problems += verify(p.netem, got["leaves"].get(p.classid))
        if got["filters"].get(p.filter_prio) != p.classid:
            problems.append(f"{plan.iface}: no u32 filter prio {p.filter_prio} -> {tc_handle(p.classid)} "
                            f"(kernel has {got['filters']})")
    return problems


def delete_root(ipr, index: int) -> bool:
    """Delete the root qdisc of `index` if it is ours (handle 6772:); True when one was deleted."""
    root = root_qdisc(ipr, index)
    if root is None or root["handle"] != ROOT_HANDLE:
        return False
    ipr.tc("del", index=index, handle=ROOT_HANDLE, parent=TC_H_ROOT)
    return True


def remove_leftovers(iface: str | None = None, namespace: str = "") -> list[str]:
    """Delete a 6772: root qdisc on `iface` (every interface when None); never touches another root."""
    removed = []
    try:
        with open_ipr(namespace) as ipr:
            names = {msg["index"]: msg.get_attr("IFLA_IFNAME") for msg in ipr.get_links()}
            if iface is not None and iface not in names.values():
                raise ShapingError(f"interface {iface} does not exist in {_where(namespace)}")
            for index, name in sorted(names.items()):
                if (iface is None or name == iface) and delete_root(ipr, index):
                    removed.append(f"egress qdisc {tc_handle(ROOT_HANDLE)} on {name}")
    except ShapingError:
        raise
    except Exception as exc:
        raise translate(f"removing egress qdiscs {tc_handle(ROOT_HANDLE)} in {_where(namespace)}", exc) from exc
    return removed


def _step(what: str, module: str, fn: Callable[[], object]) -> None:
    """Run one pyroute2 call; a failure becomes a ShapingError saying what, and why when the errno tells."""
    try:
        fn()
    except Exception as exc:
        hint = {errno.ENOENT: f" ({module} is not available in this kernel)", errno.EPERM: " (needs CAP_NET_ADMIN: "
                "run as root)"}.get(getattr(exc, "code", None) or getattr(exc, "errno", None), "")
        raise translate(f"{what}{hint}", exc) from exc


class EgressShaper:
    """This host's egress on one interface, shaped per (peer address, peer port); see the module docstring."""

    def __init__(self, iface: str, run_id: str, namespace: str | None = None) -> None:
        check_iface(iface)
        self.iface = iface
        self.run_id = run_id
        self.namespace = namespace or ""
        self.plan: EgressPlan | None = None
        self.previous_root: str | None = None  # the kind of kernel default root we replaced
        self.applied: dict = {}  # the kernel's read-back after apply/change
        self._installed = False

    def __enter__(self) -> EgressShaper:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def plan_lines(self, peers: list[Peer]) -> list[str]:
        return plan_egress(self.iface, peers, self.namespace).commands()

    def _index(self, ipr) -> int:
        found = ipr.link_lookup(ifname=self.iface)
        if not found:
            raise ShapingError(f"interface {self.iface} does not exist in {_where(self.namespace)}")
        return found[0]

    def apply(self, peers: list[Peer]) -> dict:
        """Build the tree, read it back, insist the kernel took every setting; returns the read-back."""
        if self._installed:
            raise ShapingError(f"{self.iface}: egress shaping is already applied; close() it first")
        plan = plan_egress(self.iface, peers, self.namespace)
        if not effective_capabilities() & (1 << CAP_NET_ADMIN):
            raise ShapingError(f"shaping egress on {self.iface} needs CAP_NET_ADMIN: run as root "
                               f"(uid {os.geteuid()})")
        with open_ipr(self.namespace) as ipr:
            index = self._index(ipr)
            root = root_qdisc(ipr, index)
            if root and root["handle"] == ROOT_HANDLE:
                raise ShapingError(f"{self.iface} already has the egress root {tc_handle(ROOT_HANDLE)} (a leftover "
                                   f"of a killed run? `python -m testbed clean` removes it)")
            if root and root["handle"]:
                raise ShapingError(f"{self.iface} has a root qdisc {root['kind']} {tc_handle(root['handle'])} "
                                   f"that the testbed did not create; remove it or shape another interface")
            self.previous_root = root["kind"] if root else None
            root_what = f"adding root htb {tc_handle(ROOT_HANDLE)} on {self.iface}"
            _step(root_what, "sch_htb", lambda: ipr.tc("add", "htb", index, ROOT_HANDLE, default=0))
            self._installed = True
            try:
                for p in plan.peers:
                    self._add_peer(ipr, index, p)
                got = read_tree(ipr, index)
                problems = check_tree(plan, got)
                if problems:
                    raise ShapingError("the kernel did not take the planned egress shaping: " + "; ".join(problems))
            except BaseException:
                delete_root(ipr, index)  # nothing half-built stays behind
                self._installed = False
                raise
        self.plan, self.applied = plan, got
        return got

    def _add_peer(self, ipr, index: int, p: PeerPlan) -> None:
        rate = round(max(PEER_CLASS_RATE_MBIT, p.link.rate_mbit) * BYTES_PER_MBIT)  # bytes/s
        burst = round(rate * CLASS_BURST_S)
        peer = f"{self.iface} for {p.ip}:{p.port} ({p.link.name})"
        _step(f"adding htb class {tc_handle(p.classid)} on {peer}", "sch_htb",
              lambda: ipr.tc("add-class", "htb", index, p.classid, parent=ROOT_HANDLE, rate=rate, ceil=rate,
                             burst=burst, cburst=burst))
        _step(f"adding netem {tc_handle(p.netem.handle)} on {peer}", "sch_netem",
              lambda: request(ipr, netem_message(p.netem, index), RTM_NEWQDISC, NEW_FLAGS))
        _step(f"adding u32 filter prio {p.filter_prio} on {peer}", "cls_u32",
              lambda: ipr.tc("add-filter", "u32", index, parent=ROOT_HANDLE, prio=p.filter_prio,
                             protocol=ETH_P_IP, target=p.classid, keys=list(p.keys)))

    def change(self, dst: tuple[str, int] | str, **netem: float) -> dict:
        """`tc qdisc change` one peer's netem live (delay_ms, jitter_ms, loss_pct, rate_mbit); returns the read-back."""
        if not self._installed or self.plan is None:
            raise ShapingError(f"{self.iface}: egress shaping is not applied")
        if set(netem) - set(NETEM_FIELDS):
            raise ShapingError(f"{self.iface}: change() takes {', '.join(NETEM_FIELDS)}, got {', '.join(netem)}")
        old = self.plan.peer(dst)
        link = replace(old.link, **netem)
        validate_link(link, f"{self.iface}: {old.ip}:{old.port}")
        new = replace(old, link=link, netem=_peer_netem(link, self.namespace, self.iface, old.classid,
                                                        old.netem.handle))
        with open_ipr(self.namespace) as ipr:
            index = self._index(ipr)
            _step(f"changing netem {tc_handle(new.netem.handle)} on {self.iface} for {new.ip}:{new.port}", "sch_netem",
                  lambda: request(ipr, netem_message(new.netem, index), RTM_NEWQDISC, CHANGE_FLAGS))
            got = read_tree(ipr, index)
        problems = verify(new.netem, got["leaves"].get(new.classid))
        if problems:
            raise ShapingError("the kernel did not take the changed netem settings: " + "; ".join(problems))
        self.plan = replace(self.plan, peers=tuple(new if p is old else p for p in self.plan.peers))
        self.applied = got
        return got["leaves"][new.classid]

    def describe(self) -> list[str]:
        """What is applied now, one line per peer (for the run summary); [] when nothing is."""
        return self.plan.describe() if self._installed and self.plan else []

    def close(self) -> None:
        """Delete our root (and with it every class, leaf and filter); idempotent, safe if apply failed."""
        if not self._installed:
            return
        if self.namespace and self.namespace not in netns.listnetns():
            self._installed = False  # the namespace took the interface and our qdiscs with it
            return
        try:
            with open_ipr(self.namespace) as ipr:
                found = ipr.link_lookup(ifname=self.iface)
                if found:  # an interface that is gone took our qdiscs with it
                    delete_root(ipr, found[0])
        except Exception as exc:
            raise translate(f"removing egress root {tc_handle(ROOT_HANDLE)} from {self.iface}", exc) from exc
        self._installed = False
