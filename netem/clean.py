"""Removes leftovers of the kernel netem backend: testbed-named namespaces and links, and egress roots 6772:.

    python -m netem.clean [PREFIX]        # what `python -m testbed clean` runs; PREFIX defaults to "gr"

A name is ours only when it starts with PREFIX *and* has the exact shape `netem.plan` generates
(`gr` + 5 hex digits + `-s<stage>` or `-<here>-<there>`), so `gre0`, `grafana-x` or a user's
`gr-test` namespace are never touched. Links are looked for in the root namespace (a crash can only
leave a veth there if an older version created it there) and inside each namespace we remove (we
delete them first, because a process still running inside keeps an unmounted namespace alive with
its veths). Processes are left alone.

On a real host, `netem.egress` shapes an interface under a root qdisc with the fixed handle 6772:
("gr"); `clean_egress` deletes such a root on any interface of the current network namespace (run
`testbed clean` on each host, or `ip netns exec NS ...` per namespace) and never touches a root
qdisc with any other handle.
"""

from __future__ import annotations

import sys

from netem.plan import PREFIX_ROOT
from testbed.core.errors import ShapingError


def clean_egress(iface: str | None = None) -> list[str]:
    """Delete the egress shaper's root qdisc (handle 6772:) from `iface`, or from every interface when None.

    Only the current network namespace is looked at. Returns e.g. ["egress qdisc 6772: on eth0"];
    raises ShapingError naming the interface when `iface` does not exist or a deletion fails.
    """
    try:
        from netem.egress import remove_leftovers
    except ImportError as exc:
        raise ShapingError(f"pyroute2 is needed to clean up egress leftovers: {exc}") from exc
    return remove_leftovers(iface)


def clean(prefix: str = PREFIX_ROOT) -> list[str]:
    """Remove every namespace and link whose name is a testbed name starting with `prefix`, and egress roots.

    Returns what was removed, e.g. ["egress qdisc 6772: on eth0", "link gr1a2b3-0-1 (in gr1a2b3-s0)",
    "netns gr1a2b3-s0"]. Raises ShapingError when something matching could not be removed (after
    trying all of it). The namespace work is `netem.nsutil.teardown`, the same one every
    KernelShaper's aclose runs; the egress one is `clean_egress`.
    """
    if not prefix.startswith(PREFIX_ROOT):
        raise ShapingError(f"clean prefix must start with {PREFIX_ROOT!r}, got {prefix!r}")
    try:
        from netem.nsutil import teardown
    except ImportError as exc:
        raise ShapingError(f"pyroute2 is needed to clean up netem leftovers: {exc}") from exc
    egress_error = None
    try:
        removed = clean_egress()
    except ShapingError as exc:  # still remove the namespaces, then say what failed
        removed, egress_error = [], exc
    removed += teardown(prefix)
    if egress_error is not None:
        raise egress_error
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
        print(f"nothing to clean (no namespaces or links named {prefix}*, no egress root 6772:)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
