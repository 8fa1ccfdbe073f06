"""The wire format: a fixed binary header, per-stage timing stamps, then raw little-endian tensor bytes.

Nothing off the wire is ever unpickled or torch.load()ed: every field is checked against fixed
bounds and the payload is reinterpreted as a plain array of a known dtype and shape.

Layout (little-endian)::

    header  (HEADER.size bytes)
      magic b"GRNG" | version u8 | kind u8 | dtype u8 | ndim u8 | stream u32 | lap u64 |
      pos u32 | flags u32 | shape 4 x u32 | n_stamps u16 | block u16 | payload_len u32 | pad_len u32
    stamps  (n_stamps x STAMP.size bytes), one per stage the frame has passed, in order
      stage u16 | batch u16 | sent_bytes u32 | recv f64 | compute_start f64 | real_end f64 |
      compute_end f64 | send f64          (seconds on the box's one CLOCK_MONOTONIC)
    payload (payload_len bytes): the tensor, C order; for int8-block (Petals-style blockwise absmax int8) the
      n int8 values of the flattened tensor, then one float32 scale per `block` consecutive values; a BATCH frame's
      payload starts with its row table (B x ROW: each row's stream, lap and position), the tensor after it
    padding (pad_len zero bytes): an emulated geometry's extra bytes (below)

A codec (WireConfig: "f32", "f16", "int8-block") is chosen per scenario: the sender encodes a float32 hidden
state with it and the receiver gets float32 back (f16 upcast, int8-block dequantized); bytes on the wire
shrink 2x or ~3.9x, at the cost of the rounding the model then sees.

Emulated geometry (a scenario's [geometry], testbed.deploy): a HIDDEN frame stands for the hidden state of a model
`codec.width` wide with `codec.value_bytes` bytes a value, so it carries as many bytes as that state would under
the codec (emulated_payload_bytes): the tiny model's own tensor, then zeros up to that size. Sockets, the relay's
serialization and netem see the real model's sizes; the receiver checks that the padding is exactly what the
frame's shape implies under its own codec, and all zeros, and drops it.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from testbed.core.errors import WireError
from testbed.core.decode import CODECS, MAX_BLOCK, WireConfig
from testbed.core.records import Stamp
from agents.process.stamps import STAMP, Stamps, pack_stamp, packed_stamps, unpack_stamp  # noqa: F401 - re-exported
from agents.process.codec import (dequantize_blocks, emulated_payload_bytes, int8_block_bytes,  # noqa: F401 - re-exported
                          quantize_blocks)

MAGIC = b"GRNG"
VERSION = 2  # 2: pad_len (an emulated geometry's padding)
HEADER = struct.Struct("<4sBBBBIQII4IHHII")
MAX_NDIM = 4
MAX_STAMPS = 1026  # one per stage passed: a ring of testbed.scenario.stages.MAX_STAGES (1024) stages and a separate head
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # a 2000-token prefill of a wide model still fits
MAX_DIM = 1 << 24


class Kind(enum.IntEnum):
    HIDDEN = 1  # hidden state of a block of positions, travelling the ring
    PROBE = 2  # empty frame for the link self-check; every stage stamps and forwards it
    SHUTDOWN = 3  # end of run; every stage forwards it and exits
    KV = 4  # a stage's new K and V entries, shipped to its successor (placement.kv = "ship"); read and dropped
    TOKEN = 5  # sampled token ids (int32), from a separate head's agent to the entry (placement.head = "separate")
    REDUCE = 6  # one message of a tensor-parallel all-reduce (agents.modes.tp): lap = collective, pos = step, stream = chunk
    TREE = 7  # tree speculation: int32 [a, a accepted slots, parents] for the next HIDDEN block (PipelineStage.set_tree)
    DRAFT = 8  # edge speculation (agents.modes.dsd), edge -> entry: int32 [last token, drafts...] at pos; stream = client
    PROBS = 9  # ... and float32 [K, V], the draft's distribution at each drafted position (the exact rule needs it)
    VERDICT = 10  # entry -> edge: int32 [accepted, next token]
    BATCH = 11  # a continuous batch moving on as one frame: float32 [B, T, C], T new positions (one token, or a
    #             prompt) of each of B streams, with `rows` (ROW: each one's stream, lap, first position); its stamps
    #             are the batch's; `pos` is the rows' first (agents.process.batching)


SIDE_KINDS = (Kind.DRAFT, Kind.PROBS)  # frames from edge clients: the entry takes them from a side inbox
PROMPT = 1 << 17  # flags of a DRAFT frame: the ids are a client's prompt (the entry prefills it)
BYE = 1 << 18  # flags of a DRAFT frame: the client is done


ROW = np.dtype([("stream", "<u4"), ("pos", "<u4"), ("lap", "<u8")])  # a BATCH frame's row: 16 bytes
MAX_ROWS = 1024  # rows a BATCH frame may carry: a stage's KV caches (agents.process.stage.PipelineStage.MAX_STREAMS)

BURST_MASK = 0xFFFF  # flags: how many more frames of the same burst follow this one (sent in one write)
NO_SAMPLE = 1 << 16  # flags: a prefill chunk before the last; a separate head returns no token for it


def burst_left(frame: "Frame") -> int:
    """Frames of this frame's burst still to come: a continuous-batching stage waits for them (they are in flight)."""
    return frame.flags & BURST_MASK


class DType(enum.IntEnum):
    NONE = 0
    FLOAT32 = 1
    FLOAT16 = 2
    INT8_BLOCK = 3  # blockwise absmax int8: n int8 values, then ceil(n / block) float32 scales
    INT32 = 4  # token ids


def payload_bytes(tensor: np.ndarray | None, codec: WireConfig | None = None, kind: "Kind | None" = None,
                  pos: int = -1) -> int:
    """Bytes the tensor takes on the wire under `codec` (what a stamp's sent_bytes counts), with an emulated
    geometry's padding when it is a HIDDEN frame's."""
    if tensor is None:
        return 0
    name = codec.codec if codec is not None and tensor.dtype == np.float32 else "f32"
    if name == "int8-block":
        own = int8_block_bytes(tensor.size, codec.block)
    else:
        own = tensor.size * (2 if name == "f16" or tensor.dtype == np.float16 else 4)
    rows = tensor.shape[0] * ROW.itemsize if kind == Kind.BATCH else 0
    return own + rows + pad_bytes(kind, tensor.shape, own, codec, pos)


def pad_bytes(kind: "Kind | None", shape: tuple[int, ...], payload_len: int, codec: WireConfig | None,
              pos: int = -1, flags: int = 0) -> int:
    """The zeros a frame carries after its payload: a HIDDEN frame [..., T, C] under an emulated geometry carries
    the geometry's bytes for its positions (a block at position 0 also for an emulated prompt's extra positions); a
    REDUCE message (a tensor-parallel partial sum, agents.modes.tp, a share of a hidden state) the same share of the
    geometry's; a BATCH frame [B, T, C] the geometry's bytes of its B x T positions (and B prompts' extra
    positions when it starts at 0); a KV frame [2, L, T, C] the K and V of its T positions on the `flags` geometry
    layers its sender holds (at most a stage's share); every other frame none. Never negative: a frame is at least
    its own."""
    if codec is None or not codec.width or not shape or kind not in (Kind.HIDDEN, Kind.REDUCE, Kind.KV, Kind.BATCH):
        return 0
    if kind == Kind.BATCH:  # each row's positions, and an emulated prompt's extra ones where the rows start at 0
        positions = math.prod(shape[:-1]) + (shape[0] * codec.extra_positions if pos == 0 else 0)
        return max(0, emulated_payload_bytes(positions, codec) - payload_len)
    if kind == Kind.KV:
        if len(shape) != 4 or not codec.kv_layer_bytes or not 0 < flags <= max(codec.stage_layers, default=0):
            return 0  # not a geometry's KV frame (its own only): the decoder refuses any padding on it
        return max(0, shape[2] * flags * codec.kv_layer_bytes - payload_len)
    if kind == Kind.REDUCE:
        values = math.prod(shape) * codec.width // codec.own_width if codec.own_width else 0
        return max(0, values * codec.value_bytes - payload_len)
    positions = math.prod(shape[:-1]) + (codec.extra_positions if pos == 0 else 0)
    return max(0, emulated_payload_bytes(positions, codec) - payload_len)


_KINDS = {int(k): k for k in Kind}
_DTYPES = {int(d): d for d in DType}
NUMPY_DTYPES = {DType.FLOAT32: np.dtype("<f4"), DType.FLOAT16: np.dtype("<f2"), DType.INT32: np.dtype("<i4")}
DTYPE_CODES = {np.dtype("float32"): DType.FLOAT32, np.dtype("float16"): DType.FLOAT16, np.dtype("int32"): DType.INT32}


def tree_plan(plan: np.ndarray | None, max_nodes: int, pos: int, cached: int) -> list[int]:
    """A TREE frame's int32 [a, a accepted slots, T parents, T tokens] (PipelineStage.set_tree) checked for a block at
    `pos` of a stream with `cached` slots filled: its parents (the root's -1 first, every other's before it)."""
    if plan is None or plan.dtype != np.int32 or plan.ndim != 1 or plan.size < 3:
        raise WireError(f"a tree plan is int32 [a, a slots, T parents, T tokens], got {plan!r:.80}")
    a = int(plan[0])
    if not 0 <= a <= plan.size - 3 or (plan.size - 1 - a) % 2 or (plan.size - 1 - a) // 2 > max_nodes:
        raise WireError(f"a tree plan of {plan.size} values with a = {a} is not [a, a slots, T <= {max_nodes} "
                        f"parents, T tokens]")
    t = (plan.size - 1 - a) // 2
    slots, parents = plan[1:1 + a].tolist(), plan[1 + a:1 + a + t].tolist()
    if sorted(set(slots)) != slots or any(not pos - a <= s < cached for s in slots) or pos < a:
        raise WireError(f"a tree at position {pos} keeps slots {slots[:8]}: not ascending in {pos - a}..{cached - 1}")
    if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise WireError("a tree plan needs its root first (parent -1) and every other node's parent before it")
    return parents


@dataclass(frozen=True)
class Frame:
    kind: Kind
    stream: int = 0
    lap: int = 0
    pos: int = 0  # sequence position of the block's first token: stages roll their KV cache back to it
    flags: int = 0
    tensor: np.ndarray | None = None
    stamps: Sequence[Stamp] = field(default_factory=tuple)  # a tuple, or Stamps as a frame came off the wire
    rows: np.ndarray | None = None  # a BATCH frame's rows (ROW), one per row of its tensor

    def passed_on(self, tensor: np.ndarray | None, stamp: Stamp) -> "Frame":
        """This frame with `tensor` and one more stamp: built, not dataclasses.replace'd (a continuous batch
        passes hundreds of frames on a forward pass)."""
        return Frame(self.kind, self.stream, self.lap, self.pos, self.flags, tensor, self.stamps + (stamp,), self.rows)


def batch_rows(streams: Sequence[int], laps: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """A BATCH frame's row table."""
    rows = np.empty(len(streams), ROW)
    rows["stream"], rows["lap"], rows["pos"] = streams, laps, positions
    return rows


def _check_batch(kind: "Kind", rows: np.ndarray | None, shape: tuple[int, ...]) -> int:
    """Bytes of a frame's row table: a BATCH frame's [B, T, C] needs B rows (1..MAX_ROWS), no other frame has any."""
    if kind != Kind.BATCH:
        if rows is not None:
            raise WireError(f"a {kind.name} frame carries no rows")
        return 0
    if len(shape) != 3 or shape[1] < 1 or not 1 <= shape[0] <= MAX_ROWS:
        raise WireError(f"a BATCH frame is [B <= {MAX_ROWS}, T >= 1, C], not {shape}")
    if rows is not None and (rows.dtype != ROW or rows.shape != (shape[0],)):
        raise WireError(f"a BATCH frame of {shape[0]} rows needs {shape[0]} rows of {ROW}, got {rows.shape}")
    return shape[0] * ROW.itemsize


def encode(frame: Frame, codec: WireConfig | None = None, flags: int | None = None) -> bytes:
    """Serialize a frame (a float32 tensor under `codec`; `flags` in place of its own); raises WireError for
    anything the decoder would reject."""
    data, pad = encode_parts(frame, codec, flags)
    return data + bytes(pad) if pad else data


def parts_len(parts: list[tuple[bytes, int]]) -> int:
    """Bytes on the wire of frames encoded as (bytes, zeros that follow) parts."""
    return sum(len(data) + pad for data, pad in parts)


def zeros(n: int) -> memoryview:
    """n zero bytes to send as an emulated geometry's padding, without making them (a shared read-only buffer)."""
    global _ZEROS
    if len(_ZEROS) < n:
        _ZEROS = bytes(max(n, 2 * len(_ZEROS)))
    return memoryview(_ZEROS)[:n]


_ZEROS = bytes(PAD_PIECE := 1 << 20)  # a piece of padding per write: a 64 MiB prompt's zeros go in 64 of them


def encode_parts(frame: Frame, codec: WireConfig | None = None, flags: int | None = None) -> tuple[bytes, int]:
    """The frame's header, stamps and payload, and how many zero bytes of padding follow them (sent apart, from
    zeros(), so a 64 MiB emulated prompt is never built in memory). `flags` replace the frame's own (a burst's
    count of frames to follow) without a copy of the frame."""
    pieces, pad = encode_pieces(frame, codec, flags)
    return b"".join(pieces), pad


SEND_FIELD = struct.Struct("<d")  # the last field of a stamp: its send time


def restamped(stamps: bytes, send: float) -> bytes:
    """A frame's packed stamps (encode_pieces' second piece) with the last one's send time replaced: the sender
    stamps the moment it writes, after the encoding."""
    return stamps[:-SEND_FIELD.size] + SEND_FIELD.pack(send) if stamps else stamps


def encode_pieces(frame: Frame, codec: WireConfig | None = None,
                  flags: int | None = None) -> tuple[list[bytes | memoryview], int]:
    """encode_parts' bytes as the pieces they are made of, unjoined ([header, stamps, rows..., payload]: a
    vectored write sends them without a copy; the payload is a view of the tensor where no codec changes it),
    and the padding that follows them."""
    flags = frame.flags if flags is None else flags
    tensor = frame.tensor
    block = 0
    if codec is not None and codec.codec not in CODECS:
        raise WireError(f"unknown codec {codec.codec!r}; expected one of {', '.join(CODECS)}")
    if tensor is not None and codec is not None and tensor.dtype == np.float32 and codec.codec == "f16":
        tensor = tensor.astype(np.float16)
    if tensor is None:
        dtype, shape, payload = DType.NONE, (), b""
    elif codec is not None and tensor.dtype == np.float32 and codec.codec == "int8-block":
        if not 1 <= codec.block <= MAX_BLOCK:
            raise WireError(f"int8-block needs 1 <= block <= {MAX_BLOCK}, got {codec.block}")
        if tensor.ndim > MAX_NDIM:
            raise WireError(f"tensor has {tensor.ndim} dims; at most {MAX_NDIM} allowed")
        q, scales = quantize_blocks(tensor, codec.block)
        dtype, shape, payload, block = DType.INT8_BLOCK, tensor.shape, q.tobytes() + scales.astype("<f4").tobytes(), codec.block
    else:
        if tensor.dtype not in DTYPE_CODES:
            raise WireError(f"unsupported dtype {tensor.dtype}; expected one of {sorted(map(str, DTYPE_CODES))}")
        if tensor.ndim > MAX_NDIM:
            raise WireError(f"tensor has {tensor.ndim} dims; at most {MAX_NDIM} allowed")
        dtype = DTYPE_CODES[tensor.dtype]
        shape = tensor.shape
        payload = memoryview(np.ascontiguousarray(tensor, dtype=NUMPY_DTYPES[dtype]).reshape(-1).view(np.uint8))
    pad = pad_bytes(frame.kind, tuple(shape), len(payload), codec, frame.pos, flags)  # the rows are over it
    pieces = [payload]
    if _check_batch(frame.kind, frame.rows, tuple(shape)):
        if frame.rows is None:
            raise WireError("a BATCH frame needs its rows")
        pieces.insert(0, frame.rows.tobytes())
    payload_len = sum(map(len, pieces))
    if payload_len > MAX_PAYLOAD_BYTES:
        raise WireError(f"payload of {payload_len} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
    if len(frame.stamps) > MAX_STAMPS:
        raise WireError(f"{len(frame.stamps)} stamps exceed the limit of {MAX_STAMPS}")
    dims = list(shape) + [0] * (MAX_NDIM - len(shape))
    return [HEADER.pack(MAGIC, VERSION, int(frame.kind), int(dtype), len(shape), frame.stream, frame.lap, frame.pos,
                        flags, *dims, len(frame.stamps), block, payload_len, pad),
            packed_stamps(frame.stamps), *pieces], pad


@dataclass(frozen=True)
class _Header:
    kind: Kind
    dtype: DType
    shape: tuple[int, ...]
    stream: int
    lap: int
    pos: int
    flags: int
    n_stamps: int
    payload_len: int
    block: int = 0  # int8-block: values per scale
    pad_len: int = 0  # an emulated geometry's zeros after the payload

    @property
    def body_len(self) -> int:
        return self.n_stamps * STAMP.size + self.payload_len + self.pad_len


def decode_header(data: bytes | bytearray | memoryview, codec: WireConfig | None = None) -> _Header:
    """Parse and validate a header; every field is checked before anything is allocated. `codec`: the receiver's
    [wire], whose emulated geometry says how much padding a HIDDEN frame of this shape must carry (none without)."""
    if len(data) < HEADER.size:
        raise WireError(f"short header: {len(data)} of {HEADER.size} bytes")
    (magic, version, kind, dtype, ndim, stream, lap, pos, flags, d0, d1, d2, d3, n_stamps, block,
     payload_len, pad_len) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}; expected {MAGIC!r}")
    if version != VERSION:
        raise WireError(f"unsupported version {version}; expected {VERSION}")
    if (kind := _KINDS.get(code := kind, code)) is code:  # a dict, not Kind(code): a burst decodes hundreds
        raise WireError(f"unknown frame kind {code}")
    if (dtype := _DTYPES.get(code := dtype, code)) is code:
        raise WireError(f"unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise WireError(f"ndim {ndim} exceeds {MAX_NDIM}")
    dims = (d0, d1, d2, d3)
    if any(dims[ndim:]):
        raise WireError(f"shape {dims} has non-zero entries past ndim {ndim}")
    shape = dims[:ndim]
    if ndim and max(shape) > MAX_DIM:
        raise WireError(f"shape {shape} has a dimension over {MAX_DIM}")
    if n_stamps >= MAX_STAMPS:  # every stage adds its stamp before it forwards a frame: leave room for one
        raise WireError(f"{n_stamps} stamps exceed the limit of {MAX_STAMPS - 1} a frame may arrive with")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise WireError(f"payload length {payload_len} exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
    rows_len = _check_batch(kind, None, shape)
    if rows_len and dtype not in (DType.FLOAT32, DType.FLOAT16, DType.INT8_BLOCK):
        raise WireError(f"a BATCH frame carries hidden states, not {dtype.name.lower()}")
    payload_len -= rows_len  # the tensor's own bytes, checked against its shape below
    if dtype == DType.NONE:
        if ndim or payload_len:
            raise WireError(f"dtype none needs ndim 0 and no payload, got ndim {ndim}, {payload_len} bytes")
    elif dtype == DType.INT8_BLOCK:
        if block < 1:
            raise WireError("int8-block payload with block size 0")
        expected = int8_block_bytes(math.prod(shape), block) if ndim else 0  # exact: int64 products wrap
        if ndim == 0 or expected != payload_len:
            raise WireError(f"payload length {payload_len} does not match shape {shape} of int8 blocks of {block} "
                            f"({expected} bytes)")
    else:
        expected = math.prod(shape) * NUMPY_DTYPES[dtype].itemsize if ndim else 0
        if ndim == 0 or expected != payload_len:
            raise WireError(f"payload length {payload_len} does not match shape {shape} of {dtype.name.lower()} "
                            f"({expected} bytes)")
    expected_pad = pad_bytes(kind, shape, payload_len, codec, pos, flags)  # the rows are over the geometry's bytes
    payload_len += rows_len
    if pad_len != expected_pad:  # the geometry bounds a frame: nothing larger than its shape implies gets in
        raise WireError(f"padding of {pad_len} bytes; a {kind.name} frame of shape {shape} carries {expected_pad} under "
                        f"this run's geometry ({codec.width if codec is not None else 0} wide)")
    return _Header(kind, dtype, shape, stream, lap, pos, flags, n_stamps, payload_len, block, pad_len)


def decode_body(header: _Header, body: bytes | bytearray | memoryview) -> Frame:
    """The frame of a header and its body: with its padding, or without it where the reader checked and dropped it."""
    pad_len = header.pad_len
    if pad_len and len(body) == header.body_len - pad_len:  # FrameReader: the padding was checked as it came
        pad_len = 0
    if len(body) != header.body_len - header.pad_len + pad_len:
        raise WireError(f"body is {len(body)} bytes; header says {header.body_len}")
    if pad_len:
        if np.frombuffer(body, np.uint8, offset=header.body_len - pad_len).any():
            raise WireError(f"{pad_len} bytes of padding that are not all zero")
        body = memoryview(body)[:header.body_len - pad_len]
    stamps = Stamps(body[:header.n_stamps * STAMP.size])
    tensor, rows, offset = None, None, header.n_stamps * STAMP.size
    if header.kind == Kind.BATCH:
        rows = np.frombuffer(body, ROW, count=header.shape[0], offset=offset).copy()
        offset += rows.nbytes
    if header.dtype == DType.INT8_BLOCK:
        n = int(np.prod(header.shape, dtype=np.int64))
        q = np.frombuffer(body, dtype=np.int8, count=n, offset=offset)
        scales = np.frombuffer(body, dtype="<f4", offset=offset + n)
        tensor = dequantize_blocks(q, scales, header.block, header.shape)  # a new float32 array
    elif header.dtype != DType.NONE:
        # Copy: the array must own its memory (the receive buffer is reused) and be writable for torch.
        tensor = np.frombuffer(body, dtype=NUMPY_DTYPES[header.dtype], offset=offset).reshape(header.shape).copy()
    return Frame(header.kind, header.stream, header.lap, header.pos, header.flags, tensor, stamps, rows)


def decode(data: bytes, codec: WireConfig | None = None) -> Frame:
    """Decode one whole frame held in memory (tests, tools)."""
    header = decode_header(data, codec)
    if len(data) != HEADER.size + header.body_len:
        raise WireError(f"frame is {len(data)} bytes; header says {HEADER.size + header.body_len}")
    return decode_body(header, memoryview(data)[HEADER.size:])
