"""Prompts of the decode modes: the scenario's text, or a synthetic prompt of exactly P tokens.

The synthetic prompt is a window of a fixed text shipped with the project (text/prompt.txt: a frozen copy of this
package's model source, Python code, the kind of text the models were trained on), so a prompt of P tokens is the
same on every machine and needs no corpus build; it is data, so editing the model's code changes no prompt (and no
recorded token). Stream s of several in flight starts its window at its own offset,
so every stream has its own prompt. A checkpoint's tokenizer (agents.hf) tokenizes the same text: its P tokens
are P of its own tokens.
"""

from __future__ import annotations

import functools
import pathlib

from agents.zoo.configs import BYTES
from testbed.core.decode import DecodeConfig

SOURCE = pathlib.Path(__file__).resolve().parent / "text" / "prompt.txt"
STREAM_STRIDE = 211  # bytes between the windows of consecutive streams


@functools.cache
def _source_ids(vocabulary) -> tuple[int, ...]:
    return tuple(SOURCE.read_bytes()) if vocabulary is BYTES else tuple(vocabulary.encode(SOURCE.read_text()))


def synthetic(n_tokens: int, stream: int = 0, vocabulary=BYTES) -> list[int]:
    """Exactly n_tokens tokens (bytes, or the vocabulary's tokens) of the shipped text, at stream `stream`'s offset."""
    ids = _source_ids(vocabulary)
    if not 0 < n_tokens < len(ids):
        raise ValueError(f"a synthetic prompt needs 0 < tokens < {len(ids)}, got {n_tokens}")
    start = (stream * STREAM_STRIDE) % (len(ids) - n_tokens)
    return list(ids[start:start + n_tokens])


def prompt_window(prompt_tokens: int, block_size: int) -> int:
    """The positions of a synthetic prompt the model computes: all of a prompt that leaves a position to decode, else
    half its context (the rest is emulated: WireConfig.extra_positions, testbed.deploy.rules)."""
    return prompt_tokens if prompt_tokens < block_size else block_size // 2


def prompt_ids(config: DecodeConfig, model, stream: int = 0) -> list[int]:
    """The prompt a mode starts stream `stream` from, in `model`'s tokens (model.vocabulary: the bytes, or a
    checkpoint's tokenizer): at most half the context, so decoding has room."""
    if config.prompt_tokens > 0:  # past the context: its last half-context window (the rest is emulated: WireConfig)
        window = prompt_window(config.prompt_tokens, model.config.block_size)
        return synthetic(window, stream, model.vocabulary)
    return model.vocabulary.encode(config.prompt)[-(model.config.block_size // 2):]
