"""Network namespaces as hosts (tests/test_nodes.py, tests/test_netem_nodes.py): one torchrun per namespace.

The test's own namespaces: gt<hex>-h0..h<N-1>, each with eth0 (10.<net>.<i>.2/24) to a router namespace
gt<hex>-rt that forwards between them (no bridge: user-mode-linux has no bridge module loaded). h0 says
is_host=1 and every node its --local-addr: torchrun guesses both from the machine's host name, which every
namespace shares and which resolves to none of their addresses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
N = 3
RUN_TIMEOUT_S = 240


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class Hosts:
    """N namespaces routed through one router namespace: host i is 10.<net>.<i>.2."""

    def __init__(self, n: int = N) -> None:
        tag = uuid.uuid4().hex[:5]
        self.n = n
        self.net = int(tag[:2], 16) % 100 + 100
        self.router = f"gt{tag}-rt"
        self.names = [f"gt{tag}-h{i}" for i in range(n)]
        self.port = 29000 + int(tag[2:], 16) % 900
        try:
            sh("ip", "netns", "add", self.router)
            sh("ip", "netns", "exec", self.router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
            for i, ns in enumerate(self.names):
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"r{i}", "netns",
                   self.router)
                sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "-n", ns, "route", "add", "default", "via", f"10.{self.net}.{i}.1")
                sh("ip", "-n", self.router, "addr", "add", f"10.{self.net}.{i}.1/24", "dev", f"r{i}")
                sh("ip", "-n", self.router, "link", "set", f"r{i}", "up")
        except BaseException:
            self.close()
            raise

    def address(self, i: int) -> str:
        return f"10.{self.net}.{i}.2"

    def start(self, i: int, *args: str, log: Path) -> subprocess.Popen:
        argv = ["ip", "netns", "exec", self.names[i], TORCHRUN, f"--nnodes={self.n}", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={self.address(0)}:{self.port}", "--max-restarts=0",
                f"--rdzv-conf=join_timeout=120,is_host={int(i == 0)}", f"--local-addr={self.address(i)}",
                "-m", "testbed.node", *args, "--stage", str(i), "--iface", "eth0", "--no-dashboard"]
        # torchrun keeps its workers' logs in a fresh TMPDIR/torchelastic_* it never removes: the test's tmp_path
        env = {**os.environ, "TMPDIR": str(log.parent)}
        return subprocess.Popen(argv, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    def processes(self, i: int) -> dict[int, str]:
        out = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True).stdout
        found = {}
        for pid in out.split():
            try:
                found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
        return found

    def qdiscs(self, i: int) -> str:
        return subprocess.run(["ip", "netns", "exec", self.names[i], "tc", "qdisc", "show", "dev", "eth0"],
                              capture_output=True, text=True).stdout

    def close(self) -> None:
        for i, ns in enumerate(self.names):
            for pid in self.processes(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in self.names + [self.router]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_all(hosts: Hosts, tmp_path: Path, *args: str) -> tuple[list[int], list[str]]:
    logs = [tmp_path / f"node{i}.log" for i in range(hosts.n)]
    procs = [hosts.start(i, *args, log=logs[i]) for i in range(hosts.n)]
    codes = [proc.wait(timeout=RUN_TIMEOUT_S) for proc in procs]
    return codes, [log.read_text() for log in logs]


def assert_nothing_left(hosts: Hosts) -> None:
    deadline = time.monotonic() + 10
    while any(hosts.processes(i) for i in range(hosts.n)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(hosts.processes(i) for i in range(hosts.n)), [hosts.processes(i) for i in range(hosts.n)]
    for i in range(hosts.n):
        assert "6772:" not in hosts.qdiscs(i), hosts.qdiscs(i)  # no egress qdisc (netem.egress) left


def wait_for_agents(hosts: Hosts, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # a forked agent's title (agents.forkserver), or a fresh one's command line (GEO_RING_FORK_SERVER=0)
        if all(any(cmd.startswith("geo-ring agent ") or "agents.process.agent" in cmd for cmd in hosts.processes(i).values())
               for i in range(hosts.n)):
            return
        time.sleep(0.2)
    raise AssertionError("the agents did not start")


def kill_worker(hosts: Hosts, i: int) -> None:
    """SIGKILL node i's testbed.node process (torchrun's worker), as a crash would."""
    worker = next(pid for pid, cmd in hosts.processes(i).items() if "testbed.node" in cmd and "torchrun" not in cmd)
    os.kill(worker, signal.SIGKILL)
