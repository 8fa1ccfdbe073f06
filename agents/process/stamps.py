"""A frame's stamps on the wire: one fixed record per stage the frame has passed (agents.process.wire), kept packed as they
came so that a stage adds its own without unpacking the ones before."""

from __future__ import annotations

import struct
from typing import Iterator, Sequence

from testbed.core.errors import WireError
from testbed.core.records import Stamp

STAMP = struct.Struct("<HHIddddd")  # stage u16 | batch u16 | sent_bytes u32 | recv, compute_start, real_end,
#                                     compute_end, send f64 (seconds on the box's one CLOCK_MONOTONIC)


def pack_stamp(s: Stamp) -> bytes:
    return STAMP.pack(s.stage, min(s.batch, 0xFFFF), s.sent_bytes, s.recv, s.compute_start, s.real_end,
                      s.compute_end, s.send)


def unpack_stamp(data: bytes | memoryview, offset: int = 0) -> Stamp:
    stage, batch, sent_bytes, recv, c0, real_end, c1, send = STAMP.unpack_from(data, offset)
    return Stamp(stage, recv, c0, real_end, c1, send, sent_bytes, batch or 1)


class Stamps(Sequence[Stamp]):
    """A received frame's stamps, kept as the bytes they came in: a stage adds its own and sends them on without
    unpacking the ones before (on a ring of n stages a frame carries up to n stamps, so unpacking them at
    every hop made a lap cost O(n^2)). Indexing and iterating unpack; `+ (stamp,)` packs the new one; a
    LapRecord made from them holds a plain tuple."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytes = b"") -> None:
        if len(packed) % STAMP.size:
            raise WireError(f"{len(packed)} bytes of stamps is not a whole number of {STAMP.size}-byte stamps")
        self.packed = bytes(packed)

    def __len__(self) -> int:
        return len(self.packed) // STAMP.size

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return tuple(self)[index]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"stamp {index} of {n}")
        return unpack_stamp(self.packed, (index % n) * STAMP.size)

    def __iter__(self) -> Iterator[Stamp]:
        for offset in range(0, len(self.packed), STAMP.size):
            yield unpack_stamp(self.packed, offset)

    def __add__(self, more: Sequence[Stamp]) -> "Stamps":
        return Stamps(self.packed + packed_stamps(more))

    def __radd__(self, before: Sequence[Stamp]) -> "Stamps":
        return Stamps(packed_stamps(before) + self.packed)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Stamps):
            return self.packed == other.packed
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Stamps({list(self)!r})"


def packed_stamps(stamps: Sequence[Stamp]) -> bytes:
    """The wire bytes of a frame's stamps (those of Stamps as they came)."""
    if isinstance(stamps, Stamps):
        return stamps.packed
    return b"".join(map(pack_stamp, stamps))
