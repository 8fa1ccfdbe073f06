"""Runs the kernel netem test suite where it can run: natively, else inside user-mode-linux, else says why not.

    python -m netem.suite [PYTEST_ARGS...]

Native when we are root and the kernel has sch_netem; otherwise inside user-mode-linux (which has
sch_netem as a module) when it is installed; otherwise it prints a loud banner that the netem suite
was skipped and why, and exits 0 (the rest of the suite still ran). Set GEO_RING_REQUIRE_NETEM=1
(CI does) to make a skip an error instead.

A user-mode-linux guest has one vCPU, and most of the suite's time there is agents importing torch (~20 s each:
every page fault is a trip through the host). So the whole suite runs as two guests side by side, one per core:
UML_FIRST_GROUP in one, every other netem test file in the other (found by its `pytest.mark.netem`, so a new test
file lands there by itself, and the guest imports only those: collecting the whole suite took 16.6 s there, its 15
tests 2.0 s); each guest's output is printed whole when both are done. Naming test paths runs them in one guest.

The suite's processes may cache the bytecode they compile (`suite_environment`): where the caller sets
PYTHONDONTWRITEBYTECODE, every process that imports torch compiles its modules from source again.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

SUITE_TIMEOUT_S = 2700  # a guest: the whole suite in one took 16.5-19.6 min on a slow 2-core VM; two take ~5 min each
REQUIRE_ENV = "GEO_RING_REQUIRE_NETEM"
# About half the suite's time inside UML. Side by side, with the bytecode cached (suite_environment), on the shared
# box: nodes 96-118 s, the geometry's warm and cold runs 51-62 s, schedule 23-27 s, egress ~12 s (213 s in all);
# the other guest's ring fixtures ~66 s, cleanup ~69 s, kernel ~35 s, faults ~29 s (204 s). Kernel here and egress
# there had this guest at 246 s; both there, that one at 247 s.
UML_FIRST_GROUP = ("tests/test_netem_nodes.py", "tests/test_netem_egress.py", "tests/test_netem_schedule.py",
                   "tests/test_netem_geometry.py")


def suite_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the suite's processes run in: the caller's, with bytecode caching on.

    With PYTHONDONTWRITEBYTECODE set (the shell CI runs in sets it: a fresh clone's `make test` left torch without
    one .pyc), every process that imports torch compiles its modules from source again: `import torch` took 15.7 s
    against 7.1 s from the cache on a busy 2-core box, in every fork server, torchrun, node and fresh agent. The
    variable keeps __pycache__ out of the source tree, and so does this: the cache goes under the venv
    (PYTHONPYCACHEPREFIX), which pip's --no-compile left without one (Makefile).
    """
    env = dict(os.environ if environ is None else environ)
    if env.get("PYTHONDONTWRITEBYTECODE"):  # any non-empty value turns caching off
        del env["PYTHONDONTWRITEBYTECODE"]
        env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(sys.prefix, "pycache"))
    return env


def banner(message: str) -> None:
    line = "!" * 78
    print(f"\n{line}\n!! {message}\n{line}\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    from netem.probe import probe
    from netem.uml import uml_available

    extra = list(sys.argv[1:] if argv is None else argv)
    pytest_cmd = [sys.executable, "-m", "pytest", "-m", "netem", "-p", "no:cacheprovider", "--durations=6", *extra]
    caps = probe()
    env = suite_environment()
    if caps.has_cap_net_admin and caps.has_netem and caps.has_veth and caps.has_netns:
        print("netem suite: running natively (root, sch_netem present)", flush=True)
        return subprocess.call(pytest_cmd, env=env)
    ok, reason = uml_available()
    if ok:
        print(f"netem suite: {caps.plain()}; running it inside user-mode-linux", flush=True)
        uml = [sys.executable, "-m", "netem.uml", "--timeout", str(SUITE_TIMEOUT_S), "--"]
        named = any(os.path.exists(arg.split("::")[0]) for arg in extra)  # the caller named what to run
        if named or not any(os.path.exists(path) for path in UML_FIRST_GROUP):  # or runs it from elsewhere
            return subprocess.call([*uml, *pytest_cmd], env=env)
        return run_side_by_side(uml, pytest_cmd, env)
    banner(f"netem suite SKIPPED: kernel lacks it ({caps.detail}) and user-mode-linux is unavailable ({reason}). "
           "Install what it needs (as root): make system-deps")
    return 1 if os.environ.get(REQUIRE_ENV) == "1" else 0


def netem_test_files(folder: str = "tests") -> list[str]:
    """The test files that hold netem tests: those that mark them (`pytest.mark.netem`), read as text."""
    return sorted(f"{folder}/{name}" for name in os.listdir(folder)
                  if name.startswith("test_") and name.endswith(".py")
                  and "mark.netem" in open(os.path.join(folder, name), encoding="utf-8").read())


def run_side_by_side(uml: list[str], pytest_cmd: list[str], env: dict[str, str] | None = None) -> int:
    """The suite in two user-mode-linux guests at once (see the module docstring); the first failing status."""
    first = [path for path in UML_FIRST_GROUP if os.path.exists(path)]
    groups = [first, [path for path in netem_test_files() if path not in first]]
    workdir = tempfile.mkdtemp(prefix="geo-ring-netem-suite-")
    procs: list[subprocess.Popen] = []
    outputs = []
    try:
        for i, selection in enumerate(groups):
            outputs.append(open(os.path.join(workdir, f"guest{i}.log"), "w+b"))
            basetemp = os.path.join(workdir, f"tmp{i}")  # each guest's pytest keeps its tmp_path apart
            procs.append(subprocess.Popen([*uml, *pytest_cmd, f"--basetemp={basetemp}", *selection], env=env,
                                          stdin=subprocess.DEVNULL, stdout=outputs[i], stderr=subprocess.STDOUT))
        print(f"netem suite: two guests side by side: [{' '.join(first)}] and the rest", flush=True)
        statuses = [proc.wait() for proc in procs]
        for i, out in enumerate(outputs):
            out.seek(0)
            print(f"\n---- netem suite, guest {i + 1} of 2 (exit {statuses[i]}) ----", flush=True)
            sys.stdout.buffer.write(out.read())
            sys.stdout.flush()
        return next((status for status in statuses if status != 0), 0)
    finally:
        for proc in procs:
            if proc.poll() is None:  # interrupted: netem.uml kills its guest on SIGINT (KeyboardInterrupt)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for out in outputs:
            out.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
