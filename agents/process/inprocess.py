"""An agent as a Trio task in the launcher's process, with the face of a `trio.Process` (the virtual backend).

The launcher supervises it exactly as it supervises an agent process: JSON commands on `stdin`, JSON events on
`control`, log lines on `stderr`, `wait()` for its exit status, `terminate()`/`kill()` to stop it. Its exit
status follows `agents.process.agent.main`: 0 at a normal end, 1 after an error (the testbed's own errors are reported as
an "error" event first, anything else leaves its traceback on stderr), -SIGTERM when it was stopped.
"""

from __future__ import annotations

import signal
import traceback

import trio
import trio.testing

from agents.process.agent import AgentSpec, Control, agent_main, report_fatal
from testbed.core.clock import Clock
from testbed.core.transport import Transport


class TaskAgent:
    """One agent of an in-process run; start `run` in a nursery (it never raises: its end is its status)."""

    stdout = None

    def __init__(self, spec: AgentSpec, transport: Transport, clock: Clock) -> None:
        self.spec = spec
        self.transport = transport
        self.clock = clock
        self.stdin, self._commands = trio.testing.memory_stream_one_way_pair()
        self.control = trio.testing.MemoryReceiveStream()
        self.stderr = trio.testing.MemoryReceiveStream()
        self.returncode: int | None = None
        self._scope = trio.CancelScope()
        self._done = trio.Event()

    def _say(self, message: str) -> None:
        self.stderr.put_data(f"[agent {self.spec.stage} {self.spec.name}] {message}\n".encode())

    async def run(self) -> None:
        control = Control(self.control.put_data)
        try:
            with self._scope:
                try:
                    await agent_main(self.spec, control, self._commands, transport=self.transport, clock=self.clock,
                                     say=self._say)
                    self.returncode = 0
                except Exception as exc:  # noqa: BLE001 - as agents.process.agent.main: reported, then an exit status
                    if not report_fatal(exc, control, self._say):
                        self.stderr.put_data("".join(traceback.format_exception(exc)).encode())
                    self.returncode = 1
        finally:
            if self.returncode is None:
                self.returncode = -signal.SIGTERM
            self.control.put_eof()
            self.stderr.put_eof()
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        self._scope.cancel()

    kill = terminate
