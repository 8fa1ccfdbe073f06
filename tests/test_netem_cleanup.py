"""Every exit path of a netem run leaves nothing behind: a normal end, a killed launcher (+ clean), a crashed agent.

Each case drives the real command line (`python -m testbed run SCENARIO --shaper netem --no-dashboard
--metrics-port 0`) as a subprocess and looks at the kernel with iproute2 (`ip netns list`, `ip -o
link`) and at the process table (`pgrep -f` on a token that only this test's stage names carry: an
agent's process title holds its own stage name: "geo-ring agent 1 NAME (run ID)"). The run's prefix is learnt by
watching /run/netns for new testbed namespaces while the run starts (then confirmed with `ip netns
list`); the agents' fork server is their parent (agents.forkserver), seen mid-run; "mid-run" means the exporter (--metrics-port 0, address read from the output) counts decode laps.

Needs root and a kernel with sch_netem; skipped otherwise (with the probe's reason). On a kernel
without netem, run it inside user-mode-linux:

    python -m netem.uml --timeout 900 -- .venv/bin/python -m pytest -m netem tests/test_netem_cleanup.py -v

Inside UML each run takes ~50-100 s (the launcher and then every agent import torch from hostfs, on one
vCPU); the file took 170-290 s there, depending on how busy the shared host was.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from netem.plan import is_testbed_name
from tests.procutil import cmdline, parent_of, running

pytestmark = [pytest.mark.netem, pytest.mark.usefixtures("netem_capable")]

REPO = Path(__file__).resolve().parent.parent
N_STAGES = 2  # each agent imports torch in ~20 s on UML's one vCPU: two stages show every exit path as well as three
HOPS_MS = [40.0, 40.0]  # ~100 ms laps: a 200-token run lasts ~20 s, time enough to kill it mid-run
STARTUP_TIMEOUT_S = 240.0  # launcher + agents import torch (slow on UML's hostfs), then the first lap
RUN_TIMEOUT_S = 300.0
AGENT_EXIT_TIMEOUT_S = 60.0  # orphaned agents notice the dead launcher by EOF on stdin
POLL_S = 0.5  # UML has one vCPU for the test, the launcher and the agents: poll gently
METRICS_URL = re.compile(r"(http://127\.0\.0\.1:\d+/metrics)")
LAPS = re.compile(r'^testbed_laps_total\{kind="plain"\} ([0-9.e+]+)$', re.M)



# ------------------------------------------------------------------------------------------------
# what the kernel and the process table show

def inside_uml() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "User Mode Linux" in f.read()
    except OSError:
        return False


def namespaces(prefix: str = "gr") -> list[str]:
    """Testbed namespaces starting with `prefix`, as `ip netns list` shows them."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    names = (line.split()[0] for line in out.splitlines() if line.strip())
    return sorted(n for n in names if is_testbed_name(n, prefix))


def namespaces_cheaply(prefix: str = "gr") -> list[str]:
    """The same from /run/netns without a subprocess: for polling (inside UML every fork costs the run CPU)."""
    from pyroute2 import netns

    return sorted(n for n in netns.listnetns() if is_testbed_name(n, prefix))


def root_links(prefix: str) -> list[str]:
    """Links of the root namespace whose name starts with `prefix`, as `ip -o link` shows them."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    names = (line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line)
    return [n for n in names if n.startswith(prefix)]


def pids(token: str) -> list[int]:
    """Live processes whose command line contains `token` (pgrep never lists itself)."""
    out = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_for(what: str, condition, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the launcher exited ({proc.returncode}) while waiting for {what}:\n{tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:g} s:\n{tail(log)}")
        time.sleep(POLL_S)


def tail(log: Path | None, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log is not None and log.exists() else ""


# ------------------------------------------------------------------------------------------------
# one run of the command line

class Run:
    """`python -m testbed run` on a 2-stage ring whose stage names carry a unique token."""

    def __init__(self, tmp_path: Path, tokens: int) -> None:
        self.token = f"cl{secrets.token_hex(4)}x"  # stage i is named <token><i>
        self.before = set(namespaces())
        scenario = tmp_path / "scenario.toml"  # the launcher's own command line must not carry the token
        stages = "".join(f'[[stages]]\nname = "{self.token}{i}"\ncompute_ms = 10.0\n\n' for i in range(N_STAGES))
        scenario.write_text(f'name = "cleanup"\n\n{stages}[network]\nhops_ms = {HOPS_MS}\n\n'
                            f'[decode]\ntokens = {tokens}\n')
        self.json = tmp_path / "summary.json"
        self.log = tmp_path / "launcher.log"
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "testbed", "run", str(scenario), "--shaper", "netem", "--no-dashboard",
                 "--metrics-port", "0", "--json", str(self.json), "--dilation", "1"],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(os.environ, COLUMNS="200"))
        self.prefix = ""
        self.server = 0  # the fork server's pid, once seen

    def agent_pids(self, stage: int | None = None) -> list[int]:
        return pids(self.token if stage is None else f"{self.token}{stage}")

    def wait_for_namespaces(self) -> list[str]:
        """Wait until this run's namespaces exist; learns the run prefix."""
        def ours() -> list[str]:
            new = [n for n in namespaces_cheaply() if n not in self.before]
            return new if len(new) == N_STAGES else []

        names = wait_for("namespaces of the run", ours, STARTUP_TIMEOUT_S, self.proc, self.log)
        self.prefix = names[0].split("-")[0]
        assert names == [f"{self.prefix}-s{i}" for i in range(N_STAGES)]
        assert namespaces(self.prefix) == names  # what `ip netns list` shows
        print(f"\nnamespaces {names} after {time.monotonic() - self.started:.1f} s")
        return names

    def wait_for_laps(self) -> None:
        """Wait until every agent runs and the ring has completed decode laps (read from the metrics)."""
        url = wait_for("metrics address", lambda: METRICS_URL.search(tail(self.log, 100_000)),
                       STARTUP_TIMEOUT_S, self.proc, self.log).group(1)

        def laps() -> float:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    match = LAPS.search(response.read().decode())
            except OSError:
                return 0.0
            return float(match.group(1)) if match else 0.0

        wait_for("decode laps", lambda: laps() >= 2, STARTUP_TIMEOUT_S, self.proc, self.log)
        agents = self.agent_pids()
        assert len(agents) == N_STAGES, agents
        servers = {parent_of(pid) for pid in agents}
        assert len(servers) == 1, servers  # one fork server forked them all
        self.server = servers.pop()
        assert cmdline(self.server).startswith("geo-ring fork server (run "), cmdline(self.server)
        print(f"decode laps running after {time.monotonic() - self.started:.1f} s")

    def wait(self) -> int:
        try:
            return self.proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the launcher did not exit within {RUN_TIMEOUT_S:g} s:\n{tail(self.log)}")

    def assert_nothing_left(self) -> None:
        assert self.prefix, "the run prefix was never seen"
        assert namespaces(self.prefix) == [], tail(self.log)
        assert root_links(self.prefix) == []
        assert self.agent_pids() == [], "agent processes outlived the run"
        assert not self.server or not running(self.server), "the fork server outlived the run"

    def kill_everything(self) -> None:
        """Test failure path: leave the box as we found it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.agent_pids() + ([self.server] if self.server and running(self.server) else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.prefix and namespaces_cheaply(self.prefix):
            from netem.clean import clean

            clean(self.prefix)


@pytest.fixture
def new_run(tmp_path):
    runs: list[Run] = []

    def start(tokens: int) -> Run:
        run = Run(tmp_path, tokens)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill_everything()


# ------------------------------------------------------------------------------------------------
# the exit paths

def test_normal_run_leaves_nothing(new_run):
    run = new_run(tokens=24)
    run.wait_for_namespaces()
    status = run.wait()
    print(f"exit {status} after {time.monotonic() - run.started:.1f} s")
    assert status == 0, tail(run.log)
    summary = json.loads(run.json.read_text())
    assert summary["shaper"] == "netem" and summary["tokens"] == 23
    run.assert_nothing_left()


def test_killed_launcher_leaves_namespaces_that_clean_removes(new_run):
    run = new_run(tokens=200)
    names = run.wait_for_namespaces()
    run.wait_for_laps()
    run.proc.send_signal(signal.SIGKILL)
    assert run.proc.wait(30) == -signal.SIGKILL
    # nobody tore anything down: the namespaces (and their veths) are still there
    assert namespaces(run.prefix) == names
    # the orphaned agents see EOF on stdin and exit by themselves
    wait_for("exit of the orphaned agents", lambda: not run.agent_pids(), AGENT_EXIT_TIMEOUT_S)
    wait_for("exit of the fork server", lambda: not running(run.server), AGENT_EXIT_TIMEOUT_S)
    others = [n for n in namespaces() if not n.startswith(run.prefix)]
    command = [sys.executable, "-m", "testbed", "clean"]
    if others and not inside_uml():  # someone else's run on this box: remove only ours
        command += ["--prefix", run.prefix]
    cleaned = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, COLUMNS="1000"))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    for name in names:
        assert f"netns {name}" in cleaned.stdout, cleaned.stdout
    assert namespaces(run.prefix) == []
    if inside_uml() or not others:
        assert namespaces() == [], "`testbed clean` left testbed namespaces"
    run.assert_nothing_left()


def test_crashed_agent_fails_the_run_and_leaves_nothing(new_run):
    run = new_run(tokens=200)
    run.wait_for_namespaces()
    run.wait_for_laps()
    victim = run.agent_pids(stage=1)
    assert len(victim) == 1, victim
    os.kill(victim[0], signal.SIGKILL)
    status = run.wait()
    output = tail(run.log)
    assert status == 1, output
    assert f"{run.token}1" in output and "signal 9" in output, output  # names the agent and the cause
    run.assert_nothing_left()
