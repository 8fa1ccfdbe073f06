"""Bench sections 1 and 2's reference: the userspace relay's release error, and a raw socket's one-way latency."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from netem.userspace import LinkTiming, RelayClock, relay
from testbed.core import clock

RELAY_DELAYS_MS = (1, 2, 5, 10, 20, 50, 100)
RELEASE_P99_TARGET_US = 100.0  # issue 29 (it was 200 us)


# --- 1. relay release error --------------------------------------------------------------------

async def relay_release_errors(delay_ms: float, messages: int) -> list[float]:
    """Release error (actual release - deadline, seconds) of a real relay between loopback TCP sockets."""
    errors: list[float] = []

    async def recording_sleep_until(deadline: float) -> None:
        await clock.sleep_until(deadline)
        errors.append(clock.now() - deadline)

    recording = RelayClock(clock.now, recording_sleep_until)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    sink_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    sink_port = sink_listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        async def handle(upstream: trio.SocketStream) -> None:
            downstream = await trio.open_tcp_stream("127.0.0.1", sink_port)
            await relay(upstream, downstream, LinkTiming(delay_ms / 1e3), recording)

        async def sink(stream: trio.SocketStream) -> None:
            while await stream.receive_some(65536):
                pass

        nursery.start_soon(trio.serve_listeners, handle, listeners)
        nursery.start_soon(trio.serve_listeners, sink, sink_listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        rng = np.random.default_rng(0)
        for _ in range(messages):
            await client.send_all(b"x" * 600)
            # Space messages irregularly so releases land at all phases of the millisecond timer tick.
            await trio.sleep(float(rng.uniform(0.0005, 0.003)))
        await trio.sleep(delay_ms / 1e3 + 0.05)
        await client.aclose()
        nursery.cancel_scope.cancel()
    return errors


# --- 2. raw loopback one-way -------------------------------------------------------------------

RAW_RECEIVER = """
import json, socket, sys, time
n, count = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
samples = []
for _ in range(count):
    buf = b""
    while len(buf) < n:
        chunk = c.recv(n - len(buf))
        if not chunk:
            sys.exit(1)
        buf += chunk
    samples.append(time.monotonic() - float(buf[:32]))
print(json.dumps(samples), flush=True)
"""


def raw_one_way_s(payload_bytes: int, rounds: int, gap_s: float) -> list[float]:
    """One-way latency of `payload_bytes` from one process to another over blocking loopback TCP sockets.

    The sender writes its monotonic send time into the message and the receiver subtracts it from its own
    receive time (one clock on one box). Messages are `gap_s` apart: with a gap like the testbed's laps
    the receiver sleeps between messages as an agent does, and pays the same wake-up.
    """
    receiver = subprocess.Popen([sys.executable, "-c", RAW_RECEIVER, str(payload_bytes), str(rounds)],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            if gap_s:
                clock.spin_until(clock.now() + gap_s)
            sock.sendall(repr(clock.now()).encode().ljust(payload_bytes))
        samples = json.loads(receiver.stdout.readline())
        sock.close()
        return samples
    finally:
        receiver.kill()
        receiver.wait()


def percentiles_us(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 50)) * 1e6, float(np.percentile(values, 99)) * 1e6


def relay_table(console: Console, quick: bool) -> list[dict]:
    """Section 1: the relay's release error per delay."""
    rows = []
    table = Table(title="1. userspace relay release error (release - deadline)")
    for col in ("delay ms", "releases", "p50 us", "p99 us", "max us", f"p99 <= {RELEASE_P99_TARGET_US:.0f} us"):
        table.add_column(col, justify="right")
    for delay in RELAY_DELAYS_MS:
        errors = trio.run(relay_release_errors, delay, 100 if quick else 400)
        p50, p99 = percentiles_us(errors)
        rows.append({"delay_ms": delay, "p50_us": p50, "p99_us": p99, "n": len(errors)})
        table.add_row(str(delay), str(len(errors)), f"{p50:.1f}", f"{p99:.1f}", f"{max(errors) * 1e6:.1f}",
                      "yes" if p99 <= RELEASE_P99_TARGET_US else "NO")
    console.print(table)
    return rows
