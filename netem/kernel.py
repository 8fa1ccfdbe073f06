"""Kernel netem backend: applies a `netem.plan.NetworkPlan` with pyroute2 and reads it back from the kernel.

Life cycle (see netem/base.py)::

    shaper = KernelShaper(links, n_stages, run_id)     # plans (pure, validates input)
    async with shaper:                                  # namespaces, veths, addresses, sysctls, netem
        argv = shaper.agent_command_prefix(stage) + [sys.executable, "-m", "agents.agent", ...]
        ...                                             # agents bind 0.0.0.0:0 in their namespace
        peers = await shaper.connect(listen)            # {(src, dst): (dst's address on the pair, port)}
    # every namespace (and with it every veth and qdisc) is gone, on every exit path

Applying is a thin layer over the plan: one pyroute2 call per planned object, no decisions. The netem
qdisc goes as a hand-built RTM_NEWQDISC because pyroute2 0.9's netem helper cannot send a delay
distribution table, 64-bit latency/jitter or a PRNG seed; `NetemOptions` below adds those attributes
to pyroute2's own netem options class, and the same class decodes the kernel's dump for `read_qdisc`.

Offloads: GSO, TSO and GRO are turned off on every veth end with the legacy ethtool ioctls
(ETHTOOL_S{GSO,TSO,GRO}, from a thread that has entered the namespace), so netem's rate and limit
see wire-sized packets, not 64 KB super-packets.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import shutil
import socket
import struct
import threading
from functools import lru_cache
from typing import Any, Callable

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC

from netem.base import Shaper
from testbed.core.records import Address, LinkSpec
from netem.plan import (
    INITIAL_WINDOW_SEGMENTS,
    NetemPlan,
    NetworkPlan,
    VethPlan,
    is_testbed_name,
    normal_distribution_table,
    plan_network,
)
from testbed.core.errors import ShapingError

CLONE_NEWNET = 0x40000000
SIOCETHTOOL = 0x8946
ETHTOOL_GET_SET = {"tso": (0x1E, 0x1F), "gso": (0x23, 0x24), "gro": (0x2B, 0x2C)}
OFFLOADS_OFF = ("tso", "gso", "gro")
ANY_HOSTS = {"0.0.0.0", "", "::"}
U32_MAX = 0xFFFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)


# ----------------------------------------------------------------------------------------------------
# pyroute2 glue: netem options with the attributes pyroute2 0.9 leaves out

# pyroute2 compiles a class's nla_map once and caches it in class attributes that a subclass
# inherits when the parent happened to be compiled first (e.g. by the probe's plain tc() call): the
# subclass would then silently encode with the parent's map. Each subclass gets its own empty cache.
_OWN_NLA_CACHE = {"_nlmsg_base__compiled_nla": False, "_nlmsg_base__t_nla_map": None,
                  "_nlmsg_base__r_nla_map": None}


@lru_cache(maxsize=1)  # one class pair per process
def _netem_message_classes() -> tuple[type, type]:
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


def _ipr(namespace: str):
    """An IPRoute inside an existing namespace (flags=0: never creates one by accident)."""
    from pyroute2 import IPRoute

    return IPRoute(netns=namespace, flags=0)


def _translate(what: str, exc: BaseException) -> ShapingError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return ShapingError(f"{what}: {name} {exc}".replace(":  ", ": "))


def netem_message(q: NetemPlan, index: int):
    """The RTM_NEWQDISC message for one planned netem qdisc on interface `index`."""
    from pyroute2.netlink.rtnl.tcmsg import sched_netem

    _, netem_tcmsg = _netem_message_classes()
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


def _request(ipr, msg, msg_type: int, flags: int):
    # pyroute2 0.9.7's sync nlm_request reads status['nlm_generator'], which IPRoute never sets
    ipr.status["nlm_generator"] = False
    return ipr.nlm_request(msg, msg_type, flags)


# ----------------------------------------------------------------------------------------------------
# running a few syscalls inside a namespace (sysctl files, ethtool ioctls)

def in_namespace(namespace: str, fn: Callable[[], Any]) -> Any:
    """Run fn() in a short-lived thread that has entered `namespace` (setns affects only that thread)."""
    from pyroute2 import netns

    path = os.path.join(netns.NETNS_RUN_DIR, namespace)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({path}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{namespace}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _ethtool(sock: socket.socket, ifname: str, cmd: int, value: int = 0) -> int:
    data = ctypes.create_string_buffer(struct.pack("II", cmd, value), 8)
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(data)).ljust(40, b"\0")
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
    return struct.unpack("II", data.raw)[1]


def _set_offloads(ifnames: list[str], enabled: bool) -> dict[str, dict[str, int]]:
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for ifname in ifnames:
            for feature in OFFLOADS_OFF:
                _ethtool(sock, ifname, ETHTOOL_GET_SET[feature][1], int(enabled))
            out[ifname] = _get_offloads(sock, ifname)
    return out


def _get_offloads(sock: socket.socket, ifname: str) -> dict[str, int]:
    return {feature: _ethtool(sock, ifname, ETHTOOL_GET_SET[feature][0]) for feature in OFFLOADS_OFF}


def _sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/").lstrip("/")


def _write_sysctls(sysctls: tuple[tuple[str, str], ...]) -> dict[str, str]:
    out = {}
    for key, value in sysctls:
        with open(_sysctl_path(key), "w") as f:
            f.write(value)
        with open(_sysctl_path(key)) as f:
            out[key] = f.read().strip()
    return out


# ----------------------------------------------------------------------------------------------------
# read-back (used by tests and by setup's own verification)

def read_sysctl(namespace: str, key: str) -> str:
    """A sysctl as seen inside `namespace` (key like "net/ipv4/tcp_slow_start_after_idle")."""

    def read() -> str:
        with open(_sysctl_path(key)) as f:
            return f.read().strip()

    return in_namespace(namespace, read)


def read_offloads(namespace: str, ifname: str) -> dict[str, int]:
    """{"tso": 0/1, "gso": 0/1, "gro": 0/1} of one interface, from the kernel."""

    def read() -> dict[str, int]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            return _get_offloads(sock, ifname)

    return in_namespace(namespace, read)


def read_links(namespace: str) -> dict[str, dict]:
    """{ifname: {"index", "state", "addresses": ["10.201.0.1/30", ...]}} of every link in `namespace`."""
    with _ipr(namespace) as ipr:
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
    with _ipr(namespace) as ipr:
        out = []
        for msg in ipr.route("dump", table=254, family=socket.AF_INET):
            metrics = msg.get_attr("RTA_METRICS")
            m = dict(metrics["attrs"]) if metrics else {}
            out.append({"dst": msg.get_attr("RTA_DST"), "dst_len": msg["dst_len"], "oif": msg.get_attr("RTA_OIF"),
                        "initcwnd": m.get("RTAX_INITCWND"), "initrwnd": m.get("RTAX_INITRWND")})
        return out


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
        with _ipr(namespace) as own:
            return read_qdisc(namespace, ifname, own)
    _, netem_tcmsg = _netem_message_classes()
    index = _link_index(ipr, ifname, namespace)
    ipr.asyncore.marshal.msg_map[RTM_NEWQDISC] = netem_tcmsg  # this socket's own copy of the map
    for msg in ipr.get_qdiscs(index=index):
        if msg["parent"] == 0xFFFFFFFF:
            return decode_qdisc(msg)
    return None


def read_back(plan: NetworkPlan) -> dict:
    """The kernel's view of everything in `plan`: namespaces present, links, and each link's qdisc."""
    from pyroute2 import netns

    present = set(netns.listnetns())
    out: dict[str, Any] = {"namespaces": {ns.name: ns.name in present for ns in plan.namespaces}, "qdiscs": {}}
    for q in plan.qdiscs:
        if q.namespace in present:
            out["qdiscs"][q.link.name] = read_qdisc(q.namespace, q.ifname)
    return out


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
    return problems


# ----------------------------------------------------------------------------------------------------
# apply / tear down

def _link_index(ipr, ifname: str, namespace: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise ShapingError(f"interface {ifname} did not appear in namespace {namespace}")
    return found[0]


def _configure_end(ipr, namespace: str, ifname: str, address: str, prefixlen: int, subnet: str) -> None:
    index = _link_index(ipr, ifname, namespace)
    ipr.addr("add", index=index, address=address, prefixlen=prefixlen)
    ipr.link("set", index=index, state="up")
    network, _, length = subnet.partition("/")
    # the connected route again, with a large initial window: a 50 KB frame leaves in one flight
    ipr.route("replace", dst=network, dst_len=int(length), oif=index, prefsrc=address, scope=253, proto=2,
              metrics={"initcwnd": INITIAL_WINDOW_SEGMENTS, "initrwnd": INITIAL_WINDOW_SEGMENTS})


class NamespaceSockets:
    """One pyroute2 IPRoute per namespace while applying (each one costs a helper process to open)."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def __call__(self, namespace: str):
        if namespace not in self._open:
            self._open[namespace] = _ipr(namespace)
        return self._open[namespace]

    def close(self) -> None:
        while self._open:
            _, ipr = self._open.popitem()
            try:
                ipr.close()
            except Exception:
                pass


def create_namespace(name: str, created: list[str], sockets: NamespaceSockets) -> None:
    from pyroute2 import netns

    if name in netns.listnetns():
        raise ShapingError(f"network namespace {name} already exists (a leftover of an earlier run with "
                           f"the same id? `python -m testbed clean` removes testbed leftovers)")
    try:
        netns.create(name)
    except Exception as exc:
        raise _translate(f"creating network namespace {name}", exc) from exc
    created.append(name)
    try:
        ipr = sockets(name)
        ipr.link("set", index=_link_index(ipr, "lo", name), state="up")
    except ShapingError:
        raise
    except Exception as exc:
        raise _translate(f"bringing lo up in {name}", exc) from exc


def create_veth(v: VethPlan, sockets: NamespaceSockets) -> None:
    try:
        ipr_a = sockets(v.namespace_a)
        ipr_a.link("add", ifname=v.ifname_a, kind="veth", peer={"ifname": v.ifname_b, "net_ns_fd": v.namespace_b})
        _configure_end(ipr_a, v.namespace_a, v.ifname_a, v.address_a, v.prefixlen, v.subnet)
        _configure_end(sockets(v.namespace_b), v.namespace_b, v.ifname_b, v.address_b, v.prefixlen, v.subnet)
    except ShapingError:
        raise
    except Exception as exc:
        hint = " (is the veth module available?)" if getattr(exc, "code", None) == errno.EOPNOTSUPP else ""
        raise _translate(f"creating veth pair {v.ifname_a} <-> {v.ifname_b}{hint}", exc) from exc


def add_netem(q: NetemPlan, sockets: NamespaceSockets) -> dict:
    """Add one planned root netem qdisc, read it back, and insist the kernel took every setting."""
    try:
        ipr = sockets(q.namespace)
        index = _link_index(ipr, q.ifname, q.namespace)
        _request(ipr, netem_message(q, index), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
        got = read_qdisc(q.namespace, q.ifname, ipr)
    except ShapingError:
        raise
    except Exception as exc:
        hint = " (sch_netem not available in this kernel)" if getattr(exc, "code", None) == errno.ENOENT else ""
        raise _translate(f"adding netem on {q.ifname} in {q.namespace} for link {q.link.name}{hint}", exc) from exc
    problems = verify(q, got)
    if problems:
        raise ShapingError("the kernel did not take the planned netem settings: " + "; ".join(problems))
    return got  # type: ignore[return-value]


def apply_plan(plan: NetworkPlan, created: list[str]) -> dict:
    """Create everything in `plan`; names of created namespaces are appended to `created` as we go.

    Returns the kernel's read-back: {"qdiscs": {link: decoded qdisc}, "offloads": ..., "sysctls": ...}.
    """
    sockets = NamespaceSockets()
    try:
        for ns in plan.namespaces:
            create_namespace(ns.name, created, sockets)
        for veth in plan.veths:
            create_veth(veth, sockets)
        ends: dict[str, list[str]] = {ns.name: [] for ns in plan.namespaces}
        for veth in plan.veths:
            ends[veth.namespace_a].append(veth.ifname_a)
            ends[veth.namespace_b].append(veth.ifname_b)
        offloads: dict[str, dict] = {}
        sysctls: dict[str, dict] = {}
        for ns in plan.namespaces:
            try:
                sysctls[ns.name] = in_namespace(ns.name, lambda ns=ns: _write_sysctls(ns.sysctls))
                offloads.update(in_namespace(ns.name, lambda ns=ns: _set_offloads(ends[ns.name], enabled=False)))
            except OSError as exc:
                raise _translate(f"setting sysctls/offloads in {ns.name}", exc) from exc
        qdiscs = {q.link.name: add_netem(q, sockets) for q in plan.qdiscs}
    finally:
        sockets.close()
    return {"qdiscs": qdiscs, "offloads": offloads, "sysctls": sysctls}


def remove_namespaces(names: list[str]) -> list[str]:
    """Delete our veths, then our namespaces (only the given testbed names). Returns what was removed."""
    from pyroute2 import netns

    removed = []
    errors = []
    present = set(netns.listnetns())
    for name in names:
        if not is_testbed_name(name) or name not in present:
            continue
        # delete the links first: a process still inside keeps the namespace (and its veths) alive
        try:
            with _ipr(name) as ipr:
                for msg in ipr.get_links():
                    ifname = msg.get_attr("IFLA_IFNAME")
                    if ifname and is_testbed_name(ifname):
                        try:
                            ipr.link("del", index=msg["index"])
                        except Exception as exc:
                            if getattr(exc, "code", None) != errno.ENODEV:
                                errors.append(f"deleting {ifname} in {name}: {exc}")
        except Exception as exc:
            errors.append(f"listing links of {name}: {exc}")
        try:
            netns.remove(name)
            removed.append(name)
        except FileNotFoundError:
            pass
        except Exception as exc:
            errors.append(f"removing namespace {name}: {exc}")
    if errors:
        raise ShapingError("teardown incomplete: " + "; ".join(errors))
    return removed


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class KernelShaper(Shaper):
    """One namespace per agent, a veth pair per linked pair, netem on each direction's egress."""

    name = "netem"

    def __init__(self, links: list[LinkSpec], n_stages: int, run_id: str) -> None:
        super().__init__(links, n_stages, run_id)
        self.plan = plan_network(self.links, n_stages, run_id)
        self.reason = self.reason or "netem: kernel qdiscs in network namespaces"
        self._created: list[str] = []
        self._applied: dict = {}
        self._ip = shutil.which("ip") or "ip"
        self._closed = False

    async def setup(self) -> None:
        if shutil.which("ip") is None:
            raise ShapingError("the `ip` command (iproute2) is needed to start agents inside namespaces")
        self._closed = False
        self._applied = apply_plan(self.plan, self._created)

    def agent_command_prefix(self, stage: int) -> list[str]:
        # `ip netns exec` keeps the environment and inherited fds (pass_fds) and execs the command
        return [self._ip, "netns", "exec", self.plan.namespace(self._stage(stage))]

    def agent_listen_host(self, stage: int) -> str:
        self._stage(stage)
        return "0.0.0.0"  # a stage is reachable on one address per pair it belongs to

    async def connect(self, listen: dict[int, Address]) -> dict[tuple[int, int], Address]:
        """Each src dials dst's address on their pair's subnet, at the port dst's agent bound.

        Only the port of `listen` matters: agents bind agent_listen_host() (0.0.0.0) in their own
        namespace, which the launcher may report as 127.0.0.1. A host that is neither "any",
        loopback, nor one of dst's pair addresses means the agent bound somewhere unreachable.
        """
        peers = {}
        for link in self.links:
            if link.dst not in listen:
                raise ShapingError(f"no listener reported for stage {link.dst} (needed by link {link.name})")
            host, port = listen[link.dst]
            dst_addresses = {v.end(link.dst)[2] for v in self.plan.veths if link.dst in (v.a, v.b)}
            if host not in ANY_HOSTS and not _is_loopback(host) and host not in dst_addresses:
                raise ShapingError(f"stage {link.dst} listens on {host}, unreachable over the veth of link "
                                   f"{link.name}; bind {self.agent_listen_host(link.dst)}")
            peers[(link.src, link.dst)] = (self.plan.peer_hosts[(link.src, link.dst)], int(port))
        return peers

    async def aclose(self) -> None:
        # No awaits: nothing here can be cancelled half-way, so no shield is needed.
        if self._closed and not self._created:
            return
        try:
            remove_namespaces(list(self._created))
        finally:
            self._created.clear()
            self._closed = True

    def _stage(self, stage: int) -> int:
        if not isinstance(stage, int) or not 0 <= stage < self.n_stages:
            raise ShapingError(f"stage must be in 0..{self.n_stages - 1}, got {stage!r}")
        return stage

    def describe(self) -> dict:
        links = []
        for q in self.plan.qdiscs:
            veth = self.plan.pair(q.link.src, q.link.dst)
            got = self._applied.get("qdiscs", {}).get(q.link.name) or {}
            links.append({
                "link": q.link.name,
                "namespace": q.namespace,
                "device": q.ifname,
                "dial": self.plan.peer_hosts[(q.link.src, q.link.dst)],
                "subnet": veth.subnet,
                "delay_ms": q.link.delay_ms,
                "jitter_ms": q.link.jitter_ms,
                "jitter_distribution": q.distribution,
                "loss_pct": q.link.loss_pct,
                "rate_mbit": q.link.rate_mbit,
                "netem_rate_mbit": q.rate_bytes_s * 8 / 1e6,
                "rate_is_fifo_only": q.rate_is_fifo_only,
                "limit_packets": q.limit_packets,
                "seed": q.seed,
                "seed_applied": got.get("seed") is not None if got else None,
                "kernel_delay_us": got.get("delay_us"),
            })
        return {
            "backend": self.name,
            "reason": self.reason,
            "prefix": self.plan.prefix,
            "namespaces": [ns.name for ns in self.plan.namespaces],
            "kernel": os.uname().release,
            "offloads_off": list(OFFLOADS_OFF),
            "sysctls": dict(self.plan.namespaces[0].sysctls) if self.plan.namespaces else {},
            "initial_window_segments": INITIAL_WINDOW_SEGMENTS,
            "links": links,
        }
