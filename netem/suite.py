"""Runs the kernel netem test suite where it can run: natively, else inside user-mode-linux, else says why not.

    python -m netem.suite [PYTEST_ARGS...]

Native when we are root and the kernel has sch_netem; otherwise inside user-mode-linux (which has
sch_netem as a module) when it is installed; otherwise it prints a loud banner that the netem suite
was skipped and why, and exits 0 (the rest of the suite still ran). Set GEO_RING_REQUIRE_NETEM=1
(CI does) to make a skip an error instead.
"""

from __future__ import annotations

import os
import subprocess
import sys

SUITE_TIMEOUT_S = 2700  # inside user-mode-linux the suite took 16.5 min on a slow 2-core VM (6.5 min on a fast one)
REQUIRE_ENV = "GEO_RING_REQUIRE_NETEM"


def banner(message: str) -> None:
    line = "!" * 78
    print(f"\n{line}\n!! {message}\n{line}\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    from netem.probe import probe
    from netem.uml import uml_available

    extra = list(sys.argv[1:] if argv is None else argv)
    pytest_cmd = [sys.executable, "-m", "pytest", "-m", "netem", "-p", "no:cacheprovider", *extra]
    caps = probe()
    if caps.has_cap_net_admin and caps.has_netem and caps.has_veth and caps.has_netns:
        print("netem suite: running natively (root, sch_netem present)", flush=True)
        return subprocess.call(pytest_cmd)
    ok, reason = uml_available()
    if ok:
        print(f"netem suite: this kernel cannot run it ({caps.detail}); running inside user-mode-linux", flush=True)
        return subprocess.call([sys.executable, "-m", "netem.uml", "--timeout", str(SUITE_TIMEOUT_S), "--",
                                *pytest_cmd])
    banner(f"netem suite SKIPPED: kernel lacks it ({caps.detail}) and user-mode-linux is unavailable ({reason}). "
           "Install what it needs (as root): make system-deps")
    return 1 if os.environ.get(REQUIRE_ENV) == "1" else 0


if __name__ == "__main__":
    sys.exit(main())
