"""bench, section 2b: one hop taken apart, so the per-hop overhead of section 2 has names.

A sender paces one-token frames 30 ms apart (as laps are) over loopback TCP to a receiver in another process,
four ways, each measured from the sender's stamp (taken just before the write, as an agent's is) to the
receiver's (the frame complete, as an agent's is):

    raw -> raw                      blocking sockets: the box's floor (section 2's baseline)
    raw -> relay -> raw             through the real relay process (netem.userspace) at delay D: what it adds
    raw -> agent reader             the agent's own reader (TcpTransport.inbound + FrameReader, in Trio)
    raw -> relay -> agent reader    both: the path a ring's hop takes, less the sender's encode

Each line is the one-way time less the configured delay: mean, p50 and p99 over the same number of frames.
The sender's encode and the receiver's decode are timed in process (mean of many), since they add to every hop.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from agents.process import wire
from agents.process.reader import FrameReader
from netem.userspace import DEFAULT_RTO_MS, RELAY_CHUNK
from testbed.core import clock
from testbed.core.channel import encode_line
from testbed.core.records import LinkSpec

HOP_DELAY_MS = 10.0
HOP_GAP_S = 0.030  # frames as far apart as the Table 2 rings' laps
PATHS = (("raw -> raw", "raw", False), ("raw -> relay -> raw", "raw", True),
         ("raw -> agent reader", "agent", False), ("raw -> relay -> agent reader", "agent", True))


def one_token_frame(sent: float) -> bytes:
    """The 3-stage ring's decode frame (one stamp, [1, 1, 128] float32), stamped `sent`."""
    stamp = wire.Stamp(0, sent, sent, sent, sent, sent, 612, 1)
    return wire.encode(wire.Frame(wire.Kind.HIDDEN, 0, 1, 5, 0, np.zeros((1, 1, 128), np.float32), (stamp,)))


def codec_us(rounds: int) -> tuple[float, float]:
    """Mean encode and decode time of that frame, us."""
    started = time.perf_counter()
    for _ in range(rounds):
        data = one_token_frame(1.0)
    encode_us = (time.perf_counter() - started) / rounds * 1e6
    started = time.perf_counter()
    for _ in range(rounds):
        wire.decode_body(wire.decode_header(data), data[wire.HEADER.size:])
    return encode_us, (time.perf_counter() - started) / rounds * 1e6


# --- the hop's steps, each timed in process -------------------------------------------------------------------

PROFILE_WIDTHS = {"612 B": 128, "8 KiB": 2048, "32 KiB": 8192, "1 MiB": 262144}  # float32 [1, 1, C]: the frame's size
PROFILE_STEPS = ("encode", "stamp", "send", "relay", "receive", "decode")


def _drain(sock: socket.socket, n: int, into: memoryview) -> None:
    got = 0
    while got < n:
        got += sock.recv_into(into[got:n])


def step_us(width: int, rounds: int) -> dict[str, float]:
    """Mean us of each step of one hop for a [1, 1, width] float32 frame, in process over loopback TCP with no
    one asleep (the wake-ups are section 2b's): the sender's encode (in pieces) and stamp (its send time written
    into them), its vectored write, the relay's pass (its receive of the chunks and its write of them on), the
    reader's receive of the bytes and the decode."""
    frame = wire.Frame(wire.Kind.HIDDEN, 0, 1, 5, 0, np.ones((1, 1, width), np.float32),
                       (wire.Stamp(0, 1.0, 1.0, 1.0, 1.0, 1.0, 612, 1),))
    listener = socket.create_server(("127.0.0.1", 0))
    a, b, c = socket.create_connection(listener.getsockname()), None, None
    b, _ = listener.accept()
    c = socket.create_connection(listener.getsockname())
    d, _ = listener.accept()
    for sock in (a, b, c, d):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    total = {step: 0.0 for step in PROFILE_STEPS}
    size = len(wire.encode(frame))
    buffer = memoryview(bytearray(size))
    for _ in range(rounds):
        t0 = time.perf_counter()
        pieces, _ = wire.encode_pieces(frame)
        t1 = time.perf_counter()
        pieces[1] = wire.restamped(pieces[1], clock.now())
        t2 = time.perf_counter()
        a.sendmsg(pieces)
        t3 = time.perf_counter()
        moved = 0
        while moved < size:  # the relay: each chunk is its own bytes (it waits in a queue for its deadline)
            chunk = b.recv(RELAY_CHUNK)
            c.sendall(chunk)
            moved += len(chunk)
        t4 = time.perf_counter()
        _drain(d, size, buffer)
        t5 = time.perf_counter()
        wire.decode_body(wire.decode_header(buffer), buffer[wire.HEADER.size:])
        t6 = time.perf_counter()
        for step, (start, end) in zip(PROFILE_STEPS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6))):
            total[step] += end - start
    for sock in (a, b, c, d, listener):
        sock.close()
    return {step: seconds / rounds * 1e6 for step, seconds in total.items()}


def hop_profile_table(console: Console, quick: bool) -> dict[str, dict[str, float]]:
    """The hop's steps per frame size (step_us), side by side."""
    figures = {label: step_us(width, 50 if quick else 300) for label, width in PROFILE_WIDTHS.items()}
    table = Table(title="2c. the hop's steps per frame size, mean us in process (no wake-ups: those are 2b's)")
    for col in ("frame", *PROFILE_STEPS, "sum"):
        table.add_column(col, justify="right")
    for label, steps in figures.items():
        table.add_row(label, *(f"{steps[step]:.1f}" for step in PROFILE_STEPS), f"{sum(steps.values()):.1f}")
    console.print(table)
    return figures


# --- the receivers (run as `python -m testbed.studies.bench.hop --receive raw|agent COUNT`) ------------------

def receive_raw(count: int) -> list[float]:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    conn, _ = listener.accept()
    size = len(one_token_frame(0.0))
    samples = []
    for _ in range(count):
        buf = b""
        while len(buf) < size:
            if not (chunk := conn.recv(size - len(buf))):
                raise SystemExit("sender closed early")
            buf += chunk
        received = clock.now()
        samples.append(received - wire.decode(buf).stamps[-1].send)
    return samples


async def receive_agent(count: int) -> list[float]:
    from testbed.core.transport import TCP

    listener, port = await TCP.listen("127.0.0.1")
    print(port, flush=True)
    stream = await listener.accept()
    inbound = TCP.inbound(stream)
    reader = FrameReader(stream, inbound.receive, now=clock.now)
    samples = []
    for _ in range(count):
        frame, received = await reader.read()
        inbound.observe(received)
        samples.append(received - frame.stamps[-1].send)
    return samples


def one_path(kind: str, via_relay: bool, count: int) -> np.ndarray:
    """One-way seconds (less the relay's delay) of `count` frames on one path."""
    receiver = subprocess.Popen([sys.executable, "-m", "testbed.studies.bench.hop", "--receive", kind, str(count)],
                                stdout=subprocess.PIPE, text=True)
    relay = None
    try:
        port = int(receiver.stdout.readline())
        if via_relay:
            relay = subprocess.Popen([sys.executable, "-m", "netem.userspace"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
            link = LinkSpec(0, 1, delay_ms=HOP_DELAY_MS)
            relay.stdin.write(encode_line({"rto_ms": DEFAULT_RTO_MS, "links": [{"link": vars(link),
                                                                      "target": ["127.0.0.1", port]}]}))
            relay.stdin.flush()
            port = next(iter(json.loads(relay.stdout.readline())["ports"].values()))
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            clock.spin_until(clock.now() + HOP_GAP_S)
            sock.sendall(one_token_frame(clock.now()))
        samples = np.array(json.loads(receiver.stdout.readline()))
        sock.close()
        return samples - (HOP_DELAY_MS / 1e3 if via_relay else 0.0)
    finally:
        for process in (receiver, relay):
            if process is not None:
                process.kill()
                process.wait()


def hop_breakdown_table(console: Console, quick: bool) -> dict:
    """Section 2b: each path's added time, and the codec, side by side in one run."""
    count = 100 if quick else 400
    encode_us, decode_us = codec_us(2000 if quick else 20000)
    figures = {"encode_us": encode_us, "decode_us": decode_us, "frames": count, "delay_ms": HOP_DELAY_MS,
               "paths": {}}
    table = Table(title=f"2b. one hop taken apart ({len(one_token_frame(0.0))}-byte frame, {count} frames "
                        f"{HOP_GAP_S * 1e3:.0f} ms apart; relay at {HOP_DELAY_MS:g} ms, subtracted; encode "
                        f"{encode_us:.1f} us and decode {decode_us:.1f} us a frame, in process)")
    for col in ("path", "mean us", "p50 us", "p99 us", "p50 over raw"):
        table.add_column(col, justify="right")
    raw_p50 = None
    for label, kind, via_relay in PATHS:
        us = one_path(kind, via_relay, count) * 1e6
        mean, p50, p99 = float(us.mean()), float(np.percentile(us, 50)), float(np.percentile(us, 99))
        raw_p50 = p50 if raw_p50 is None else raw_p50
        figures["paths"][label] = {"mean_us": mean, "p50_us": p50, "p99_us": p99}
        table.add_row(label, f"{mean:.1f}", f"{p50:.1f}", f"{p99:.1f}", f"{p50 - raw_p50:+.1f}")
    console.print(table)
    figures["profile"] = hop_profile_table(console, quick)
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receive", choices=("raw", "agent"), required=True)
    parser.add_argument("count", type=int)
    args = parser.parse_args(argv)
    samples = receive_raw(args.count) if args.receive == "raw" else trio.run(receive_agent, args.count)
    print(json.dumps(samples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
