"""Checks of raw values, TOML tables (testbed.scenario.config) and JSON results (the report): each error names the source,
the key and what was expected."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, Callable

from testbed.core.errors import ConfigError


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # what TOML writes unquoted


def check_keys(table: dict, allowed: set[str], source: str, where: str) -> None:
    for key in table:
        if key not in allowed:
            shown = key if BARE_KEY.fullmatch(key) else json.dumps(key)  # "" or a control character: quoted, as TOML
            raise ConfigError(f"unknown key; expected one of {', '.join(sorted(allowed))}", source=source,
                              key=f"{where}.{shown}" if where else shown)


def number(table: dict, key: str, default: float, source: str, where: str, *, minimum: float = 0.0,
           maximum: float | None = None, integer: bool = False) -> Any:
    """table[key] (or the default) as a number within [minimum, maximum]: check_number on a TOML table."""
    value = table.get(key, default)
    check_number(value, source, f"{where}.{key}" if where else key, minimum=minimum, maximum=maximum,
                 integer=integer)
    return int(value) if integer else float(value)


def string(table: dict, key: str, default: str, source: str, where: str, choices: tuple[str, ...] = ()) -> str:
    value = table.get(key, default)
    full = f"{where}.{key}" if where else key
    if not isinstance(value, str):
        raise ConfigError(f"expected a string, got {value!r}", source=source, key=full)
    if choices and value not in choices:
        raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}", source=source, key=full)
    return value


def listed(text: str, key: str, what: str, cast: Callable[[str], Any], ok: Callable[[Any], bool]) -> list:
    """A command-line list "a,b,c": each item cast and checked, or a ConfigError naming the option (`key`)."""
    try:
        values = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(ok(v) for v in values):
        raise ConfigError(f"expected {what}, got {text!r}", key=key)
    return values


def check_number(value: Any, source: str, key: str, *, minimum: float | None = None, maximum: float | None = None,
                 positive: bool = False, required: bool = True, null: str = "", integer: bool = False) -> None:
    """The one number check: a finite number (an integer if `integer`) within the bounds given. Null is allowed
    when not `required`, and refused with `null` as the reason when it is; every error names source and key."""
    kind = "an integer" if integer else "a number"
    if value is None:
        if required:
            raise ConfigError(f"expected {kind}, got null{f' ({null})' if null else ''}", source=source, key=key)
        return
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float) or not math.isfinite(value):
        what = f"an integer{f' >= {minimum:g}' if minimum is not None else ''}" if integer else "a finite number"
        raise ConfigError(f"expected {what}, got {value!r}", source=source, key=key)
    if positive and value <= 0:
        raise ConfigError(f"expected {kind} > 0, got {value!r}", source=source, key=key)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = (f"in [{minimum:g}, {maximum:g}]" if minimum is not None and maximum is not None
                 else f">= {minimum:g}" if minimum is not None else f"<= {maximum:g}")
        raise ConfigError(f"expected {kind} {bound}, got {value!r}", source=source, key=key)


def check_count(value: Any, minimum: int, source: str, key: str, *, required: bool = True) -> None:
    """An integer >= minimum (check_number with integer=True)."""
    check_number(value, source, key, minimum=minimum, required=required, integer=True)


def check_text(value: Any, source: str, key: str, choices: Sequence[str] = (), *, empty_ok: bool = False) -> None:
    if choices and value not in choices:
        raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}", source=source, key=key)
    if not isinstance(value, str) or not (value or empty_ok):
        raise ConfigError(f"expected a{'' if empty_ok else ' non-empty'} string, got {value!r}", source=source,
                          key=key)


def record_from(cls: type, data: dict, source: str, what: str) -> Any:
    """A JSON object as the record `cls` (its from_dict), or a ConfigError "not WHAT: ..." naming the source."""
    try:
        return cls.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not {what}: {exc}", source=source) from exc
