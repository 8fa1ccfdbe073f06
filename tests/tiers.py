"""The exact and fidelity tiers at once: the exact tier runs at SCHED_IDLE, on the CPU the real-time tier leaves idle.

    python -m tests.tiers [--exact-args ARGS] [PYTEST_ARGS...]      (`make test` runs it)

The fidelity tier keeps one core busy on average (measured: 281 s of CPU in a 295 s run on 2 cores), and its
budgets are measured inside each run; the exact tier runs on simulated time, so how much CPU it gets changes how
long it takes, never what it measures. SCHED_IDLE gives it a core only while no other task wants it, and a
fidelity process that wakes takes the core at once. The exact tier's output is held in a file and printed after
the fidelity tier's; the status is the first failing one (fidelity's first). Both may cache the bytecode they
compile (netem.suite.suite_environment: where PYTHONDONTWRITEBYTECODE is set, every process that imports torch
compiles it from source again).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile

from netem.suite import suite_environment


def idle_priority() -> None:
    """In the child before exec: SCHED_IDLE (nice 19 where the kernel refuses it), and Ctrl-C at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a tier started from a script's background inherits it ignored
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        os.nice(19)


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pytest_command(marker: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", marker, *args]


def run_tiers(exact: list[str], fidelity: list[str]) -> int:
    """Runs `exact` at idle priority beside `fidelity`; prints exact's output after fidelity's; the first failure.

    Ctrl-C from the terminal reaches both children (one process group), which stop and clean up as on their own;
    this process ignores it meanwhile, so that it waits for them and prints what the exact tier said.
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    env = suite_environment()
    try:
        with tempfile.TemporaryFile() as held:
            background = subprocess.Popen(exact, stdin=subprocess.DEVNULL, stdout=held, stderr=subprocess.STDOUT,
                                          preexec_fn=idle_priority, env=env)
            fidelity_status = subprocess.Popen(fidelity, preexec_fn=default_sigint, env=env).wait()
            exact_status = background.wait()
            held.seek(0)
            print(f"\n---- exact tier, run beside the fidelity tier at idle priority (exit {exact_status}) ----",
                  flush=True)
            sys.stdout.buffer.write(held.read())
            sys.stdout.flush()
    finally:
        signal.signal(signal.SIGINT, previous)
    return next((status for status in (fidelity_status, exact_status) if status != 0), 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tiers", description=__doc__.splitlines()[0])
    parser.add_argument("--exact-args", default="", help="pytest arguments for the exact tier only (EXACT_ARGS)")
    args, pytest_args = parser.parse_known_args(argv)
    exact = pytest_command("exact", *shlex.split(args.exact_args), *pytest_args)
    return run_tiers(exact, pytest_command("fidelity", *pytest_args))


if __name__ == "__main__":
    sys.exit(main())
