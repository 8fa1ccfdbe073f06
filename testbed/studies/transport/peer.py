"""The transport study's peer processes: each end of a link where its stage lives (a namespace: the shaper's
agent_command_prefix), driven by one JSON line a transfer on stdin and answering with one on stdout:

    python -m testbed.studies.transport.peer receive HOST   ->  Listening; then ReceiveRequest -> Received
    python -m testbed.studies.transport.peer send           ->  SendRequest -> Sent

Both read the box's one clock (CLOCK_MONOTONIC, shared across namespaces), the receiver the kernel's arrival stamp
of each read (netem.userspace.kernel_arrival_receiver), so the receiver's own wake-up is not counted.
"""

from __future__ import annotations

import os
import socket
import sys

import trio

from testbed.core import clock
from testbed.core.channel import LineReader, encode_line
from testbed.core.records import JsonRecord
from testbed.studies.transport.ends import (Listening, Received, ReceiveRequest, Sent, SendRequest, read_all,
                                            write_all)

CONNECT_TIMEOUT_S = 20.0


def _answer(record: JsonRecord) -> None:
    sys.stdout.buffer.write(encode_line(record.to_dict()))
    sys.stdout.flush()


async def receive_main(host: str) -> None:
    from netem.userspace import kernel_arrival_receiver

    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.bind((host, 0))
    sock.listen()
    listener = trio.SocketListener(sock)
    _answer(Listening(sock.getsockname()[1]))
    lines = LineReader(trio.lowlevel.FdStream(os.dup(0)))
    while (line := await lines.receive_json()) is not None:
        request = ReceiveRequest(**line)
        streams = [await listener.accept() for _ in range(request.connections)]
        total, last = await read_all([kernel_arrival_receiver(stream) for stream in streams])
        for stream in streams:
            await stream.aclose()
        _answer(Received(total, last))


async def send_main() -> None:
    lines = LineReader(trio.lowlevel.FdStream(os.dup(0)))
    while (line := await lines.receive_json()) is not None:
        request = SendRequest(**line)
        with trio.fail_after(CONNECT_TIMEOUT_S):
            streams = [await trio.open_tcp_stream(request.host, request.port) for _ in range(request.connections)]
        _answer(Sent(await write_all(streams, request.bytes_each, clock.now)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["receive"]:
        trio.run(receive_main, sys.argv[2])
    else:
        trio.run(send_main)
