"""The agent process: one pipeline stage serving hidden-state frames around the ring (Trio).

Forked by the launcher's fork server (agents.forkserver), or started as ``python -m agents.process.agent --spec JSON
--control-fd FD`` (JSON: an AgentSpec); either way it runs `run_process`.

Launcher -> agent, JSON lines on stdin:
    {"cmd": "connect", "peers": {"DST": [host, port], ...}}   every directed link out of this stage
    {"cmd": "run"}
Agent -> launcher, JSON lines on the control fd:
    {"event": "listening", "port": P}  {"event": "ready"}  {"event": "probe", "record": LapRecord}
    {"event": "lap", "record": LapRecord}  {"event": "done", "tokens": N}  {"event": "error", "message": ...}
    {"event": "laps", "record": LapRecord, "laps": [...], "streams": [...], "ids": [[...], ...]}   the laps of one
        BATCH frame's streams: the record's, with each one's lap, stream and ids (RingClient.report_laps)
    {"event": "usage", "wall_s": W, "cpu_s": S, "max_rss_mb": M}   CPU and memory over the run, before done/finished
    {"event": "finished"}   a middle stage passed the entry's SHUTDOWN on: its exit from here on is normal
    {"event": "notice", "message": ...}   what the user must read (the serve mode's endpoint address): the launcher logs it
stdin closing means the launcher is gone or done: the agent exits.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import trio

from agents.process.codec import emulated_payload_bytes
from agents.zoo.prompts import prompt_ids
from agents.process.ring import RingClient
from agents.process.spec import AgentSpec
from agents.process.stage import PipelineStage, StagePlan
from testbed.core.channel import LineReader, encode_line
from testbed.core.clock import MONOTONIC, Clock
from testbed.core.decode import resolve
from testbed.core.errors import TestbedError, leaf_errors
from testbed.core.transport import TCP, Transport


@dataclass(frozen=True)
class Usage:
    """This process's CPU time and peak memory at one moment (getrusage)."""

    wall_s: float
    cpu_s: float
    max_rss_mb: float
    uss_mb: float | None  # private pages only (Private_Clean + Private_Dirty of smaps_rollup): not the fork server's

    @classmethod
    def now(cls, memory: bool = True) -> "Usage":
        """`memory`: read the private pages too (a walk of every mapping: ~7 ms in a process of 1 GB, so not once
        per agent where a thousand agents share one process, whose memory is the run's, not theirs)."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return cls(time.monotonic(), ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024,  # KiB -> MB
                   _private_mb() if memory else None)

    def since(self, start: "Usage") -> dict[str, float]:
        """The "usage" event: CPU share of one core over the run (from the run command to its end), peak RSS,
        and the private memory at its end."""
        wall = self.wall_s - start.wall_s
        return {"wall_s": wall, "cpu_s": self.cpu_s - start.cpu_s, "max_rss_mb": self.max_rss_mb,
                "uss_mb": self.uss_mb}


def _private_mb() -> float:
    try:
        with open("/proc/self/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith("Private_"))
    except OSError:
        return 0.0
    return sum(int(value.split()[0]) for value in fields.values()) / 1024


class Control:
    """JSON lines to the launcher: over an inherited pipe (`from_fd`), or to a callable in the same process."""

    def __init__(self, write: Callable[[bytes], Any]) -> None:
        self._write = write

    @classmethod
    def from_fd(cls, fd: int) -> "Control":
        return cls(os.fdopen(fd, "wb", buffering=0).write)

    def send(self, event: str, fields: dict[str, Any] | None = None) -> None:
        self._write(encode_line({"event": event, **(fields or {})}))


def log(spec: AgentSpec, message: str) -> None:
    print(f"[agent {spec.stage} {spec.name}] {message}", file=sys.stderr, flush=True)


def report_fatal(exc: BaseException, control: Control, say: Callable[[str], None]) -> bool:
    """An agent's end by `exc`: when every leaf is the testbed's own error, say it and send the "error" event
    (True); anything else is not ours to word (False: the caller lets its traceback out)."""
    leaves = leaf_errors(exc)
    if not leaves or not all(isinstance(e, TestbedError) for e in leaves):
        return False
    message = "; ".join(f"{type(e).__name__}: {e}" for e in leaves)
    say(f"fatal: {message}")
    control.send("error", {"message": message})
    return True


async def agent_main(spec: AgentSpec, control: Control, commands: trio.abc.ReceiveStream, *,
                     transport: Transport = TCP, clock: Clock = MONOTONIC,
                     say: Callable[[str], None] | None = None) -> None:
    """One agent from its spec to its end. `commands`: the launcher's JSON lines; `transport` and `clock`: the
    seam a backend chooses (TCP on the box's clock, or the virtual backend's memory network on simulated time)."""
    ring, plan = build_ring(spec, control, transport, clock, say or (lambda message: log(spec, message)))
    listener, port = await transport.listen(spec.listen_host)
    control.send("listening", {"port": port})

    async with trio.open_nursery() as nursery:
        commands = LineReader(commands)
        await nursery.start(trio.serve_listeners, ring.serve_connection, [listener])
        if not await connect_until_run(ring, commands, control):
            nursery.cancel_scope.cancel()  # launcher gone: stop
            return

        async def watch_stdin() -> None:
            while await commands.receive_line() is not None:
                pass
            nursery.cancel_scope.cancel()  # launcher gone: stop

        nursery.start_soon(watch_stdin)
        own_memory = not transport.one_process
        usage_at_start = Usage.now(memory=own_memory)
        event, data = await play_role(spec, ring, plan)
        control.send("usage", Usage.now(memory=own_memory).since(usage_at_start))
        control.send(event, data)
        nursery.cancel_scope.cancel()


def build_ring(spec: AgentSpec, control: Control, transport: Transport, clock: Clock,
               say: Callable[[str], None]) -> tuple[RingClient, StagePlan]:
    """This agent's stage (its share of the model) in its ring client, and its place in the ring."""
    from agents.process.shared import shared_model

    torch.set_num_threads(spec.threads)
    plan = StagePlan(spec.stage, spec.n_stages, spec.first_layer, spec.last_layer)
    # a checkpoint loads this agent's share only: its layers, and the embeddings and head where it uses them; with
    # [weights], from the shard its node fetched, verified again first
    model = shared_model(spec.model, (spec.first_layer, spec.last_layer, plan.is_entry or spec.is_head or spec.head_on_last),
                         spec.weights)
    ring = RingClient(PipelineStage(model, plan, tree_slots=spec.tree_slots), spec, report=control.send, clock=clock,
                      log=say, transport=transport)
    if spec.head_on_last:  # what this last stage returns instead of its hidden state: the mode's runner says
        ring.last_head = resolve(spec.runner).last_head(spec.decode, ring)
    return ring, plan


async def connect_until_run(ring: RingClient, commands: LineReader, control: Control) -> bool:
    """Dial the peers on "connect" (then say "ready"), until "run"; False when the launcher is gone first."""
    while True:
        command = await commands.receive_json()
        if command is None:
            return False
        if command["cmd"] == "connect":
            await ring.dial({int(dst): tuple(address) for dst, address in command["peers"].items()})
            control.send("ready")
        elif command["cmd"] == "run":
            return True
        else:
            raise TestbedError(f"unknown command {command!r}")


async def play_role(spec: AgentSpec, ring: RingClient, plan: StagePlan) -> tuple[str, dict | None]:
    """This agent's part of the run, to its end: the event that reports it ("done" with the tokens from the
    entry, else "finished": exiting is expected, the SHUTDOWN may still have hops to go)."""
    if spec.stage >= spec.n_stages:  # an edge client: it drafts, the entry verifies
        await resolve(spec.runner)(spec.decode, ring, spec.spec).run()
        return "finished", None
    if spec.every_agent:  # tensor parallelism: every rank runs the mode, rank 0 reports
        # (no probe laps: another rank's first all-reduce message could overtake them at the entry)
        tokens = await resolve(spec.runner)(spec.decode, ring).run()
        return ("done", {"tokens": tokens}) if plan.is_entry else ("finished", None)
    if spec.is_head:
        from agents.process.head import serve_head

        await serve_head(ring, resolve(spec.runner)(spec.decode, ring).sample)
        return "finished", None
    if plan.is_entry:
        if spec.warm_windows:
            await ring.warm(prompt_frame_bytes(spec, ring.stage.model))
        await ring.probe()
        tokens = await resolve(spec.runner)(spec.decode, ring).run()
        await ring.shutdown()
        return "done", {"tokens": tokens}
    await ring.serve()
    return "finished", None


def prompt_frame_bytes(spec: AgentSpec, model) -> int:
    """The largest frame a run starts with: its prompt's hidden state (f32, or the emulated geometry's)."""
    positions = max(spec.decode.prompt_tokens, len(prompt_ids(spec.decode, model)))
    return emulated_payload_bytes(positions, spec.wire) if spec.wire.width else positions * model.config.n_embd * 4


def run_process(spec: AgentSpec, control_fd: int) -> int:
    """This process as agent `spec` until its end: its exit status. Commands come on stdin (fd 0), events go to
    `control_fd`, its words to stderr. Entered by `main` (a fresh process) or by a child of the fork server."""
    # No PR_SET_PDEATHSIG: Trio forks from a worker thread, and that signal fires when the forking *thread*
    # exits. Orphans are prevented by the stdin pipe instead: when the launcher dies, stdin hits EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides how we stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    control = Control.from_fd(control_fd)
    try:
        trio.run(agent_main, spec, control, trio.lowlevel.FdStream(os.dup(0)))
    except BaseException as exc:  # noqa: BLE001 - our own errors are reported, anything else re-raised
        if not report_fatal(exc, control, lambda message: log(spec, message)):
            raise
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.process.agent")
    parser.add_argument("--spec", required=True, help="AgentSpec as JSON")
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return run_process(AgentSpec.from_json(args.spec), args.control_fd)


if __name__ == "__main__":
    sys.exit(main())
