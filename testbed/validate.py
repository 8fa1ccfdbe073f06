"""Checks of raw TOML values: each error names the source, the key and what was expected (testbed.config uses them)."""

from __future__ import annotations

import json
import math
import re
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
    value = table.get(key, default)
    full = f"{where}.{key}" if where else key
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise ConfigError(f"expected {kind}, got {value!r}", source=source, key=full)
    if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):  # nan: in no range
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(f"expected {kind} {bound}, got {value!r}", source=source, key=full)
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
