"""[decode] of a scenario: every key of DecodeConfig checked by its rule (testbed.scenario.config builds the rest)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from agents.modes import MODES, modes_with
from testbed.core.decode import BATCHING, DRAFT_KINDS, K_MAX_BOUND, MAX_STREAMS, MAX_TREE, TREE_POLICIES, DecodeConfig
from testbed.core.errors import ConfigError
from testbed.scenario.validate import number as _number
from testbed.scenario.validate import string as _string

MAX_TOKENS = 100_000
MAX_PROMPT = 131_072  # an emulated prompt (testbed.deploy.rules); without a [geometry], the model's window bounds it


# How each [decode] key is checked: (kind, bounds or choices, scaled by `scale`). Defaults come from DecodeConfig.
_DECODE_RULES: dict[str, tuple[str, tuple, bool]] = {
    "mode": ("choice", (), False),  # choices: MODES, read when checked (a test may register a mode)
    "tokens": ("int", (1, MAX_TOKENS), False),
    "prompt": ("text", (), False),
    "prompt_tokens": ("int", (0, MAX_PROMPT), False),  # past the model's window: [geometry] emulates the rest
    "prefill_chunk": ("int", (0, 256), False),
    "streams": ("int", (1, MAX_STREAMS), False),
    "batching": ("choice", BATCHING, False),
    "temperature": ("number", (0.0, 100.0), False),
    "seed": ("int", (0, None), False),
    "k": ("k", (1, K_MAX_BOUND), False),
    "k_max": ("int", (1, K_MAX_BOUND), False),
    "draft": ("model", DRAFT_KINDS, False),  # or a checkpoint "hf:PATH" (testbed.scenario.model)
    "alpha": ("number", (0.0, 1.0), False),
    "draft_ms": ("number", (0.0, 60_000.0), True),
    "k_sweep": ("k_list", (1, K_MAX_BOUND), False),
    "rounds_per_k": ("int", (1, 100_000), False),
    "min_rounds": ("int", (0, 100_000), False),
    "tree_n": ("int", (1, MAX_TREE), False),
    "tree_k": ("int", (1, 64), False),
    "tree_depth": ("int", (1, 64), False),
    "tree_policy": ("choice", TREE_POLICIES, False),
}


def decode_from_dict(dec: dict, source: str, scale: float = 1.0) -> DecodeConfig:
    """[decode] -> DecodeConfig: every field of the dataclass checked by its rule, defaults from the dataclass."""
    values: dict[str, Any] = {}
    for f in fields(DecodeConfig):
        kind, bounds, scaled = _DECODE_RULES[f.name]
        default = f.default
        key = f"decode.{f.name}"
        if kind == "model":
            from testbed.scenario.model import draft_rule

            value = draft_rule(dec, source)
        elif kind == "choice":
            value = _string(dec, f.name, default, source, "decode", bounds or tuple(MODES))
        elif kind == "text":
            value = _string(dec, f.name, default, source, "decode")
            if not value:
                raise ConfigError("expected a non-empty string", source=source, key=key)
        elif kind == "k" and dec.get(f.name) == "auto":
            value = "auto"
        elif kind == "k_list":
            value = _k_list(dec.get(f.name, list(default)), source, bounds)
        else:
            low, high = bounds
            value = _number(dec, f.name, default, source, "decode", minimum=low, maximum=high,
                            integer=kind in ("int", "k"))
        values[f.name] = value * scale if scaled else value
    if values["streams"] > 1:  # plain decode of several streams in flight is the streams mode (ModeInfo.streams_as)
        streams_as = MODES[values["mode"]].streams_as
        if streams_as is None:
            raise ConfigError(f"decode.mode {values['mode']!r} runs one stream; several streams need mode "
                              f"{' or '.join(map(repr, modes_with('streams_as') + ('streams',)))}", source=source,
                              key="decode.streams")
        values["mode"] = streams_as
    return DecodeConfig(**values)


def _k_list(value: Any, source: str, bounds: tuple[int, int]) -> tuple[int, ...]:
    low, high = bounds
    if not isinstance(value, list) or not all(isinstance(k, int) and not isinstance(k, bool) and low <= k <= high
                                               for k in value):
        raise ConfigError(f"expected an array of integers in [{low}, {high}], got {value!r}", source=source,
                          key="decode.k_sweep")
    return tuple(value)


def parse_k_range(text: str) -> list[int]:
    """'1..24' or '2,4,8' -> a list of K values (for the sweep command)."""
    try:
        if ".." in text:
            low, high = (int(x) for x in text.split(".."))
            values = list(range(low, high + 1))
        else:
            values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(1 <= k <= K_MAX_BOUND for k in values):
        raise ConfigError(f"expected K values like 1..24 or 2,4,8 within [1, {K_MAX_BOUND}], got {text!r}", key="--k")
    return values
