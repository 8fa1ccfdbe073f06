"""Capability probe for the kernel netem backend: CAP_NET_ADMIN, netns, veth, sch_netem (tried, then removed).

    from netem.probe import probe
    caps = probe()          # Capabilities(has_cap_net_admin=True, has_netns=True, has_veth=True,
                            #              has_netem=False, detail="...; sch_netem: no (...)")

The probe creates one throw-away namespace named like a testbed object (`gr<5 hex>-s0`, so
`python -m testbed clean` would find it after a crash), adds a veth pair inside it and a netem
qdisc on one end, and removes the namespace (which takes the veths and the qdisc with it) in a
`finally`. Nothing is created outside that namespace.
"""

from __future__ import annotations

import errno
import os
import secrets
from dataclasses import dataclass

from netem.plan import ROOT_HANDLE, namespace_name, run_prefix, veth_name

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21  # creating and mounting a named namespace needs it too


@dataclass(frozen=True)
class Capabilities:
    has_cap_net_admin: bool
    has_netns: bool
    has_veth: bool
    has_netem: bool
    detail: str

    @property
    def netem_ready(self) -> bool:
        return self.has_cap_net_admin and self.has_netns and self.has_veth and self.has_netem

    def plain(self) -> str:
        """What keeps the kernel backend out, in plain words, with the one thing a user can do about it (the
        probe's every step is in `detail`)."""
        if not self.has_cap_net_admin:
            return "not root, so no network namespaces or qdiscs (run as root to shape with netem)"
        if not self.has_netns:
            return "this kernel has no network namespaces (netem needs a kernel with CONFIG_NET_NS)"
        if not self.has_veth:
            return "this kernel has no veth links (modprobe veth, or use a kernel with CONFIG_VETH)"
        if not self.has_netem:
            return "this kernel has no sch_netem (modprobe sch_netem; make test-netem runs netem in user-mode-linux)"
        return "root, netns, veth and sch_netem available"

    def missing(self) -> list[str]:
        """The missing pieces, in the order a user must fix them."""
        out = []
        if not self.has_cap_net_admin:
            out.append("CAP_NET_ADMIN (run as root)")
        elif not self.has_netns:
            out.append("network namespaces")
        elif not self.has_veth:
            out.append("veth")
        elif not self.has_netem:
            out.append("sch_netem")
        return out


def effective_capabilities() -> int:
    """The CapEff bit mask of this process (0 when /proc is unreadable)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def _why(exc: BaseException) -> str:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return f"{type(exc).__name__} {name} {exc}".replace("  ", " ").strip()


def probe() -> Capabilities:
    """Try each piece the kernel backend needs, in a throw-away namespace; never leaves anything behind."""
    caps = effective_capabilities()
    has_admin = bool(caps & (1 << CAP_NET_ADMIN))
    has_sys_admin = bool(caps & (1 << CAP_SYS_ADMIN))
    if not has_admin or not has_sys_admin:
        missing = " and ".join(n for n, ok in (("CAP_NET_ADMIN", has_admin), ("CAP_SYS_ADMIN", has_sys_admin))
                               if not ok)
        return Capabilities(has_admin, False, False, False,
                            f"not root: no {missing} (uid {os.geteuid()}); netns, veth and sch_netem not tried")
    try:
        from pyroute2 import IPRoute, netns
        from pyroute2.netlink.exceptions import NetlinkError
    except ImportError as exc:
        return Capabilities(True, False, False, False, f"pyroute2 is not importable ({exc})")

    prefix = run_prefix(secrets.token_hex(8))
    name = namespace_name(prefix, 0)
    notes = ["CAP_NET_ADMIN: yes"]
    has_netns = has_veth = has_netem = False
    created = False
    try:
        try:
            netns.create(name)
            created = True
            has_netns = True
            notes.append("netns: yes")
        except OSError as exc:
            notes.append(f"netns: no ({_why(exc)})")
            return Capabilities(True, False, False, False, "; ".join(notes))
        with IPRoute(netns=name, flags=0) as ipr:
            try:
                ipr.link("add", ifname=veth_name(prefix, 0, 1), kind="veth", peer=veth_name(prefix, 1, 0))
                index = ipr.link_lookup(ifname=veth_name(prefix, 0, 1))[0]
                has_veth = True
                notes.append("veth: yes")
            except (NetlinkError, OSError, IndexError) as exc:
                notes.append(f"veth: no ({_why(exc)})")
                return Capabilities(True, True, False, False, "; ".join(notes))
            try:
                ipr.tc("add", "netem", index, handle=ROOT_HANDLE, delay=1000)
                has_netem = True
                notes.append("sch_netem: yes")
            except NetlinkError as exc:
                hint = "sch_netem not available in this kernel" if exc.code == errno.ENOENT else "netem refused"
                notes.append(f"sch_netem: no ({hint}: {_why(exc)})")
    except Exception as exc:  # the probe reports; it must not raise
        notes.append(f"probe failed: {_why(exc)}")
    finally:
        if created:
            try:
                netns.remove(name)
            except OSError as exc:
                notes.append(f"could not remove probe namespace {name}: {_why(exc)}")
    return Capabilities(True, has_netns, has_veth, has_netem, "; ".join(notes))


if __name__ == "__main__":
    print(probe())
