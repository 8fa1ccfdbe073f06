"""The agent fork server: torch imported and the weights loaded once, then every agent forked from that.

A fresh agent process spends ~1.5 s on the host (~20 s inside user-mode-linux) importing torch and loading
the shipped weights, and holds its own ~250 MB of them. The launcher instead starts one fork server
(``python -m agents.forkserver``, `server`), which imports the agent's modules and loads the run's models once, and asks
it for each agent: the server forks, and the child enters the stage's network namespace (setns), takes the
descriptors the launcher sent with the request (SCM_RIGHTS) as its stdin, control and stderr, and runs
`agents.process.agent.run_process`. The weights' pages stay shared copy-on-write between the server and every agent.

The launcher's side is `client.ForkServer`; the protocol, its messages and limits are here.

Protocol: one SOCK_SEQPACKET Unix socket pair, one JSON message per packet.
    launcher -> server  {"op": "spawn", "id": N, "spec": AgentSpec JSON, "netns": PATH | null, "title": T}
                        + 3 descriptors: stdin (read end), control (write end), stderr (write end)
    server -> launcher  {"op": "training"}   the recipe changed since the weights shipped: training first (no deadline)
                        {"op": "ready", "pid": P, "preload_s": S}                       once, after preloading
                        {"op": "spawned", "id": N, "pid": P} + 1 descriptor: a pidfd of the agent
                        {"op": "failed", "id": N, "message": M}                         the fork did not happen
                        {"op": "exit", "pid": P, "status": S}   S as subprocess reports it (-signal if killed)
    EOF on either side: the other is gone. The server then waits for its agents (they see EOF on their stdin,
    whose write end only the launcher holds) and exits; the launcher fails the run ("the fork server died").

Fork safety: the server must be single-threaded when it forks (a thread does not exist in the child, and a
lock it held stays held). It runs no torch operator before forking, sets torch's intra-op threads to 1, and
is started with OPENBLAS_NUM_THREADS=1 (numpy's OpenBLAS otherwise starts a worker thread at import); it counts
its threads before every fork and refuses with that count rather than fork a child that could deadlock.
Nothing that came off the socket is unpickled: requests are JSON, the spec is parsed by AgentSpec.from_json.

An agent's process title (`ps`, `pgrep -f`) is rewritten in place to "geo-ring agent STAGE NAME (run ID)": the
server's command line carries room for it (a child shares the server's argv memory until it writes its own).
"""

from __future__ import annotations

import array
import json
import socket
from typing import Any

FDS_PER_SPAWN = 3  # stdin, control, stderr
MAX_MESSAGE = 1 << 20
TITLE_ROOM = 160  # bytes of the server's argv an agent's title may take
SHUTDOWN_GRACE_S = 5.0  # launcher gone: its agents see EOF on stdin and exit; any still here after this are killed
SINGLE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1"}
PRELOAD_MODULES = ("agents.process.agent", "agents.process.head")  # and every decode mode's runner (agents.modes.MODES)
UNKNOWN_STATUS = 255  # an agent's exit once the fork server (its parent, the one that reaps it) is gone
STOP_GRACE_S = 0.8  # a server that failed to start: stopped within ~2 x this
ORPHAN_POLL_S = 0.01  # how often the launcher looks for the exit of an agent whose server is gone (teardown only)

# ----------------------------------------------------------------------------------------------------
# messages: JSON plus descriptors on a SOCK_SEQPACKET socket

def fds_message(fds: list[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []


def fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data.decode("utf-8"))
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ValueError(f"not a fork-server message: {data[:80]!r}")
    return message


ANCILLARY_SPACE = socket.CMSG_SPACE(4 * FDS_PER_SPAWN)


