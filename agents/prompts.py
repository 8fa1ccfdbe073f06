"""Prompts of the decode modes: the scenario's text, or a synthetic prompt of exactly P tokens.

The synthetic prompt is a window of a fixed text shipped with the project (this package's model source:
Python code, the kind of text the models were trained on), so a prompt of P tokens is the same on every
machine and needs no corpus build. Stream s of several in flight starts its window at its own offset,
so every stream has its own prompt.
"""

from __future__ import annotations

import functools
import pathlib

from agents.configs import encode as encode_text
from testbed.core.decode import DecodeConfig

SOURCE = pathlib.Path(__file__).resolve().parent / "model.py"
STREAM_STRIDE = 211  # bytes between the windows of consecutive streams


@functools.cache
def _source_ids() -> tuple[int, ...]:
    return tuple(SOURCE.read_bytes())


def synthetic(n_tokens: int, stream: int = 0) -> list[int]:
    """Exactly n_tokens tokens (bytes) of the shipped text, at stream `stream`'s offset."""
    ids = _source_ids()
    if not 0 < n_tokens < len(ids):
        raise ValueError(f"a synthetic prompt needs 0 < tokens < {len(ids)}, got {n_tokens}")
    start = (stream * STREAM_STRIDE) % (len(ids) - n_tokens)
    return list(ids[start:start + n_tokens])


def prompt_ids(config: DecodeConfig, block_size: int, stream: int = 0) -> list[int]:
    """The prompt a mode starts stream `stream` from: at most half the context, so decoding has room."""
    if config.prompt_tokens > 0:
        return synthetic(config.prompt_tokens, stream)
    return encode_text(config.prompt)[-(block_size // 2):]
