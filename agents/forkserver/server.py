"""The fork server process: preload, then fork an agent per request (plain blocking code: no Trio tasks, no
threads in the process that forks)."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

from agents.forkserver import (ANCILLARY_SPACE, FDS_PER_SPAWN, MAX_MESSAGE, PRELOAD_MODULES,
                               SHUTDOWN_GRACE_S, decode, fds_message, fds_of)
from testbed.core.process import enter_netns


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def ensure_weights(announce: Callable[[], None]) -> None:
    """Train the models first if the recipe changed since the weights were shipped (and the cache lacks them), in a
    child process: training runs torch's thread pool, and a server with threads must not fork."""
    from agents.zoo import train

    if train.trained_meta() is not None:
        return
    announce()
    subprocess.run([sys.executable, "-c", "from agents.zoo.train import ensure_trained; ensure_trained()"], check=True)


def preload(models: list[str]) -> None:
    """Import what an agent runs and load `models` into agents.process.shared, as every agent would (then shared)."""
    import importlib

    import torch

    torch.set_num_threads(1)  # no intra-op pool before the fork; each agent sets its own (AgentSpec.threads)
    from agents.process.shared import shared_model
    from agents.modes import MODES

    for module in PRELOAD_MODULES + tuple(f"{info.package}.runner" for info in MODES.values()):
        importlib.import_module(module)
    for name in models:
        shared_model(name, (0, 0, False))  # a byte model whole; a checkpoint's shapes only: each agent loads its share
    gc.collect()
    gc.freeze()  # the preloaded objects out of the collector's sight: its passes would dirty their shared pages


def set_title(title: str) -> bool:
    """Rewrite this process's command line in place (what /proc/PID/cmdline, ps and pgrep -f show); False when
    the title does not fit the argv memory the process started with."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end = int(fields[45]), int(fields[46])  # stat fields 48 and 49 (proc(5)); [0] is field 3
    room = arg_end - arg_start
    data = title.encode("utf-8", "replace")[: room - 1]
    if room <= 1:
        return False
    ctypes.memmove(arg_start, data.ljust(room, b"\0"), room)
    return True


def exit_status(pidfd: int) -> int:
    """Reap the child behind `pidfd`: its status as subprocess reports one (the code, or -signal)."""
    result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    return -result.si_status if result.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else result.si_status


class Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, int] = {}  # pidfd -> pid

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        self.sock.sendmsg([json.dumps(message).encode()], fds_message(fds or []))

    def serve(self, models: list[str]) -> int:
        started = time.monotonic()
        ensure_weights(lambda: self.send({"op": "training"}))
        preload(models)
        self.send({"op": "ready", "pid": os.getpid(), "preload_s": time.monotonic() - started})
        self.selector.register(self.sock, selectors.EVENT_READ, None)
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    if not self.on_request():
                        return self.shutdown()
                else:
                    self.on_exit(key.fd, key.data)

    def on_request(self) -> bool:
        data, ancdata, _, _ = self.sock.recvmsg(MAX_MESSAGE, ANCILLARY_SPACE)
        fds = fds_of(ancdata)
        if not data:
            return False  # the launcher is gone
        request_id = None
        try:
            request = decode(data)
            request_id = request.get("id")
            if request["op"] != "spawn" or len(fds) != FDS_PER_SPAWN:
                raise ValueError(f"expected a spawn with {FDS_PER_SPAWN} descriptors, got {request['op']!r} "
                                 f"with {len(fds)}")
            self.spawn(request, fds)
        except (ValueError, KeyError, OSError) as exc:
            self.send({"op": "failed", "id": request_id, "message": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:  # the child has its copies; the server keeps none (EOF must reach the launcher)
                os.close(fd)
        return True

    def spawn(self, request: dict[str, Any], fds: list[int]) -> None:
        threads = thread_count()
        if threads != 1:
            raise OSError(f"the fork server has {threads} threads; a forked agent would lack {threads - 1} of "
                          "them (set OPENBLAS_NUM_THREADS=1 and run no torch operator before forking)")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.child(request, fds)  # never returns
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.selector.register(pidfd, selectors.EVENT_READ, pid)
        self.send({"op": "spawned", "id": request["id"], "pid": pid}, [pidfd])

    def child(self, request: dict[str, Any], fds: list[int]) -> None:
        code = 1
        try:
            self.selector.close()
            self.sock.close()  # the launcher must see EOF when the server dies, not when its last agent does
            for pidfd in self.children:
                os.close(pidfd)
            stdin, control, stderr = fds
            os.dup2(stdin, 0)
            os.dup2(stderr, 2)
            os.close(stdin)
            os.close(stderr)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if request.get("netns"):
                enter_netns(request["netns"])
            set_title(str(request.get("title", "")))
            from agents.process.agent import AgentSpec, run_process

            code = run_process(AgentSpec.from_json(request["spec"]), control)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - the child's last words go to its stderr, as a fresh process's would
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def on_exit(self, pidfd: int, pid: int) -> None:
        status = exit_status(pidfd)
        self.selector.unregister(pidfd)
        del self.children[pidfd]
        os.close(pidfd)
        try:
            self.send({"op": "exit", "pid": pid, "status": status})
        except OSError:
            pass  # the launcher is gone; the EOF is next

    def shutdown(self) -> int:
        """The launcher is gone: its agents see EOF on stdin and exit; reap them (killing any that linger)."""
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for pidfd in list(self.children):
            remaining = max(0.0, deadline - time.monotonic())
            if not select.select([pidfd], [], [], remaining)[0]:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            exit_status(pidfd)
            os.close(pidfd)
        return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m agents.forkserver")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--models", default="", help="comma-separated models to preload")
    parser.add_argument("--run", default="", help="the run's id, for this process's title")
    parser.add_argument("--title-room", default="", help="padding: the argv memory an agent's title is written into")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides how we stop
    set_title(f"geo-ring fork server (run {args.run})")
    sock = socket.socket(fileno=args.socket_fd)
    return Server(sock).serve([m for m in args.models.split(",") if m])


