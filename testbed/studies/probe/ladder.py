"""The probe's message sizes: a ladder such as `64..32Mi` (64 B, x4 each step, up to and with 32 MiB) or a list
such as `64,4Ki,1Mi`, each size in bytes with an optional binary suffix (Ki, Mi, Gi; K, M, G and a trailing B or iB
mean the same)."""

from __future__ import annotations

import re

from testbed.core.errors import ConfigError

DEFAULT_SIZES = "64..32Mi"
DEFAULT_PING_SIZES = "64"  # the round trip of a small message: what a protocol's extra exchange costs
LADDER_STEP = 4  # a range's sizes grow by this factor (NetPIPE steps by powers of two; x4 keeps the probe short)
MAX_SIZE = 256 * 2 ** 20  # bytes: one message is held in memory at each end
SUFFIXES = {"": 1, "k": 2 ** 10, "ki": 2 ** 10, "m": 2 ** 20, "mi": 2 ** 20, "g": 2 ** 30, "gi": 2 ** 30}
SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?)?\s*(b|ib)?\s*$", re.IGNORECASE)


def parse_size(text: str, key: str = "--sizes") -> int:
    """`64`, `4Ki`, `1MiB`, `32M` -> bytes; a ConfigError naming `key` otherwise."""
    match = SIZE.match(text)
    if not match:
        raise ConfigError(f"expected a size in bytes such as 64, 4Ki or 32Mi, got {text!r}", key=key)
    size = int(match.group(1)) * SUFFIXES[(match.group(2) or "").lower()]
    if not 1 <= size <= MAX_SIZE:
        raise ConfigError(f"expected a size from 1 B to {MAX_SIZE // 2 ** 20} MiB, got {text!r}", key=key)
    return size


def parse_sizes(text: str, key: str = "--sizes") -> tuple[int, ...]:
    """`LO..HI` (LO, LO x 4, ... below HI, then HI) or `A,B,C`: the sizes ascending, each once."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"expected sizes such as {DEFAULT_SIZES} or 64,4Ki,1Mi, got {text!r}", key=key)
    if ".." in text:
        low_text, _, high_text = text.partition("..")
        low, high = parse_size(low_text, key), parse_size(high_text, key)
        if high < low:
            raise ConfigError(f"a range runs from the smaller size to the larger, got {text!r}", key=key)
        sizes = [low]
        while sizes[-1] * LADDER_STEP < high:
            sizes.append(sizes[-1] * LADDER_STEP)
        return tuple(dict.fromkeys([*sizes, high]))
    return tuple(sorted({parse_size(part, key) for part in text.split(",") if part.strip()} or
                        {parse_size(text, key)}))


def parse_ping_sizes(text: str, key: str = "--ping-sizes") -> tuple[int, ...]:
    """The ping-pong's sizes as parse_sizes reads them, or `none`: no round trips measured."""
    if isinstance(text, str) and text.strip().lower() == "none":
        return ()
    return parse_sizes(text, key)


def size_text(size: int) -> str:
    """64 B, 4 KiB, 32 MiB (a size that is not a whole KiB or MiB in bytes)."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"
