"""The launcher's side of the fork server (Trio): start it, ask it for agents, watch them, close it."""

from __future__ import annotations

import collections
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

import trio

from agents.forkserver import (MAX_MESSAGE, ORPHAN_POLL_S, SINGLE_THREAD_ENV, STOP_GRACE_S, TITLE_ROOM, UNKNOWN_STATUS,
                               decode, fds_message, fds_of)
from testbed.core.channel import LineReader
from testbed.core.errors import AgentFailed
from testbed.core.process import stop_process

@dataclass
class ForkedAgent:
    """An agent forked by the server, with the part of trio.Process's interface the launcher uses."""

    pid: int
    pidfd: int
    stdin: Any  # trio FdStream: the agent's commands
    stderr: Any  # trio FdStream
    stdout: Any = None
    returncode: int | None = None

    def __post_init__(self) -> None:
        self._changed = trio.Event()  # it exited, or its server is gone
        self._orphaned = False

    def poll(self) -> int | None:
        return self.returncode

    async def wait(self) -> int:
        await self._changed.wait()
        while self.returncode is None:  # orphaned: init reaps it, its pidfd turns readable then (status lost)
            if select.select([self.pidfd], [], [], 0)[0]:
                self.exited(UNKNOWN_STATUS)
            else:
                await trio.sleep(ORPHAN_POLL_S)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                pass  # exited; the server's report is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def exited(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
            os.close(self.pidfd)
            self._changed.set()

    def orphan(self) -> None:
        """Its server is gone: the agent's parent is now init, which reaps it; `wait` watches its pidfd, and its
        status is lost (UNKNOWN_STATUS)."""
        self._orphaned = True
        self._changed.set()


class ForkServer:
    """The launcher's handle on its fork server: `start`, then `spawn` per agent, then `aclose`."""

    def __init__(self, process: Any, sock: Any, on_stderr: Callable[[str], None]) -> None:
        self.process = process
        self.sock = sock
        self.on_stderr = on_stderr
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self.ready = trio.Event()
        self.info: dict[str, Any] = {}
        self.pending: dict[int, tuple[trio.Event, dict[str, Any], tuple[int, int]]] = {}  # id -> reply, our ends
        self.agents: dict[int, ForkedAgent] = {}
        self.closing = False
        self._serve_scope = trio.CancelScope()
        self._starting = trio.CancelScope()  # the wait for "ready"
        self.log: Callable[[str], None] = lambda message: None
        self.lost: str | None = None
        self._next_id = 0

    @classmethod
    async def start(cls, nursery: Any, models: list[str], *, timeout_s: float, run_id: str = "",
                    on_stderr: Callable[[str], None] = lambda line: None,
                    log: Callable[[str], None] = lambda message: None) -> "ForkServer":
        """Start the server in `nursery`'s lifetime and wait until it has preloaded `models`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "agents.forkserver", "--socket-fd", str(theirs.fileno()),
                "--models", ",".join(models), "--run", run_id, "--title-room", " " * TITLE_ROOM]
        try:
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),),
                env={**os.environ, **SINGLE_THREAD_ENV}, process_group=0)  # Ctrl-C reaches the launcher only
        except OSError as exc:
            ours.close()
            raise AgentFailed("fork server", f"cannot start: {exc}") from exc
        finally:
            theirs.close()
        server = cls(process, trio.socket.from_stdlib_socket(ours), on_stderr)
        server.log = log
        nursery.start_soon(server._read_stderr)
        nursery.start_soon(server._serve)
        try:
            with trio.move_on_after(timeout_s) as server._starting:
                await server.ready.wait()
            if server._starting.cancelled_caught:
                raise trio.TooSlowError
            if server.lost:
                raise AgentFailed("fork server", server.lost)
        except BaseException as exc:
            await server.aclose(STOP_GRACE_S)  # its reader is shielded: it ends only here
            if isinstance(exc, trio.TooSlowError):
                raise AgentFailed("fork server", f"not ready within {timeout_s:.0f} s (importing torch, loading "
                                                 f"{', '.join(models)})") from exc
            raise
        return server

    async def spawn(self, spec_json: str, *, netns: str | None = None,
                    title: str = "") -> tuple[ForkedAgent, Any]:
        """Fork an agent running `spec_json`, inside network namespace `netns` (a path) if given: (the agent, the
        read end of its control pipe)."""
        if self.lost:
            raise AgentFailed("fork server", self.lost)
        self._next_id += 1
        request_id = self._next_id
        stdin_r, stdin_w = os.pipe()
        control_r, control_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        done, reply = trio.Event(), {}
        self.pending[request_id] = (done, reply, (stdin_w, stderr_r))
        message = {"op": "spawn", "id": request_id, "spec": spec_json, "netns": netns, "title": title}
        try:
            await self.sock.sendmsg([json.dumps(message).encode()], fds_message([stdin_r, control_w, stderr_w]))
        except OSError as exc:
            self.pending.pop(request_id)
            for fd in (stdin_w, stderr_r, control_r):
                os.close(fd)
            raise AgentFailed("fork server", self.lost or f"cannot send it a request: {exc}") from exc
        finally:
            for fd in (stdin_r, control_w, stderr_w):  # the agent's ends: the server passed them on
                os.close(fd)
        await done.wait()
        if reply.get("op") != "spawned":
            os.close(control_r)
            raise AgentFailed("fork server", reply.get("message", "no reply"))
        return self.agents[reply["pid"]], trio.lowlevel.FdStream(control_r)

    async def _serve(self) -> None:
        """Read the server's messages until it closes its end. Shielded: the run's teardown (a cancelled nursery)
        waits for its agents' exits, which come this way; `aclose` ends it."""
        with trio.CancelScope(shield=True) as self._serve_scope:
            await self._read_messages()

    async def _read_messages(self) -> None:
        while True:
            try:
                data, ancdata, _, _ = await self.sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4))
            except trio.ClosedResourceError:
                if self.closing:
                    return
                raise
            fds = fds_of(ancdata)
            if not data:
                break
            message = decode(data)
            op = message["op"]
            if op == "training":  # the recipe changed since the weights shipped: as long as that takes
                self._starting.deadline = math.inf
                self.log("the fork server is training the models first (the recipe changed since the weights were shipped; "
                               "minutes on a small VM)")
            elif op == "ready":
                self.info = message
                self.ready.set()
            elif op in ("spawned", "failed"):
                done, reply, (stdin_w, stderr_r) = self.pending.pop(message.get("id"))
                if op == "spawned":  # registered now: its exit may be the very next message
                    self.agents[message["pid"]] = ForkedAgent(message["pid"], fds[0], trio.lowlevel.FdStream(stdin_w),
                                                              trio.lowlevel.FdStream(stderr_r))
                else:
                    os.close(stdin_w)
                    os.close(stderr_r)
                reply.update(message)
                done.set()
            elif op == "exit" and message["pid"] in self.agents:
                self.agents[message["pid"]].exited(int(message["status"]))
        await self._lose()

    async def _lose(self) -> None:
        """The server's end closed: expected after `aclose`; otherwise it died, and the run fails with its cause."""
        status = await self.process.wait()
        how = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
        errors = [line for line in self.stderr_tail if line.strip()]
        self.lost = f"died ({how})" + (f"; last output: {errors[-1].strip()}" if errors else "")
        self.ready.set()
        for request_id in list(self.pending):
            done, reply, ends = self.pending.pop(request_id)
            for fd in ends:
                os.close(fd)
            reply.update({"op": "failed", "message": self.lost})
            done.set()
        for agent in self.agents.values():
            agent.orphan()
        if not self.closing:
            raise AgentFailed("fork server", self.lost)

    async def _read_stderr(self) -> None:
        async for line in LineReader(self.process.stderr):
            text = line.decode("utf-8", "replace")
            self.stderr_tail.append(text)
            self.on_stderr(text)

    async def aclose(self, grace_s: float) -> None:
        """Stop the server (its agents stopped first): it sees EOF, reaps what is left, and exits."""
        self.closing = True
        with trio.CancelScope(shield=True):
            try:
                self.sock.shutdown(socket.SHUT_WR)  # its EOF; ours comes when it has exited
            except OSError:
                pass  # already gone
            await stop_process(self.process, grace_s)
            self._serve_scope.cancel()  # its EOF has come (it exited), or it never will
            self.sock.close()


