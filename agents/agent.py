"""The agent process: one pipeline stage, serving hidden-state frames around the ring (Trio).

Started by the launcher as ``python -m agents.agent --spec JSON --control-fd FD``.

Launcher -> agent, JSON lines on stdin:   {"cmd": "connect", "next": [host, port]}   {"cmd": "run"} (entry)
Agent -> launcher, JSON lines on the control fd:
    {"event": "listening", "port": P}  {"event": "ready"}  {"event": "probe", ...}  {"event": "lap", ...}
    {"event": "done", ...}  {"event": "error", "message": ...}
stdin closing means the launcher is gone or done: the agent exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import trio

from agents import wire
from agents.model import encode as encode_text
from agents.stage import PipelineStage, StagePlan
from testbed.core import clock
from testbed.core.errors import LinkBroken, PeerTimeout, TestbedError, WireError, leaf_errors

CONNECT_TIMEOUT_S = 30.0
LAP_TIMEOUT_S = 120.0  # a lap slower than this means a peer is gone (the slowest ring + RTOs is far below)
PROBE_LAPS = 5
CONTEXT_KEEP = 64  # tokens kept when the context window fills and a new sequence starts


@dataclass
class AgentSpec:
    """Everything one agent needs, as sent by the launcher."""

    stage: int
    n_stages: int
    name: str
    first_layer: int
    last_layer: int
    compute_ms: float
    model: str = "target"
    listen_host: str = "127.0.0.1"
    decode: dict[str, Any] = field(default_factory=dict)
    hop_delays_ms: list[float] = field(default_factory=list)  # configured ring, for speculation's K choice
    threads: int = 1


class Control:
    """JSON lines to the launcher over an inherited pipe."""

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "w", buffering=1)

    def send(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": event, **fields}) + "\n")
        self._file.flush()


def log(spec: AgentSpec, message: str) -> None:
    print(f"[agent {spec.stage} {spec.name}] {message}", file=sys.stderr, flush=True)


def stamp_tuple(s: wire.Stamp) -> list[float]:
    return [s.stage, s.recv, s.compute_start, s.real_end, s.compute_end, s.send, s.sent_bytes]


class Agent:
    def __init__(self, spec: AgentSpec, stage: PipelineStage, control: Control) -> None:
        self.spec = spec
        self.stage = stage
        self.control = control
        self.compute_s = spec.compute_ms / 1e3
        self.inbox_send, self.inbox = trio.open_memory_channel[tuple[wire.Frame, float]](16)
        self.out: trio.SocketStream | None = None

    # --- network -------------------------------------------------------------------------------

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """Read frames from one upstream connection into the inbox; a bad frame closes this connection only.

        Frames come at the lap's regular period, so the reader polls around the predicted arrival
        rather than sleeping through it (see testbed.core.clock.ArrivalPredictor).
        """
        raw = socket.socket(fileno=os.dup(stream.socket.fileno()))
        raw.setblocking(False)
        predictor = clock.ArrivalPredictor()
        reader = wire.FrameReader(stream, lambda n: clock.receive_polling(stream, raw.recv, predictor, n))
        try:
            while (item := await reader.read()) is not None:
                predictor.observe(item[1])
                await self.inbox_send.send(item)
        except WireError as exc:
            log(self.spec, f"closing connection: malformed frame: {exc}")
        except LinkBroken as exc:
            log(self.spec, f"upstream connection broke: {exc}")
        finally:
            raw.close()
            await trio.aclose_forcefully(stream)

    async def dial(self, address: tuple[str, int]) -> None:
        deadline = trio.current_time() + CONNECT_TIMEOUT_S
        while True:
            try:
                self.out = await trio.open_tcp_stream(*address)
                self.out.setsockopt(6, 1, 1)  # TCP_NODELAY
                return
            except OSError as exc:
                if trio.current_time() > deadline:
                    raise PeerTimeout(f"cannot reach next hop {address}: {exc}") from exc
                await trio.sleep(0.05)

    async def send(self, frame: wire.Frame) -> int:
        assert self.out is not None
        data = wire.encode(frame)
        try:
            await self.out.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise LinkBroken(f"next hop closed the connection: {exc}") from exc
        return len(data)

    async def receive(self) -> tuple[wire.Frame, float]:
        try:
            with trio.fail_after(LAP_TIMEOUT_S):
                return await self.inbox.receive()
        except trio.TooSlowError as exc:
            raise PeerTimeout(f"no frame from upstream within {LAP_TIMEOUT_S} s") from exc

    def stamped(self, frame: wire.Frame, recv: float, start: float, real_end: float, end: float,
                tensor: np.ndarray | None) -> wire.Frame:
        """The frame to send on, with this stage's stamp (send time taken now, just before sending)."""
        tensor = frame.tensor if tensor is None else tensor
        size = wire.HEADER.size + (len(frame.stamps) + 1) * wire.STAMP.size + (0 if tensor is None else tensor.nbytes)
        stamp = wire.Stamp(self.spec.stage, recv, start, real_end, end, clock.now(), size)
        return wire.Frame(frame.kind, frame.stream, frame.lap, frame.pos, frame.flags, tensor, frame.stamps + (stamp,))

    # --- middle stages -------------------------------------------------------------------------

    async def serve_ring(self) -> None:
        """Non-entry stages: compute on every frame and pass it on, until SHUTDOWN."""
        while True:
            frame, recv = await self.inbox.receive()
            if frame.kind == wire.Kind.SHUTDOWN:
                await self.send(self.stamped(frame, recv, recv, recv, recv, None))
                return
            if frame.kind == wire.Kind.PROBE:
                await self.send(self.stamped(frame, recv, recv, recv, recv, None))
                continue
            start = clock.now()
            hidden = self.stage.run(frame.tensor, frame.pos)
            real_end = clock.now()
            await clock.sleep_until(start + self.compute_s)
            await self.send(self.stamped(frame, recv, start, real_end, clock.now(), hidden))

    # --- entry stage ---------------------------------------------------------------------------

    async def probe(self) -> None:
        """Self-check: send empty frames around the ring and report every hop's one-way latency."""
        if self.spec.n_stages == 1:
            return
        for i in range(PROBE_LAPS):
            t = clock.now()
            await self.send(self.stamped(wire.Frame(wire.Kind.PROBE, lap=i), t, t, t, t, None))
            frame, recv = await self.receive()
            self.control.send("probe", lap=i, stamps=[stamp_tuple(s) for s in frame.stamps], return_recv=recv)

    async def lap(self, ids: list[int], pos: int, lap_no: int, kind: str,
                  decide: Callable[[torch.Tensor], Any]) -> tuple[Any, dict]:
        """One traversal of the ring for a block of tokens at positions pos..; `decide(logits)` runs in the head.

        Returns decide's result and the lap record. Entry compute (front + head) is padded to compute_ms.
        """
        start = clock.now()
        hidden = self.stage.embed_and_run(ids, pos)
        front_real_end = clock.now()
        if self.spec.n_stages > 1:
            frame = wire.Frame(wire.Kind.HIDDEN, lap=lap_no, pos=pos, tensor=hidden)
            await self.send(self.stamped(frame, start, start, front_real_end, front_real_end, hidden))
            back, return_recv = await self.receive()
            if back.kind != wire.Kind.HIDDEN or back.lap != lap_no:
                raise WireError(f"expected lap {lap_no} back, got {back.kind.name} lap {back.lap}")
            stamps, hidden = back.stamps, back.tensor
        else:
            stamps, return_recv = (wire.Stamp(0, start, start, front_real_end, front_real_end, front_real_end),), \
                front_real_end
        head_start = clock.now()
        result = decide(self.stage.logits(hidden))
        head_real_end = clock.now()
        front = front_real_end - start
        await clock.sleep_until(max(head_real_end, head_start + self.compute_s - front))
        end = clock.now()
        record = {"lap": lap_no, "kind": kind, "n_tok": len(ids), "start": start, "end": end,
                  "stamps": [stamp_tuple(s) for s in stamps], "return_recv": return_recv,
                  "head": [head_start, head_real_end, end]}
        return result, record

    async def run_plain(self, decode: dict[str, Any]) -> None:
        temperature = float(decode.get("temperature", 0.0))
        generator = torch.Generator().manual_seed(int(decode.get("seed", 0)))
        block_size = self.stage.model.config.block_size

        def sample(logits: torch.Tensor) -> int:
            last = logits[-1]
            if temperature <= 0:
                return int(torch.argmax(last))
            probs = torch.softmax(last / temperature, dim=-1)
            return int(torch.multinomial(probs, 1, generator=generator))

        ids = encode_text(decode["prompt"])[-(block_size // 2):]
        token, record = await self.lap(ids, 0, 0, "prefill", sample)
        self.control.send("lap", tokens=1, ids=[token], **record)
        sequence = ids + [token]
        generated = [token]
        lap_no = 1
        while len(generated) < int(decode["tokens"]):
            kind = "decode"
            if len(sequence) >= block_size:
                # Context full: start a new sequence from the recent tokens (a prefill lap, not a decode lap).
                sequence = sequence[-CONTEXT_KEEP:]
                block, pos, kind = sequence, 0, "prefill"
            else:
                block, pos = [sequence[-1]], len(sequence) - 1
            token, record = await self.lap(block, pos, lap_no, kind, sample)
            sequence.append(token)
            generated.append(token)
            self.control.send("lap", tokens=1, ids=[token], **record)
            lap_no += 1
        self.control.send("done", tokens=len(generated))

    async def shutdown_ring(self) -> None:
        if self.spec.n_stages == 1 or self.out is None:
            return
        t = clock.now()
        await self.send(self.stamped(wire.Frame(wire.Kind.SHUTDOWN), t, t, t, t, None))
        with trio.move_on_after(5):
            while True:
                frame, _ = await self.inbox.receive()
                if frame.kind == wire.Kind.SHUTDOWN:
                    break

    async def run_entry(self, decode: dict[str, Any]) -> None:
        await self.probe()
        mode = decode.get("mode", "plain")
        if mode == "plain":
            await self.run_plain(decode)
        else:
            from agents.spec import run_speculative

            await run_speculative(self, decode)
        await self.shutdown_ring()


async def read_commands(stdin: trio.lowlevel.FdStream, send: trio.MemorySendChannel) -> None:
    buffer = b""
    async with send:
        while chunk := await stdin.receive_some(65536):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    await send.send(json.loads(line))
    # EOF: the launcher is gone; the caller cancels everything.


async def agent_main(spec: AgentSpec, control: Control) -> None:
    from agents.train import load_model

    torch.set_num_threads(spec.threads)
    model = load_model(spec.model)
    plan = StagePlan(spec.stage, spec.n_stages, spec.first_layer, spec.last_layer)
    agent = Agent(spec, PipelineStage(model, plan), control)
    listeners = await trio.open_tcp_listeners(0, host=spec.listen_host)
    control.send("listening", port=listeners[0].socket.getsockname()[1])

    commands_send, commands = trio.open_memory_channel[dict](16)
    async with trio.open_nursery() as nursery:
        stdin = trio.lowlevel.FdStream(os.dup(0))

        async def watch_stdin() -> None:
            await read_commands(stdin, commands_send)
            nursery.cancel_scope.cancel()  # launcher gone: stop

        nursery.start_soon(watch_stdin)
        await nursery.start(trio.serve_listeners, agent.serve_connection, listeners)
        async for command in commands:
            if command["cmd"] == "connect":
                if spec.n_stages > 1:
                    await agent.dial(tuple(command["next"]))
                control.send("ready")
            elif command["cmd"] == "run":
                break
            else:
                raise TestbedError(f"unknown command {command!r}")
        else:
            return
        if plan.is_entry:
            await agent.run_entry(spec.decode)
        else:
            await agent.serve_ring()
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.agent")
    parser.add_argument("--spec", required=True, help="AgentSpec as JSON")
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    spec = AgentSpec(**json.loads(args.spec))
    # No PR_SET_PDEATHSIG: Trio forks from a worker thread, and that signal fires when the forking *thread*
    # exits. Orphans are prevented by the stdin pipe instead: when the launcher dies, stdin hits EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides how we stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    control = Control(args.control_fd)
    try:
        trio.run(agent_main, spec, control)
    except BaseException as exc:  # noqa: BLE001 - our own errors are reported, anything else re-raised
        leaves = leaf_errors(exc)
        if not all(isinstance(e, TestbedError) for e in leaves):
            raise
        message = "; ".join(f"{type(e).__name__}: {e}" for e in leaves)
        log(spec, f"fatal: {message}")
        control.send("error", message=message)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
