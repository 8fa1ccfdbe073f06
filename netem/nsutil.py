"""Namespaces, veths, sysctls and offloads for the kernel backend, and the one teardown of testbed-named objects.

Offloads: GSO, TSO and GRO are turned off on every veth end with pyroute2's IoctlEthtool (the legacy
ETHTOOL_S{GSO,TSO,GRO} ioctls, from a thread that has entered the namespace: the ioctl's socket
must be made inside it), so netem's rate and limit see wire-sized packets, not 64 KB super-packets.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any, Callable, Iterable

from pyroute2.netlink.rtnl import rt_proto, rt_scope

from netem.netlink import ipr_in, link_index, translate
from netem.plan import INITIAL_WINDOW_SEGMENTS, VethPlan, is_testbed_name
from testbed.core.errors import ShapingError
from testbed.core.process import enter_netns

# ethtool's short names -> the long names pyroute2's IoctlEthtool knows them by
OFFLOAD_NAMES = {"tso": "tcp-segmentation-offload", "gso": "generic-segmentation-offload",
                 "gro": "generic-receive-offload"}
OFFLOADS_OFF = tuple(OFFLOAD_NAMES)
PAIR_ROUTE_SCOPE = rt_scope["link"]  # what the kernel gives a connected route
PAIR_ROUTE_PROTOCOL = rt_proto["kernel"]

# ----------------------------------------------------------------------------------------------------
# running a few syscalls inside a namespace (sysctl files, ethtool ioctls)

def in_namespace(namespace: str, fn: Callable[[], Any]) -> Any:
    """Run fn() in a short-lived thread that has entered `namespace` (setns affects only that thread)."""
    from pyroute2 import netns

    path = os.path.join(netns.NETNS_RUN_DIR, namespace)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            enter_netns(path)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{namespace}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _get_offloads(ifname: str) -> dict[str, int]:
    from pyroute2.ethtool.ioctl import IoctlEthtool

    ethtool = IoctlEthtool(ifname)
    try:
        flags = ethtool.get_offload_flags()
    finally:
        ethtool.close()
    return {short: int(flags[long]) for short, long in OFFLOAD_NAMES.items()}


def set_offloads(ifnames: list[str], enabled: bool) -> dict[str, dict[str, int]]:
    """Switch TSO/GSO/GRO on `ifnames` (call inside their namespace); returns each one's read-back."""
    from pyroute2.ethtool.ioctl import IoctlEthtool

    out = {}
    for ifname in ifnames:
        ethtool = IoctlEthtool(ifname)
        try:
            for long in OFFLOAD_NAMES.values():
                ethtool.set_offload_flag(long, int(enabled))
        finally:
            ethtool.close()
        out[ifname] = _get_offloads(ifname)
    return out


def _sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/").lstrip("/")


def write_sysctls(sysctls: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Write each (key, value) (call inside the namespace); returns what the kernel then reports."""
    out = {}
    for key, value in sysctls:
        with open(_sysctl_path(key), "w") as f:
            f.write(value)
        with open(_sysctl_path(key)) as f:
            out[key] = f.read().strip()
    return out


def read_sysctl(namespace: str, key: str) -> str:
    """A sysctl as seen inside `namespace` (key like "net/ipv4/tcp_slow_start_after_idle")."""

    def read() -> str:
        with open(_sysctl_path(key)) as f:
            return f.read().strip()

    return in_namespace(namespace, read)


def read_offloads(namespace: str, ifname: str) -> dict[str, int]:
    """{"tso": 0/1, "gso": 0/1, "gro": 0/1} of one interface, from the kernel."""
    return in_namespace(namespace, lambda: _get_offloads(ifname))


# ----------------------------------------------------------------------------------------------------
# creating namespaces and veths

class NamespaceSockets:
    """One pyroute2 IPRoute per namespace while applying (each one costs a helper process to open)."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def __call__(self, namespace: str):
        if namespace not in self._open:
            self._open[namespace] = ipr_in(namespace)
        return self._open[namespace]

    def close(self) -> None:
        while self._open:
            _, ipr = self._open.popitem()
            try:
                ipr.close()
            except Exception:
                pass


def create_namespace(name: str, created: list[str], sockets: NamespaceSockets) -> None:
    """Create namespace `name` with lo up; appended to `created` as soon as it exists."""
    from pyroute2 import netns

    if name in netns.listnetns():
        raise ShapingError(f"network namespace {name} already exists (a leftover of an earlier run with "
                           f"the same id? `python -m testbed clean` removes testbed leftovers)")
    try:
        netns.create(name)
    except Exception as exc:
        raise translate(f"creating network namespace {name}", exc) from exc
    created.append(name)
    try:
        ipr = sockets(name)
        ipr.link("set", index=link_index(ipr, "lo", name), state="up")
    except ShapingError:
        raise
    except Exception as exc:
        raise translate(f"bringing lo up in {name}", exc) from exc


def _configure_end(ipr, namespace: str, ifname: str, address: str, prefixlen: int, subnet: str,
                   initial_window: int | None = INITIAL_WINDOW_SEGMENTS) -> None:
    index = link_index(ipr, ifname, namespace)
    ipr.addr("add", index=index, address=address, prefixlen=prefixlen)
    ipr.link("set", index=index, state="up")
    if initial_window is None:  # transport "kernel": the connected route as the kernel made it
        return
    network, _, length = subnet.partition("/")
    # the connected route again, with a large initial window: a 50 KB frame leaves in one flight
    ipr.route("replace", dst=network, dst_len=int(length), oif=index, prefsrc=address,
              scope=PAIR_ROUTE_SCOPE, proto=PAIR_ROUTE_PROTOCOL,
              metrics={"initcwnd": initial_window, "initrwnd": initial_window})


def create_veth(v: VethPlan, sockets: NamespaceSockets) -> None:
    """The veth pair of `v`, each end in its namespace, addressed, up, with its pair route."""
    try:
        ipr_a = sockets(v.namespace_a)
        ipr_a.link("add", ifname=v.ifname_a, kind="veth", peer={"ifname": v.ifname_b, "net_ns_fd": v.namespace_b})
        _configure_end(ipr_a, v.namespace_a, v.ifname_a, v.address_a, v.prefixlen, v.subnet, v.initial_window)
        _configure_end(sockets(v.namespace_b), v.namespace_b, v.ifname_b, v.address_b, v.prefixlen, v.subnet,
                       v.initial_window)
    except ShapingError:
        raise
    except Exception as exc:
        hint = " (is the veth module available?)" if getattr(exc, "code", None) == errno.EOPNOTSUPP else ""
        raise translate(f"creating veth pair {v.ifname_a} <-> {v.ifname_b}{hint}", exc) from exc


# ----------------------------------------------------------------------------------------------------
# the one teardown (KernelShaper.aclose and netem.clean)

def _delete_links(ipr, prefix: str, where: str, removed: list[str], errors: list[str]) -> None:
    for msg in ipr.get_links():
        ifname = msg.get_attr("IFLA_IFNAME")
        if not ifname or not is_testbed_name(ifname, prefix):
            continue
        try:
            ipr.link("del", index=msg["index"])
            removed.append(f"link {ifname}" + (f" (in {where})" if where else ""))
        except Exception as exc:
            # deleting one veth end takes its peer with it: ENODEV for the second end is fine
            if getattr(exc, "code", None) != errno.ENODEV:
                errors.append(f"link {ifname}" + (f" in {where}" if where else "") + f": {exc}")


def teardown(prefix: str, only: Iterable[str] | None = None) -> list[str]:
    """Remove testbed-named namespaces and links starting with `prefix`; nothing else is ever touched.

    only=None (netem.clean): every such namespace, and such links in the root namespace too (where
    an older version could leave a veth). only=names (a shaper's own aclose): just those namespaces,
    so one that existed before the run (not ours) survives. Links inside each namespace go first: a
    process still running inside keeps an unmounted namespace alive with its veths.
    Returns e.g. ["link gr1a2b3-0-1 (in gr1a2b3-s0)", "netns gr1a2b3-s0"]; raises ShapingError naming
    whatever could not be removed (after trying all of it).
    """
    from pyroute2 import IPRoute, netns

    wanted = None if only is None else set(only)
    removed: list[str] = []
    errors: list[str] = []
    try:
        present = netns.listnetns()
    except OSError as exc:
        raise ShapingError(f"listing network namespaces: {exc}") from exc
    for name in sorted(present):
        if not is_testbed_name(name, prefix) or (wanted is not None and name not in wanted):
            continue
        try:
            with ipr_in(name) as ipr:
                _delete_links(ipr, prefix, name, removed, errors)
        except Exception:
            pass  # a half-created namespace may not be enterable; unmounting it below removes it anyway
        try:
            netns.remove(name)
            removed.append(f"netns {name}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            errors.append(f"netns {name}: {exc}")
    if wanted is None:
        try:
            with IPRoute() as ipr:
                _delete_links(ipr, prefix, "", removed, errors)
        except Exception as exc:
            errors.append(f"root namespace links: {exc}")
    if errors:
        raise ShapingError(f"teardown removed {len(removed)} objects but failed on: " + "; ".join(errors))
    return removed
