"""Egress shaping per destination against a real kernel: RTTs through the shaped and unshaped ports, change, close, clean.

Two network namespaces stand for two hosts on a veth pair (A 10.77.0.1, B 10.77.0.2); A shapes its
own egress towards B's port P only. Needs root and a kernel with sch_netem (plus sch_htb and cls_u32,
loaded here when the UML runner did not); on a kernel without netem, run it inside user-mode-linux:

    python -m netem.uml --timeout 500 -- .venv/bin/python -m pytest -m netem tests/test_netem_egress.py -q

RTT of a small TCP echo, on one monotonic clock. Shaped: never below the delay minus netem's timer
slack (DELAY_EARLY_MS); unshaped: the median under UNSHAPED_MAX_MS (inside UML a veth round trip
is a few hundred microseconds).
"""

from __future__ import annotations

import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netem.egress import ROOT_HANDLE, EgressShaper
from netem.nsutil import in_namespace
from netem.plan import is_testbed_name
from testbed.core.errors import ShapingError
from testbed.core.records import LinkSpec
from tests.test_netem_kernel import inside_uml

pytestmark = [pytest.mark.netem, pytest.mark.usefixtures("netem_capable")]

REPO = Path(__file__).resolve().parent.parent
IFACE_A, IFACE_B = "eg-a", "eg-b"
IP_A, IP_B, PREFIXLEN = "10.77.0.1", "10.77.0.2", 30
PORT = 4567  # the shaped data-plane port; PORT + 1 stands for the clock probes (unshaped)
DELAY_EARLY_MS = 0.2
UNSHAPED_MAX_MS = 5.0
IO_TIMEOUT_S = 20.0
EXTRA_MODULES = ("sch_htb", "cls_u32")  # the UML runner loads veth and sch_netem only


@pytest.fixture(scope="module", autouse=True)
def classful_modules():
    """Inside UML nothing loads modules on demand (no /lib/modules/<uml version>): insmod htb and u32."""
    if not inside_uml():
        return
    from netem.uml.runner import module_dir, module_load_order

    with open("/proc/modules") as f:
        loaded = {line.split()[0] for line in f}
    moddir = module_dir()
    assert moddir is not None, "user-mode-linux modules not found"
    for ko in module_load_order(moddir, EXTRA_MODULES):
        if ko.name.split(".")[0].replace("-", "_") not in loaded:
            subprocess.run(["insmod", str(ko)], check=True, timeout=30)


@pytest.fixture
def hosts():
    """(namespace A, namespace B): a veth pair between them, addressed and up; removed afterwards."""
    from pyroute2 import IPRoute, netns

    tag = secrets.token_hex(3)
    names = (f"egress-a-{tag}", f"egress-b-{tag}")  # not testbed names: `clean` must leave them alone
    for name in names:
        netns.create(name)
    try:
        with IPRoute(netns=names[0], flags=0) as ipr:
            ipr.link("add", ifname=IFACE_A, kind="veth", peer={"ifname": IFACE_B, "net_ns_fd": names[1]})
        for name, ifname, address in ((names[0], IFACE_A, IP_A), (names[1], IFACE_B, IP_B)):
            with IPRoute(netns=name, flags=0) as ipr:
                for dev, addr in ((ifname, address), ("lo", None)):
                    index = ipr.link_lookup(ifname=dev)[0]
                    if addr:
                        ipr.addr("add", index=index, address=addr, prefixlen=PREFIXLEN)
                    ipr.link("set", index=index, state="up")
        yield names
    finally:
        for name in names:
            if name in netns.listnetns():
                netns.remove(name)


def tc_show(namespace: str, ifname: str) -> str:
    return subprocess.run(["tc", "-n", namespace, "qdisc", "show", "dev", ifname], capture_output=True,
                          text=True, check=True, timeout=30).stdout


class EchoServer:
    """TCP echo on IP_B:PORT and IP_B:PORT+1 inside namespace B, one thread per port."""

    def __init__(self, namespace: str) -> None:
        self.listeners = []
        for port in (PORT, PORT + 1):
            sock = in_namespace(namespace, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((IP_B, port))
            sock.listen(8)
            self.listeners.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(IO_TIMEOUT_S)
                try:
                    while data := conn.recv(64):
                        conn.sendall(data)
                except OSError:
                    pass

    def close(self) -> None:
        for sock in self.listeners:
            sock.close()


def rtts_ms(namespace: str, port: int, count: int = 15, warmup: int = 2) -> list[float]:
    """Round trips of an 8-byte echo from namespace A to IP_B:port, in ms (after `warmup`)."""
    client = in_namespace(namespace, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    with client:
        client.settimeout(IO_TIMEOUT_S)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.connect((IP_B, port))
        out = []
        for _ in range(warmup + count):
            start = time.monotonic()
            client.sendall(b"12345678")
            got = b""
            while len(got) < 8:
                chunk = client.recv(8 - len(got))
                assert chunk, "echo server closed"
                got += chunk
            out.append((time.monotonic() - start) * 1e3)
    return out[warmup:]


def summary(rtts: list[float]) -> str:
    return f"min {min(rtts):.2f} p50 {statistics.median(rtts):.2f} max {max(rtts):.2f} ms"


def test_only_the_peer_port_is_delayed_live_change_and_close(hosts):
    ns_a, ns_b = hosts
    server = EchoServer(ns_b)
    before = tc_show(ns_a, IFACE_A)
    try:
        with EgressShaper(IFACE_A, "egress-test", namespace=ns_a) as shaper:
            got = shaper.apply([(LinkSpec(0, 1, delay_ms=30.0), IP_B, PORT)])
            assert got["root"]["kind"] == "htb" and got["root"]["handle"] == ROOT_HANDLE
            (leaf,) = got["leaves"].values()
            assert leaf["kind"] == "netem" and leaf["latency_ns"] == 30_000_000
            assert shaper.describe() == [f"{IFACE_A}: {IP_B}:{PORT} delay 30ms jitter 0ms loss 0% rate unlimited"]
            print(tc_show(ns_a, IFACE_A), *shaper.describe(), sep="\n")
            shaped, unshaped = rtts_ms(ns_a, PORT), rtts_ms(ns_a, PORT + 1)
            print(f"30 ms on port {PORT}: RTT {summary(shaped)}; port {PORT + 1}: RTT {summary(unshaped)}")
            assert min(shaped) >= 30.0 - DELAY_EARLY_MS
            assert statistics.median(unshaped) < UNSHAPED_MAX_MS

            leaf = shaper.change((IP_B, PORT), delay_ms=10.0)
            assert leaf["latency_ns"] == 10_000_000
            assert shaper.describe() == [f"{IFACE_A}: {IP_B}:{PORT} delay 10ms jitter 0ms loss 0% rate unlimited"]
            shaped, unshaped = rtts_ms(ns_a, PORT), rtts_ms(ns_a, PORT + 1)
            print(f"changed to 10 ms: port {PORT}: RTT {summary(shaped)}; port {PORT + 1}: RTT {summary(unshaped)}")
            assert min(shaped) >= 10.0 - DELAY_EARLY_MS
            assert statistics.median(shaped) < 30.0 - DELAY_EARLY_MS
            assert statistics.median(unshaped) < UNSHAPED_MAX_MS
        after = tc_show(ns_a, IFACE_A)
        print(f"before: {before.strip()}\nafter close: {after.strip()}")
        assert "6772:" not in after and after.split()[:3] == before.split()[:3]  # the kernel default is back
        assert shaper.previous_root == before.split()[1]
        shaper.close()  # idempotent
        assert shaper.describe() == []
        assert statistics.median(rtts_ms(ns_a, PORT, count=5)) < UNSHAPED_MAX_MS  # the delay went with the qdisc
    finally:
        server.close()


def test_a_root_that_is_not_ours_or_a_leftover_is_refused(hosts):
    ns_a, _ = hosts
    peers = [(LinkSpec(0, 1, delay_ms=1.0), IP_B, PORT)]
    subprocess.run(["tc", "-n", ns_a, "qdisc", "add", "dev", IFACE_A, "root", "handle", "1:", "htb"], check=True)
    with pytest.raises(ShapingError, match=f"{IFACE_A} has a root qdisc htb 1: that the testbed did not create"):
        EgressShaper(IFACE_A, "egress-test", namespace=ns_a).apply(peers)
    assert "qdisc htb 1: root" in tc_show(ns_a, IFACE_A)  # untouched
    subprocess.run(["tc", "-n", ns_a, "qdisc", "del", "dev", IFACE_A, "root"], check=True)
    subprocess.run(["tc", "-n", ns_a, "qdisc", "add", "dev", IFACE_A, "root", "handle", "6772:", "htb"], check=True)
    with pytest.raises(ShapingError, match="leftover .* testbed clean"):
        EgressShaper(IFACE_A, "egress-test", namespace=ns_a).apply(peers)


def test_a_crashed_shaper_leftover_is_removed_by_clean_and_nothing_else(hosts):
    ns_a, _ = hosts
    crash = (f"import os; from netem.egress import EgressShaper; from testbed.core.records import LinkSpec; "
             f"EgressShaper({IFACE_A!r}, 'crash').apply([(LinkSpec(0, 1, delay_ms=20.0), {IP_B!r}, {PORT})]); "
             f"os._exit(9)")  # dies with the tree applied: no close, no finally
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", crash], env=env, timeout=120,
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 9, proc.stderr
    assert "qdisc htb 6772: root" in tc_show(ns_a, IFACE_A)
    subprocess.run(["tc", "-n", ns_a, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"], check=True)
    from pyroute2 import netns

    if inside_uml() or not [n for n in netns.listnetns() if is_testbed_name(n)]:
        clean = [sys.executable, "-m", "netem.clean"]  # what `python -m testbed clean` runs
    else:  # somebody else's run is live on this host: do not remove its namespaces
        clean = [sys.executable, "-c", "from netem.clean import clean_egress; print(clean_egress())"]
    out = subprocess.run(["ip", "netns", "exec", ns_a, *clean], env=env, timeout=120, capture_output=True,
                         text=True, cwd=REPO)
    print(out.stdout, out.stderr)
    assert out.returncode == 0 and f"egress qdisc 6772: on {IFACE_A}" in out.stdout
    assert "6772:" not in tc_show(ns_a, IFACE_A)
    assert "qdisc htb 1: root" in tc_show(ns_a, "lo")  # not ours: untouched
    again = subprocess.run(["ip", "netns", "exec", ns_a, *clean], env=env, timeout=120, capture_output=True,
                           text=True, cwd=REPO)
    assert again.returncode == 0 and "6772:" not in again.stdout.replace("no egress root 6772:", "")
