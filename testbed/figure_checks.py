"""The report's input checks: a field of a JSON result is a finite number, a count or a string, or a clear error."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from testbed.core.errors import ConfigError


def check_number(value: Any, source: str, key: str, *, minimum: float | None = None, maximum: float | None = None,
                  positive: bool = False, required: bool = True) -> None:
    if value is None:
        if required:
            raise ConfigError("expected a number, got null", source=source, key=key)
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"expected a finite number, got {value!r}", source=source, key=key)
    if positive and value <= 0:
        raise ConfigError(f"expected a number > 0, got {value!r}", source=source, key=key)
    if minimum is not None and value < minimum:
        raise ConfigError(f"expected a number >= {minimum:g}, got {value!r}", source=source, key=key)
    if maximum is not None and value > maximum:
        raise ConfigError(f"expected a number <= {maximum:g}, got {value!r}", source=source, key=key)


def check_count(value: Any, minimum: int, source: str, key: str, *, required: bool = True) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", source=source, key=key)


def check_text(value: Any, source: str, key: str, choices: Sequence[str] = (), *, empty_ok: bool = False) -> None:
    if choices and value not in choices:
        raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}", source=source, key=key)
    if not isinstance(value, str) or not (value or empty_ok):
        raise ConfigError(f"expected a{'' if empty_ok else ' non-empty'} string, got {value!r}", source=source,
                          key=key)
