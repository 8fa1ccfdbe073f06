"""The hop path's bytes: a frame encoded in pieces is the frame encoded whole, the sender's stamp is rewritten in
place at the write, a vectored write delivers every byte in order, and a reader stamps a frame when its last bytes
came (not after it parsed them)."""

import socket

import numpy as np
import pytest
import trio
import trio.testing

from agents.process import wire
from agents.process.reader import FrameReader
from agents.process.vectored import write_pieces
from testbed.core.decode import WireConfig
from testbed.core.records import Stamp

exact = pytest.mark.exact

GEOMETRY = WireConfig(width=4096, value_bytes=2)  # an emulated 4,096-wide bf16 state: 8 KiB a position, padded


def stamped_frame(width: int = 128, kind: wire.Kind = wire.Kind.HIDDEN, stamps: int = 2) -> wire.Frame:
    x = np.arange(width, dtype=np.float32).reshape(1, 1, width) / 7
    return wire.Frame(kind, 3, 9, 5, 0, x, tuple(Stamp(i, 1.0 + i, 2.0 + i, 3.0 + i, 4.0 + i, 5.0 + i, 612, 1)
                                                 for i in range(stamps)))


@exact
@pytest.mark.parametrize("codec", [None, WireConfig(codec="f16"), WireConfig(codec="int8-block"), GEOMETRY])
@pytest.mark.parametrize("width", [128, 2048, 8192, 262144])  # 612 B, 8 KiB, 32 KiB and 1 MiB frames
def test_a_frame_in_pieces_is_the_frame_encoded_whole(codec, width):
    frame = stamped_frame(width)
    pieces, pad = wire.encode_pieces(frame, codec)
    assert (b"".join(pieces), pad) == wire.encode_parts(frame, codec)
    back = wire.decode(wire.encode(frame, codec), codec)
    assert back.stamps == frame.stamps and back.tensor.shape == frame.tensor.shape


@exact
def test_a_batch_frame_in_pieces_carries_its_rows_before_its_tensor():
    x = np.ones((2, 1, 8), np.float32)
    frame = wire.Frame(wire.Kind.BATCH, tensor=x, rows=wire.batch_rows([1, 2], [7, 8], [3, 4]))
    pieces, _ = wire.encode_pieces(frame)
    assert b"".join(pieces) == wire.encode(frame)
    assert list(wire.decode(b"".join(pieces)).rows["stream"]) == [1, 2]


@exact
def test_an_uncompressed_payload_is_a_view_of_the_tensor_not_a_copy():
    frame = stamped_frame(8192)
    payload = wire.encode_pieces(frame)[0][-1]
    assert np.shares_memory(np.frombuffer(payload, np.float32), frame.tensor)


@exact
def test_restamping_replaces_the_last_send_time_and_nothing_else():
    frame = stamped_frame(stamps=3)
    pieces, _ = wire.encode_pieces(frame)
    pieces[1] = wire.restamped(pieces[1], 99.25)
    back = wire.decode(b"".join(pieces))
    assert back.stamps[:2] == frame.stamps[:2]
    assert back.stamps[2] == Stamp(2, 3.0, 4.0, 5.0, 6.0, 99.25, 612, 1)
    assert wire.restamped(b"", 1.0) == b""


@exact
async def test_a_vectored_write_delivers_every_byte_in_order_through_partial_writes():
    """A 1 MiB frame through a socket whose send buffer is far smaller: sendmsg writes part of it at a time."""
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    frame = stamped_frame(262144)
    pieces, _ = wire.encode_pieces(frame)
    expected = b"".join(pieces)
    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_pieces, trio.SocketStream(a), [*pieces, b"", b"tail"], [wire.zeros(70000)])
        while len(got) < len(expected) + 4 + 70000:
            got += await b.recv(65536)
    assert bytes(got) == expected + b"tail" + bytes(70000)
    a.close(), b.close()


@exact
async def test_on_a_stream_that_is_not_a_socket_the_pieces_go_joined_and_the_zeros_after():
    from testbed.core.transport import memory_connection

    near, far = memory_connection()
    await write_pieces(near, [b"head", memoryview(b"-body")], [wire.zeros(3), wire.zeros(2)])
    got = b""
    while len(got) < 14:
        got += await far.receive_some(100)
    assert got == b"head-body" + bytes(5)


class Chunks:
    """A byte stream that hands out fixed chunks, and a clock that ticks once a read of it: the time a chunk came
    is the tick after it."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.ticks = list(chunks), 0.0

    async def receive(self, max_bytes: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def now(self) -> float:
        self.ticks += 1.0
        return self.ticks


@exact
async def test_a_frame_is_stamped_when_its_last_bytes_came_padding_included():
    frame = stamped_frame(128)
    data, pad = wire.encode_parts(frame, GEOMETRY)
    whole = data + bytes(pad)
    cut = len(whole) // 3
    stream = Chunks([whole[:cut], whole[cut:2 * cut], whole[2 * cut:]])
    reader = FrameReader(None, stream.receive, now=stream.now, codec=GEOMETRY)
    got, received = await reader.read()
    assert received == 3.0  # the third chunk's arrival: the clock is not read again while the frame is parsed
    assert got.stamps == frame.stamps and np.array_equal(got.tensor, frame.tensor)


@exact
async def test_a_burst_s_frames_are_stamped_when_the_read_that_held_them_came():
    frames = [stamped_frame(128, stamps=1), stamped_frame(256, stamps=1)]
    stream = Chunks([b"".join(wire.encode(f) for f in frames)])
    reader = FrameReader(None, stream.receive, now=stream.now)
    first, at = await reader.read()
    second, again = reader.read_buffered()
    assert (at, again) == (1.0, 1.0)
    assert second.tensor.shape == (1, 1, 256) and reader.read_buffered() is None


@exact
async def test_the_relay_s_reused_receive_buffer_hands_out_each_chunk_as_its_own_bytes():
    """kernel_arrival_receiver receives into one buffer: every chunk it returned keeps its bytes after the next
    receive overwrote the buffer, and each arrival is no later than when the relay saw it."""
    from netem.userspace import kernel_arrival_receiver
    from testbed.core import clock

    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    receive = kernel_arrival_receiver(trio.SocketStream(b))
    got = []
    for message in (b"first" * 100, b"second", bytes(range(256)) * 300):
        await a.send(message)
        data = b""
        while len(data) < len(message):
            chunk, arrival = await receive()
            assert arrival <= clock.now()
            got.append(chunk)
            data += chunk
        assert data == message
    assert b"".join(got) == b"first" * 100 + b"second" + bytes(range(256)) * 300
    assert got[0] == b"first" * 100
    a.close(), b.close()


@exact
async def test_a_second_writer_on_a_stream_is_refused_while_the_first_is_under_way():
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = trio.SocketStream(a)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_pieces, stream, [bytes(1 << 20)])  # blocks: nobody reads yet
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await write_pieces(stream, [b"x"])
        got = 0
        while got < 1 << 20:
            got += len(await b.recv(65536))
    await write_pieces(stream, [b"after"])  # the first one done: the stream is free again
    assert await b.recv(10) == b"after"
    a.close(), b.close()
