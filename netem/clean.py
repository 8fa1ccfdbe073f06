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

import sys

from netem.plan import PREFIX_ROOT
from testbed.core.errors import ShapingError


def clean(prefix: str = PREFIX_ROOT) -> list[str]:
    """Remove every namespace and link whose name is a testbed name starting with `prefix`.

    Returns what was removed, e.g. ["link gr1a2b3-0-1 (in gr1a2b3-s0)", "netns gr1a2b3-s0"].
    Raises ShapingError when something matching could not be removed (after trying all of it).
    The work is `netem.nsutil.teardown`, the same one every KernelShaper's aclose runs.
    """
    if not prefix.startswith(PREFIX_ROOT):
        raise ShapingError(f"clean prefix must start with {PREFIX_ROOT!r}, got {prefix!r}")
    try:
        from netem.nsutil import teardown
    except ImportError as exc:
        raise ShapingError(f"pyroute2 is needed to clean up netem leftovers: {exc}") from exc
    return teardown(prefix)


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
