"""Removes leftovers of the kernel netem backend: namespaces and links named with the testbed prefix, nothing else.

    python -m netem.clean [PREFIX]        # what `python -m testbed clean` runs; PREFIX defaults to "gr"

A name is ours only when it starts with PREFIX *and* has the exact shape `netem.plan` generates
(`gr` + 5 hex digits + `-s<stage>` or `-<here>-<there>`), so `gre0`, `grafana-x` or a user's
`gr-test` namespace are never touched. Links are looked for in the root namespace (a crash can only
leave a veth there if an older version created it there) and inside each namespace we remove (we
delete them first, because a process still running inside keeps an unmounted namespace alive with
its veths). Processes are left alone.
"""

from __future__ import annotations

import errno
import sys

from netem.plan import PREFIX_ROOT, is_testbed_name
from testbed.core.errors import ShapingError


def _link_names(ipr) -> list[tuple[int, str]]:
    return [(msg["index"], msg.get_attr("IFLA_IFNAME")) for msg in ipr.get_links()]


def _delete_links(ipr, prefix: str, where: str, removed: list[str], errors: list[str]) -> None:
    for index, ifname in _link_names(ipr):
        if not ifname or not is_testbed_name(ifname, prefix):
            continue
        try:
            ipr.link("del", index=index)
            removed.append(f"link {ifname}" + (f" (in {where})" if where else ""))
        except Exception as exc:
            # deleting one veth end takes its peer with it: ENODEV for the second end is fine
            if getattr(exc, "code", None) != errno.ENODEV:
                errors.append(f"link {ifname}: {exc}")


def clean(prefix: str = PREFIX_ROOT) -> list[str]:
    """Remove every namespace and link whose name is a testbed name starting with `prefix`.

    Returns what was removed, e.g. ["netns gr1a2b3-s0", "link gr1a2b3-0-1 (in gr1a2b3-s0)"].
    Raises ShapingError when something matching could not be removed (after trying all of it).
    """
    if not prefix.startswith(PREFIX_ROOT):
        raise ShapingError(f"clean prefix must start with {PREFIX_ROOT!r}, got {prefix!r}")
    try:
        from pyroute2 import IPRoute, netns
    except ImportError as exc:
        raise ShapingError(f"pyroute2 is needed to clean up netem leftovers: {exc}") from exc
    removed: list[str] = []
    errors: list[str] = []
    try:
        namespaces = [n for n in netns.listnetns() if is_testbed_name(n, prefix)]
    except OSError as exc:
        raise ShapingError(f"listing network namespaces: {exc}") from exc
    for name in sorted(namespaces):
        try:
            with IPRoute(netns=name, flags=0) as ipr:
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
    try:
        with IPRoute() as ipr:
            _delete_links(ipr, prefix, "", removed, errors)
    except Exception as exc:
        errors.append(f"root namespace links: {exc}")
    if errors:
        raise ShapingError(f"clean removed {len(removed)} objects but failed on: " + "; ".join(errors))
    return removed


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prefix = args[0] if args else PREFIX_ROOT
    try:
        removed = clean(prefix)
    except ShapingError as exc:
        print(f"clean: {exc}", file=sys.stderr)
        return 1
    for item in removed:
        print(f"removed {item}")
    if not removed:
        print(f"nothing to clean (no namespaces or links named {prefix}*)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
