"""Kernel netem backend: applies a `netem.plan.NetworkPlan` with pyroute2, checks it, and tears it down.

Life cycle (see netem/base.py)::

    shaper = KernelShaper(links, n_stages, run_id)     # plans (pure, validates input)
    shaper.plan_lines()                                 # the same plan as ip/tc commands, applies nothing
    async with shaper:                                  # namespaces, veths, addresses, sysctls, netem
        shaper.agent_netns(stage)                       # the fork server's child enters it (setns), or
        argv = shaper.agent_command_prefix(stage) + [sys.executable, "-m", "agents.process.agent", ...]
        ...                                             # agents bind 0.0.0.0:0 in their namespace
        peers = await shaper.connect(listen)            # {(src, dst): (dst's address on the pair, port)}
    # every namespace (and with it every veth and qdisc) is gone, on every exit path

Applying is a thin layer over the plan: one pyroute2 call per planned object, no decisions. The
netlink messages live in `netem.netlink`, namespaces/veths/sysctls/offloads and the teardown in
`netem.nsutil`.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import shutil
from dataclasses import replace

import trio

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC

from netem.base import ScheduleChange, Shaper, ShaperOptions
from netem.commands import network_commands
from netem.netlink import link_index, netem_message, read_qdisc, request, translate, verify
from netem.nsutil import (
    OFFLOADS_OFF,
    NamespaceSockets,
    create_namespace,
    create_veth,
    in_namespace,
    set_offloads,
    teardown,
    write_sysctls,
)
from netem.plan import INITIAL_WINDOW_SEGMENTS, NetemPlan, NetworkPlan, plan_netem, plan_network
from testbed.core import clock
from testbed.core.errors import ShapingError
from testbed.core.records import Address, LinkSpec

ANY_HOSTS = {"0.0.0.0", "", "::"}
NEW_QDISC_FLAGS = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL  # `tc qdisc add`: fail if one exists


def segment_packets(ipr, index: int, q: NetemPlan) -> dict:
    """A lossy link's sender sends one TCP segment a packet (gso_max_segs 1). Linux's TCP builds its segments into
    GSO packets whatever the device offers (with TSO and GSO off too) and splits them only after the qdisc, so
    netem's loss would drop a whole GSO packet a draw: 2-17 segments at 100 Mbit/s, a few times fewer loss events
    than the link's rate says (inside user-mode-linux: 40 drops where 180 were due). A router drops segments; so
    does the model (testbed.core.tcp). Loss-free links keep GSO (fewer packets for the guest to move). The read-back
    goes with the qdisc's."""
    if q.loss_pct <= 0:
        return {}
    ipr.link("set", index=index, gso_max_segs=1)
    return {"gso_max_segs": ipr.link("get", index=index)[0].get_attr("IFLA_GSO_MAX_SEGS")}


def add_netem(q: NetemPlan, sockets: NamespaceSockets) -> dict:
    """Add one planned root netem qdisc, read it back, and insist the kernel took every setting."""
    try:
        ipr = sockets(q.namespace)
        index = link_index(ipr, q.ifname, q.namespace)
        request(ipr, netem_message(q, index), RTM_NEWQDISC, NEW_QDISC_FLAGS)
        got = read_qdisc(q.namespace, q.ifname, ipr) | segment_packets(ipr, index, q)
    except ShapingError:
        raise
    except Exception as exc:
        hint = " (sch_netem not available in this kernel)" if getattr(exc, "code", None) == errno.ENOENT else ""
        raise translate(f"adding netem on {q.ifname} in {q.namespace} for link {q.link.name}{hint}", exc) from exc
    problems = verify(q, got)
    if problems:
        raise ShapingError("the kernel did not take the planned netem settings: " + "; ".join(problems))
    return got  # type: ignore[return-value]


def change_netem(q: NetemPlan, sockets: NamespaceSockets | None = None, index: int | None = None) -> dict:
    """`tc qdisc change`: give a running link's netem qdisc new settings (a moving network), read back, verified.

    With `sockets` and the interface's `index` from warm_schedule_sockets the change lands in one netlink round
    trip. Without, it opens a socket (a helper process) and looks the interface up (pyroute2 parses every link
    of the namespace in Python): with the agents' compute on user-mode-linux's one vCPU, over a second.
    """
    own = sockets is None
    sockets = NamespaceSockets() if own else sockets
    try:
        ipr = sockets(q.namespace)
        index = link_index(ipr, q.ifname, q.namespace) if index is None else index
        request(ipr, netem_message(q, index), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK)
        got = read_qdisc(q.namespace, q.ifname, ipr) | segment_packets(ipr, index, q)
    except ShapingError:
        raise
    except Exception as exc:
        raise translate(f"changing netem on {q.ifname} in {q.namespace} for link {q.link.name}", exc) from exc
    finally:
        if own:
            sockets.close()
    problems = verify(q, got)
    if problems:
        raise ShapingError("the kernel did not take the scheduled netem settings: " + "; ".join(problems))
    return got  # type: ignore[return-value]


def warm_schedule_sockets(plan: NetworkPlan, sockets: NamespaceSockets) -> dict[tuple[str, str], int]:
    """Open one socket per namespace of `plan` for change_netem, warmed by a qdisc dump; the interfaces' indexes."""
    indexes = {}
    for q in plan.qdiscs:
        try:
            ipr = sockets(q.namespace)
            indexes[(q.namespace, q.ifname)] = link_index(ipr, q.ifname, q.namespace)
            read_qdisc(q.namespace, q.ifname, ipr)
        except ShapingError:
            raise
        except Exception as exc:
            raise translate(f"opening a netlink socket in {q.namespace} for the link schedule", exc) from exc
    return indexes


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
                sysctls[ns.name] = in_namespace(ns.name, lambda ns=ns: write_sysctls(ns.sysctls))
                offloads.update(in_namespace(ns.name, lambda ns=ns: set_offloads(ends[ns.name], enabled=False)))
            except Exception as exc:  # OSError, or pyroute2's EthtoolError
                raise translate(f"setting sysctls/offloads in {ns.name}", exc) from exc
        qdiscs = {q.link.name: add_netem(q, sockets) for q in plan.qdiscs}
        for q in plan.ack_qdiscs:  # transport "kernel": the ACKs' way back (NetworkPlan.ack_qdiscs)
            qdiscs[f"{q.link.name} (ACKs)"] = add_netem(q, sockets)
    finally:
        sockets.close()
    return {"qdiscs": qdiscs, "offloads": offloads, "sysctls": sysctls}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class KernelShaper(Shaper):
    """One namespace per agent, a veth pair per linked pair, netem on each direction's egress.

    Of `options` (ShaperOptions) it reads the transport (tuned or the kernel's defaults) and the schedule: netem
    drops real packets and the kernel's own TCP retransmits them, so loss_rto_ms has nothing to configure here.
    """

    name = "netem"

    @property
    def warm_windows(self) -> bool:
        """A fresh connection's windows would cost a big first frame round trips (Shaper): warmed under transport
        "tuned"; transport "kernel" is a cold connection on purpose, its first big frame paying its slow start."""
        return self.options.transport == "tuned"

    def __init__(self, links: list[LinkSpec], n_stages: int, run_id: str,
                 options: ShaperOptions | None = None) -> None:
        super().__init__(links, n_stages, run_id, options)
        self.plan = plan_network(self.links, n_stages, run_id, self.options.transport)
        self.reason = self.reason or "netem: kernel qdiscs in network namespaces"
        self._created: list[str] = []
        self._applied: dict = {}
        self._ip = shutil.which("ip") or "ip"
        self._closed = False
        self._schedule_sockets = NamespaceSockets()  # used by one thread at a time (self._schedule_lock)
        self._schedule_lock = trio.Lock()
        self._schedule_indexes: dict[tuple[str, str], int] = {}

    def plan_lines(self) -> list[str]:
        return network_commands(self.plan) + [f"at {e.at_s:g} s: tc qdisc change on link {e.link}: {e.describe()}"
                                              for e in self.schedule]

    async def setup(self) -> None:
        if shutil.which("ip") is None:
            raise ShapingError("the `ip` command (iproute2) is needed to start agents inside namespaces")
        self._closed = False
        self._applied = apply_plan(self.plan, self._created)
        if self.schedule:  # now, before the run's clock starts: a change must not wait for pyroute2's set-up
            self._schedule_indexes = warm_schedule_sockets(self.plan, self._schedule_sockets)

    def agent_command_prefix(self, stage: int) -> list[str]:
        # `ip netns exec` keeps the environment and inherited fds (pass_fds) and execs the command
        return [self._ip, "netns", "exec", self.plan.namespace(self._stage(stage))]

    def agent_netns(self, stage: int) -> str:
        from pyroute2 import netns

        return os.path.join(netns.NETNS_RUN_DIR, self.plan.namespace(self._stage(stage)))

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
        self._schedule_sockets.close()
        if self._closed and not self._created:
            return
        try:
            if self._created:  # only what this run created: a same-named namespace from before is not ours
                teardown(self.plan.prefix, only=list(self._created))
        finally:
            self._created.clear()
            self._closed = True

    async def start_schedule(self, origin: float, nursery: trio.Nursery | None = None) -> None:
        """Apply the schedule with `tc qdisc change` at its times (a partition: loss 100% for down_s, then back)."""
        if not self.schedule:
            return
        if nursery is None:
            raise ShapingError("the netem backend needs a nursery to run a link schedule in")
        current = {(q.link.src, q.link.dst): q for q in self.plan.qdiscs}

        async def change(q: NetemPlan, at: float, what: str) -> float:
            """Apply `q` at `at`; the time the kernel acknowledged it (ScheduleChange: inside user-mode-linux the
            netlink round trip alone took up to a second or two)."""
            await clock.sleep_until(at)
            async with self._schedule_lock:
                sent = clock.now()
                await trio.to_thread.run_sync(change_netem, q, self._schedule_sockets,
                                              self._schedule_indexes.get((q.namespace, q.ifname)))
            landed = clock.now()
            self.schedule_changes.append(ScheduleChange(q.link.name, what, round(at - origin, 6),
                                                        round(sent - origin, 6), round(landed - origin, 6)))
            return landed

        async def run() -> None:
            async with trio.open_nursery() as inner:
                for event in self.schedule:
                    key = (event.src, event.dst)
                    q = current[key]
                    at = origin + event.at_s
                    if event.down_s:
                        down = plan_netem(replace(q.link, loss_pct=100.0), q.namespace, q.ifname)
                        landed = await change(down, at, event.describe())
                        # back as it was: down for down_s from when the partition landed
                        inner.start_soon(change, q, landed + event.down_s, f"{event.link} back up")
                        continue
                    values = {k: getattr(event, k) for k in ("delay_ms", "jitter_ms", "loss_pct", "rate_mbit")
                              if getattr(event, k) is not None}
                    current[key] = plan_netem(replace(q.link, **values), q.namespace, q.ifname)
                    await change(current[key], at, event.describe())

        nursery.start_soon(run)

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
            **super().describe(),
            "prefix": self.plan.prefix,
            "namespaces": [ns.name for ns in self.plan.namespaces],
            "kernel": os.uname().release,
            "offloads_off": list(OFFLOADS_OFF),
            "sysctls": dict(self.plan.namespaces[0].sysctls) if self.plan.namespaces else {},
            "initial_window_segments": INITIAL_WINDOW_SEGMENTS if self.plan.transport == "tuned" else None,
            "transport": self.plan.transport,
            "links": links,
        }
