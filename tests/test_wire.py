"""Wire format: round trips, and every malformed field is rejected with a message that names it."""


import dataclasses

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.process import wire
from agents.process.reader import FrameReader
from testbed.core.errors import LinkBroken, WireError
from testbed.core.records import LapRecord


def make_frame(shape=(1, 3, 8), n_stamps=2):
    tensor = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    stamps = tuple(wire.Stamp(i, 1.0 + i, 1.1 + i, 1.2 + i, 1.3 + i, 1.4 + i, 100 + i) for i in range(n_stamps))
    return wire.Frame(wire.Kind.HIDDEN, stream=7, lap=123456789012, pos=42, tensor=tensor, stamps=stamps)


def test_round_trip():
    frame = make_frame()
    data = wire.encode(frame)
    assert len(data) == wire.HEADER.size + 2 * wire.STAMP.size + 3 * 8 * 4
    back = wire.decode(data)
    assert (back.kind, back.stream, back.lap, back.pos) == (wire.Kind.HIDDEN, 7, 123456789012, 42)
    np.testing.assert_array_equal(back.tensor, frame.tensor)
    assert back.stamps == frame.stamps


def test_stamps_travel_packed_and_read_as_stamps():
    """A received frame's stamps stay the bytes they came in: a stage adds its own without unpacking the rest,
    and what it sends on is byte for byte what a tuple of the same stamps encodes to."""
    frame = make_frame(n_stamps=3)
    back = wire.decode(wire.encode(frame))
    assert isinstance(back.stamps, wire.Stamps) and len(back.stamps) == 3
    assert list(back.stamps) == list(frame.stamps) and back.stamps[-1] == frame.stamps[-1]
    assert back.stamps[1:] == frame.stamps[1:]
    extra = wire.Stamp(9, 2.0, 2.1, 2.2, 2.3, 2.4, 500, 4)
    onward = dataclasses.replace(back, stamps=back.stamps + (extra,))
    assert isinstance(onward.stamps, wire.Stamps)
    assert wire.encode(onward) == wire.encode(dataclasses.replace(frame, stamps=frame.stamps + (extra,)))
    assert LapRecord(0, "decode", "plain", 1, 1, 0.0, 1.0, back.stamps, 1.0).stamps == tuple(frame.stamps)
    with pytest.raises(IndexError, match="stamp 3 of 3"):
        back.stamps[3]
    with pytest.raises(WireError, match="not a whole number"):
        wire.Stamps(b"x" * (wire.STAMP.size + 1))


@settings(max_examples=50, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), n_stamps=st.integers(0, 5),
       half=st.booleans())
def test_round_trip_property(shape, n_stamps, half):
    frame = make_frame(tuple(shape), n_stamps)
    if half:
        frame = wire.Frame(frame.kind, tensor=frame.tensor.astype(np.float16), stamps=frame.stamps)
    back = wire.decode(wire.encode(frame))
    np.testing.assert_array_equal(back.tensor, frame.tensor)
    assert back.tensor.dtype == frame.tensor.dtype


def test_empty_frames():
    back = wire.decode(wire.encode(wire.Frame(wire.Kind.PROBE, lap=3)))
    assert back.kind == wire.Kind.PROBE and back.tensor is None and back.lap == 3


def corrupt(data: bytes, field: str, value) -> bytes:
    names = ["magic", "version", "kind", "dtype", "ndim", "stream", "lap", "pos", "flags", "d0", "d1", "d2", "d3",
             "n_stamps", "reserved", "payload_len"]
    fields = list(wire.HEADER.unpack_from(data))
    fields[names.index(field)] = value
    return wire.HEADER.pack(*fields) + data[wire.HEADER.size:]


@pytest.mark.parametrize("field, value, message", [
    ("magic", b"EVIL", "magic"),
    ("version", 9, "version"),
    ("kind", 77, "kind"),
    ("dtype", 9, "dtype"),
    ("ndim", 5, "ndim"),
    ("d3", 4, "past ndim"),
    ("n_stamps", wire.MAX_STAMPS + 1, "stamps"),
    ("payload_len", wire.MAX_PAYLOAD_BYTES + 1, "exceeds"),
    ("payload_len", 8, "does not match shape"),
    ("d1", 1 << 25, "dimension"),
])
def test_malformed_header_is_rejected(field, value, message):
    data = corrupt(wire.encode(make_frame()), field, value)
    with pytest.raises(WireError, match=message):
        wire.decode(data)


def test_truncated_and_unsupported():
    data = wire.encode(make_frame())
    with pytest.raises(WireError, match="short header"):
        wire.decode(data[:10])
    with pytest.raises(WireError, match="header says"):
        wire.decode(data[:-4])
    with pytest.raises(WireError, match="unsupported dtype"):
        wire.encode(wire.Frame(wire.Kind.HIDDEN, tensor=np.zeros(3, dtype=np.int64)))


async def test_reader_reassembles_split_frames():
    send, receive = trio.testing.memory_stream_one_way_pair()
    frames = [make_frame(), wire.Frame(wire.Kind.SHUTDOWN)]
    data = b"".join(wire.encode(f) for f in frames)
    reader = FrameReader(receive)
    with trio.fail_after(5):
        for i in range(0, len(data), 7):  # dribble the bytes in 7-byte pieces
            await send.send_all(data[i:i + 7])
        await send.aclose()
        first, t = await reader.read()
        second, _ = await reader.read()
        assert await reader.read() is None
    np.testing.assert_array_equal(first.tensor, frames[0].tensor)
    assert second.kind == wire.Kind.SHUTDOWN and t > 0


async def test_a_long_burst_comes_out_whole_and_in_order():
    """A burst of 2.5 MiB, in pieces that split headers and bodies, read as a ring's connection reads (read, then
    what is buffered): every frame, in order, byte for byte."""
    frames = [wire.Frame(wire.Kind.HIDDEN, stream=i, lap=7, pos=i, flags=599 - i,
                         tensor=np.full((1, 1, 1024), i, np.float32), stamps=(wire.Stamp(1, i, i, i, i, i, 4, 2),))
              for i in range(600)]
    data = b"".join(wire.encode(f) for f in frames)
    assert len(data) > 2 << 20
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader, got = FrameReader(receive), []
    with trio.fail_after(10):
        for i in range(0, len(data), 100_003):
            await send.send_all(data[i:i + 100_003])
        await send.aclose()
        while (item := await reader.read()) is not None:
            got.append(item[0])
            while (more := reader.read_buffered()) is not None:
                got.append(more[0])
    assert [wire.encode(f) for f in got] == [wire.encode(f) for f in frames]


async def test_reader_rejects_garbage_and_midframe_close():
    send, receive = trio.testing.memory_stream_one_way_pair()
    with trio.fail_after(5):
        await send.send_all(b"X" * wire.HEADER.size)
        with pytest.raises(WireError, match="magic"):
            await FrameReader(receive).read()
    send, receive = trio.testing.memory_stream_one_way_pair()
    with trio.fail_after(5):
        await send.send_all(wire.encode(make_frame())[:-3])
        await send.aclose()
        with pytest.raises(LinkBroken, match="mid-frame"):
            await FrameReader(receive).read()


@pytest.mark.parametrize("codec", ["f32", "f16", "int8-block"])
def test_a_batch_travels_as_one_frame_with_its_rows(codec):
    """A continuous batch's BATCH frame: [B, 1, C] and a row (stream, lap, position) per row, as its stamps say."""
    from testbed.core.decode import WireConfig

    config = WireConfig(codec=codec, block=8)
    x = np.arange(3 * 16, dtype=np.float32).reshape(3, 1, 16) / 7
    rows = wire.batch_rows([5, 0, 9], [70, 71, 1 << 40], [12, 30, 3])
    frame = wire.Frame(wire.Kind.BATCH, tensor=x, rows=rows, stamps=(wire.Stamp(0, 1.0, 1.0, 1.0, 1.0, 1.0),))
    data = wire.encode(frame, config)
    back = wire.decode(data, config)
    assert back.rows.tolist() == [(5, 12, 70), (0, 30, 71), (9, 3, 1 << 40)]
    np.testing.assert_allclose(back.tensor, x, atol=0.05 if codec == "int8-block" else 2e-3)
    assert len(data) == wire.HEADER.size + wire.STAMP.size + wire.payload_bytes(x, config, wire.Kind.BATCH)
    assert wire.payload_bytes(x, config, wire.Kind.BATCH) == (wire.payload_bytes(x, config, wire.Kind.HIDDEN)
                                                              + 3 * wire.ROW.itemsize)


def test_a_batch_frame_s_rows_are_checked():
    x = np.zeros((2, 1, 4), np.float32)
    with pytest.raises(WireError, match="needs its rows"):
        wire.encode(wire.Frame(wire.Kind.BATCH, tensor=x))
    with pytest.raises(WireError, match="needs 2 rows"):
        wire.encode(wire.Frame(wire.Kind.BATCH, tensor=x, rows=wire.batch_rows([1], [1], [1])))
    with pytest.raises(WireError, match="is \\[B <= 1024, T >= 1, C\\]"):
        wire.encode(wire.Frame(wire.Kind.BATCH, tensor=np.zeros((1, 0, 4), np.float32),
                               rows=wire.batch_rows([1], [1], [1])))
    with pytest.raises(WireError, match="HIDDEN frame carries no rows"):
        wire.encode(wire.Frame(wire.Kind.HIDDEN, tensor=x, rows=wire.batch_rows([1, 2], [1, 1], [1, 1])))
    wire.decode(wire.encode(wire.Frame(wire.Kind.BATCH, tensor=x, rows=wire.batch_rows([1, 2], [1, 1], [1, 1]))))
    short = wire.encode(wire.Frame(wire.Kind.HIDDEN, tensor=x))  # ... one without its row table does not
    with pytest.raises(WireError, match="does not match shape"):
        wire.decode(short[:5] + bytes([wire.Kind.BATCH]) + short[6:])


def test_a_batch_frame_carries_an_emulated_geometry_s_bytes_for_each_row():
    """Under a [geometry] a BATCH frame of B rows of T positions carries the geometry's B x T positions (and, for
    prompts at position 0, B times an emulated prompt's extra positions), its rows on top; the receiver checks it."""
    from agents.process.codec import emulated_payload_bytes
    from testbed.core.decode import WireConfig

    geometry = WireConfig(width=4096, value_bytes=2, extra_positions=100)
    x = np.ones((3, 5, 16), np.float32)
    rows = wire.batch_rows([0, 1, 2], [0, 0, 0], [0, 0, 0])
    for pos, extra in ((0, 3 * 100), (9, 0)):
        frame = wire.Frame(wire.Kind.BATCH, pos=pos, tensor=x, rows=rows if pos == 0 else wire.batch_rows(
            [0, 1, 2], [0, 0, 0], [9, 9, 9]))
        data, pad = wire.encode_parts(frame, geometry)
        assert len(data) + pad == (wire.HEADER.size + 3 * wire.ROW.itemsize
                                   + emulated_payload_bytes(15 + extra, geometry))
        assert wire.payload_bytes(x, geometry, wire.Kind.BATCH, pos) == len(data) + pad - wire.HEADER.size
        back = wire.decode(data + bytes(pad), geometry)
        assert back.rows.tolist() == frame.rows.tolist()
