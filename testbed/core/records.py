"""Typed records that cross a process boundary: links, stage stamps, laps; each with to_json/from_json."""

from __future__ import annotations

import math

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

Address = tuple[str, int]
R = TypeVar("R")


def _convert(hint: Any, value: Any, where: str) -> Any:
    """value (plain JSON) -> the type `hint` names: nested records, lists/tuples of them, optionals."""
    if value is None:
        return None
    return _converter(hint)(value, where)


@functools.cache
def _converter(hint: Any) -> Callable[[Any, str], Any]:
    """How to turn a JSON value into the type `hint` names, worked out once per hint (a lap record carries a
    stamp per stage: thousands of conversions a lap on a long ring)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        records = [a for a in inner if dataclasses.is_dataclass(a)]
        if records:
            record = records[0]
            return lambda value, where: (record_from_dict(record, value, what=where) if isinstance(value, dict)
                                         else value)
        if len(inner) == 1:
            return _converter(inner[0])
        return lambda value, where: value
    if dataclasses.is_dataclass(hint):
        return lambda value, where: record_from_dict(hint, value, what=where)
    if origin in (list, tuple):
        item = _converter(args[0]) if args else None
        as_tuple = origin is tuple

        def sequence(value: Any, where: str) -> Any:
            if not isinstance(value, list | tuple):
                return value
            if item is None or item is _plain_value:
                return tuple(value) if as_tuple else list(value)
            items = [None if v is None else item(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if as_tuple else items
        return sequence
    return _plain_value


def _plain_value(value: Any, where: str) -> Any:
    return value


def _to_plain(value: Any) -> Any:
    """A record's field as plain data: nested records as dicts, containers copied (what dataclasses.asdict gives,
    without its deep copy of every leaf)."""
    if isinstance(value, JsonRecord):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return type(value)(_to_plain(v) for v in value) if type(value) in (list, tuple) else [
            _to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _required(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)  # type: ignore[misc]


def record_from_dict(cls: type[R], data: dict[str, Any], *, what: str | None = None) -> R:
    """cls(**data) for a (nested) dataclass, with a clear error naming unknown and missing fields."""
    what = what or cls.__name__
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected an object, got {type(data).__name__}")
    hints = _type_hints(cls)
    unknown = sorted(set(data) - set(_field_names(cls)))
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(unknown)}")
    missing = sorted(_required(cls) - set(data))
    if missing:
        raise ValueError(f"{what}: missing field(s) {', '.join(missing)}")
    out = {}
    for key, value in data.items():
        convert = _converter(hints[key])
        out[key] = value if value is None or convert is _plain_value else convert(value, f"{what}.{key}")
    return cls(**out)


class JsonRecord:
    """Mixin: a (nested) dataclass <-> one JSON object; from_json(to_json(x)) == x."""

    def to_dict(self) -> dict[str, Any]:
        return {name: _to_plain(getattr(self, name)) for name in _field_names(type(self))}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return record_from_dict(cls, data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str | bytes):
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class LinkSpec(JsonRecord):
    """One directed link src -> dst of the emulated WAN.

    Any latency matrix is a set of these; a ring is the special case dst = (src + 1) % N.
    """

    src: int
    dst: int
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float = 0.0  # 0 means unlimited
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    @property
    def rate_bytes_s(self) -> float:
        """The link rate in bytes per second; math.inf when unlimited (rate_mbit = 0)."""
        return mbit_to_bytes_s(self.rate_mbit)


BYTES_PER_MBIT = 1e6 / 8  # a rate of 1 Mbit/s (10^6 bits) in bytes per second


def mbit_to_bytes_s(rate_mbit: float) -> float:
    """Mbit/s -> bytes/s; 0 (unlimited) -> math.inf."""
    return rate_mbit * BYTES_PER_MBIT if rate_mbit > 0 else math.inf


# Defaults of the network, each used by the scenario, the shapers and the agents from here.
LOSS_RTO_MS = 200.0  # a lost frame arrives this much later: Linux's minimum TCP retransmission timeout (TCP_RTO_MIN)
LAP_TIMEOUT_S = 120.0  # no frame within this long: a peer or a link is gone (the slowest ring + RTOs is far below)


@dataclass(frozen=True)
class Stamp(JsonRecord):
    """What one stage did with a frame, on the box's monotonic clock (seconds)."""

    stage: int
    recv: float
    compute_start: float
    real_end: float  # the real forward pass ended here
    compute_end: float  # emulated compute (padding) ended here
    send: float
    sent_bytes: int = 0
    batch: int = 1  # frames computed in the same forward pass as this one (continuous batching), this one included


@dataclass(frozen=True)
class HeadTiming(JsonRecord):
    """The entry node's head (LM head + sampler + padding) at the end of a lap."""

    start: float
    real_end: float
    end: float


@dataclass(frozen=True)
class LapRecord(JsonRecord):
    """One traversal of the ring as the entry node saw it: every stage's stamp plus the return arrival.

    `kind` is the lap's role ("prefill", "decode", "probe") and `mode` the decode mode that ran it; `extra`
    carries the mode's own per-lap facts (e.g. a speculation round), read back by that mode's summarizer.
    A key of `extra` that ends in "_s" is a duration in seconds (time_scaled scales it with the stamps).
    """

    lap: int
    kind: str
    mode: str
    n_tok: int  # positions computed in this lap
    tokens: int  # tokens it produced
    start: float
    end: float
    stamps: tuple[Stamp, ...]
    return_recv: float
    head: HeadTiming | None = None
    ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    stream: int = 0  # which of the decode.streams sequences in flight this lap carried

    def __post_init__(self) -> None:
        if not isinstance(self.stamps, tuple):  # a frame's stamps (agents.wire.Stamps, packed): the record's own
            object.__setattr__(self, "stamps", tuple(self.stamps))

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    def hop_latencies_s(self) -> list[float]:
        """One-way latency of ring hop i (stage i -> i+1; the last closes the ring): send stamp to receive stamp."""
        n = len(self.stamps)
        if n < 2:
            return []
        return [(self.stamps[i + 1].recv if i + 1 < n else self.return_recv) - self.stamps[i].send for i in range(n)]

    @property
    def ring_s(self) -> float:
        return sum(self.hop_latencies_s())

    def hop_bytes(self) -> list[int]:
        return [s.sent_bytes for s in self.stamps] if len(self.stamps) > 1 else []

    def stage_compute_s(self) -> list[float]:
        """Per-stage compute of this lap, emulated padding included; the entry's head counts to stage 0."""
        head = (self.head.end - self.head.start) if self.head is not None else 0.0
        return [s.compute_end - s.compute_start + (head if i == 0 else 0.0) for i, s in enumerate(self.stamps)]

    def stage_queue_s(self) -> list[float]:
        """Per-stage queueing: how long the frame waited at each stage before its forward pass started.

        At the entry (stage 0) that is the wait of the returning frame before the head: end - return_recv
        for a mode whose laps end where the entry takes the frame up (the streams mode); 0 otherwise.
        """
        waits = [max(0.0, s.compute_start - s.recv) for s in self.stamps]
        if waits and self.head is None:
            waits[0] = max(0.0, self.end - self.return_recv) if len(self.stamps) > 1 else 0.0
        return waits

    def stage_real_s(self) -> list[float]:
        """Per-stage real forward-pass time of this lap (the entry's front and head)."""
        head = (self.head.real_end - self.head.start) if self.head is not None else 0.0
        return [s.real_end - s.compute_start + (head if i == 0 else 0.0) for i, s in enumerate(self.stamps)]

    @property
    def compute_s(self) -> float:
        return sum(self.stage_compute_s())

    def time_scaled(self, factor: float) -> "LapRecord":
        """This lap on a clock running `factor` times as fast: every stamp and duration multiplied by it.

        A run under time dilation D is recorded on the box's clock; time_scaled(1 / D) gives it back in the
        scenario's own time (testbed.run.dilation).
        """
        if factor == 1.0:
            return self

        def stamp(s: Stamp) -> Stamp:
            return dataclasses.replace(s, recv=s.recv * factor, compute_start=s.compute_start * factor,
                                       real_end=s.real_end * factor, compute_end=s.compute_end * factor,
                                       send=s.send * factor)

        head = None if self.head is None else HeadTiming(self.head.start * factor, self.head.real_end * factor,
                                                          self.head.end * factor)
        extra = {key: value * factor if key.endswith("_s") and isinstance(value, int | float)
                 and not isinstance(value, bool) else value
                 for key, value in self.extra.items()}
        return dataclasses.replace(self, start=self.start * factor, end=self.end * factor,
                                   stamps=tuple(stamp(s) for s in self.stamps), return_recv=self.return_recv * factor,
                                   head=head, extra=extra)
