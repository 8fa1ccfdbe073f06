"""JsonRecord: a (nested) dataclass <-> one JSON object, converted by a plan worked out once per type."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any, Callable, TypeVar

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
            read = _reader(records[0])
            return lambda value, where: read(value, where) if isinstance(value, dict) else value
        if len(inner) == 1:
            return _converter(inner[0])
        return lambda value, where: value
    if dataclasses.is_dataclass(hint):
        return _reader(hint)
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


def _reader(cls: type) -> Callable[[Any, str], Any]:
    """How a nested record of type cls is read: its own from_dict where it has one (RunSummary: its modes' parts)."""
    own = getattr(cls, "from_dict", None)
    if own is not None and own.__func__ is not JsonRecord.from_dict.__func__:
        return lambda value, where: own(value)
    return lambda value, where: record_from_dict(cls, value, what=where)


def _plain_value(value: Any, where: str) -> Any:
    return value


_SCALARS = frozenset((int, float, str, bool, type(None)))  # plain as they are: the type checked before anything else


def to_plain(value: Any) -> Any:
    """A record's field as plain data: nested records as dicts, containers copied (what dataclasses.asdict gives,
    without its deep copy of every leaf)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, JsonRecord):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return type(value)(to_plain(v) for v in value) if type(value) in (list, tuple) else [
            to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _required(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)  # type: ignore[misc]


@functools.cache
def _field_set(cls: type) -> frozenset[str]:
    return frozenset(field_names(cls))


@functools.cache
def _nested(cls: type) -> tuple[tuple[str, Callable[[Any, str], Any]], ...]:
    """The fields of cls that are not plain JSON values (records, lists of them), each with its converter."""
    hints = _type_hints(cls)
    return tuple((name, convert) for name in field_names(cls)
                 if (convert := _converter(hints[name])) is not _plain_value)


def record_from_dict(cls: type[R], data: dict[str, Any], *, what: str | None = None) -> R:
    """cls(**data) for a (nested) dataclass, with a clear error naming unknown and missing fields."""
    if not isinstance(data, dict):
        raise ValueError(f"{what or cls.__name__}: expected an object, got {type(data).__name__}")
    keys = data.keys()
    if not keys <= _field_set(cls):
        raise ValueError(f"{what or cls.__name__}: unknown field(s) {', '.join(sorted(keys - _field_set(cls)))}")
    if not _required(cls) <= keys:
        raise ValueError(f"{what or cls.__name__}: missing field(s) {', '.join(sorted(_required(cls) - keys))}")
    nested = _nested(cls)
    if not nested:  # a record of plain values (a stamp): thousands a lap on a long ring
        return cls(**data)
    out = dict(data)
    for key, convert in nested:
        if out.get(key) is not None:
            out[key] = convert(out[key], f"{what or cls.__name__}.{key}")
    return cls(**out)


class JsonRecord:
    """Mixin: a (nested) dataclass <-> one JSON object; from_json(to_json(x)) == x."""

    def to_dict(self) -> dict[str, Any]:
        return {name: to_plain(getattr(self, name)) for name in field_names(type(self))}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return record_from_dict(cls, data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str | bytes):
        return cls.from_dict(json.loads(text))
