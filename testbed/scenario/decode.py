"""[decode] of a scenario: DecodeConfig's keys checked by their rules here, each mode's own keys by its settings' (in
[decode], or in the table its settings name: the serve mode's [workload])."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from agents.modes import MODES, mode_settings, modes_with
from agents.modes.speculative.settings import K_MAX_BOUND
from testbed.core.decode import BATCHING, MAX_STREAMS, DecodeConfig
from testbed.core.errors import ConfigError
from testbed.core.settings import ModeSettings, Rule, SettingError, rules
from testbed.scenario.validate import number as _number
from testbed.scenario.validate import string as _string

MAX_TOKENS = 100_000
MAX_PROMPT = 131_072  # an emulated prompt (testbed.deploy.rules); without a [geometry], the model's window bounds it


# How each key of DecodeConfig's own is checked: (kind, bounds or choices, scaled by `scale`). Defaults come from
# DecodeConfig; a mode's own keys (decode.k, decode.tree_n, ...) come with their rules in its settings class.
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
    "draft": ("model", (), False),  # "trained", "calibrated" or a checkpoint "hf:PATH" (testbed.scenario.model)
    "alpha": ("number", (0.0, 1.0), False),
    "draft_ms": ("number", (0.0, 60_000.0), True),
}


def decode_keys() -> set[str]:
    """Every key [decode] may hold: DecodeConfig's own and every registered mode's settings' that live there."""
    return set(_DECODE_RULES) | table_keys("decode")


def settings_tables() -> set[str]:
    """The scenario's tables the registered modes' settings name besides [decode] ([workload])."""
    return {cls.TABLE for cls in mode_settings()} - {"decode"}


def table_keys(table: str) -> set[str]:
    """Every key of `table` that a registered mode's settings own."""
    return {f.name for cls in mode_settings() if cls.TABLE == table for f in fields(cls)}


def decode_from_dict(dec: dict, source: str, scale: float = 1.0, tables: dict[str, dict] | None = None
                     ) -> DecodeConfig:
    """[decode] -> DecodeConfig: every field of the dataclass checked by its rule, defaults from the dataclass, and
    every registered mode's settings from their own keys, in [decode] or in `tables` (its table's raw keys, by
    name: {"workload": {...}}).

    The settings of a table of its own are held where the table is given or the mode is theirs (elsewhere a
    mode reads their defaults): a [decode] section written back from the config (to_section) then holds no key
    of another table."""
    tables = tables or {}
    values: dict[str, Any] = {}
    for f in fields(DecodeConfig):
        if f.name == "mode_settings":
            continue
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
        else:
            low, high = bounds
            value = _number(dec, f.name, default, source, "decode", minimum=low, maximum=high, integer=kind == "int")
        values[f.name] = value * scale if scaled else value
    if values["streams"] > 1:  # plain decode of several streams in flight is the streams mode (ModeInfo.streams_as)
        streams_as = MODES[values["mode"]].streams_as
        if streams_as is None:
            raise ConfigError(f"decode.mode {values['mode']!r} runs one stream; several streams need mode "
                              f"{' or '.join(map(repr, modes_with('streams_as') + ('streams',)))}", source=source,
                              key="decode.streams")
        values["mode"] = streams_as
    own = MODES[values["mode"]].settings
    held = tuple(settings_from_dict(cls, tables.get(cls.TABLE, {}) if cls.TABLE != "decode" else dec, source
                                    ).time_scaled(scale) for cls in mode_settings()
                 if cls.TABLE == "decode" or cls.TABLE in tables or cls in own)
    for settings in held:
        if type(settings) in own:
            for key, value in settings.fixed_decode().items():
                if key in dec and dec[key] != value:
                    raise ConfigError(f"{values['mode']} decode runs with {key} = {value!r} only, got {dec[key]!r}",
                                      source=source, key=f"decode.{key}")
                values[key] = value
    return DecodeConfig(**values, mode_settings=held)


def settings_from_dict(cls: type[ModeSettings], table: dict, source: str) -> ModeSettings:
    """A mode's settings from its table ([decode], or its TABLE's): each of its keys checked by its rule (its default
    where absent), then the mode's own check across them (ModeSettings.check)."""
    values = {name: _setting(table, name, default, rule, source, cls.TABLE)
              for name, (default, rule) in rules(cls).items()}
    settings = cls(**values)
    try:
        settings.check()
    except SettingError as exc:
        raise ConfigError(str(exc), source=source, key=f"{cls.TABLE}.{exc.key}") from exc
    return settings


def _setting(table: dict, name: str, default: Any, rule: Rule, source: str, where: str = "decode") -> Any:
    value = table.get(name, default)
    if rule.listed:
        return _int_list(value, source, (int(rule.low), int(rule.high)), name, where)
    if rule.choices:
        return _string(table, name, default, source, where, rule.choices)
    if rule.text:
        return _string(table, name, default, source, where)
    if isinstance(value, str) and value in rule.words:
        return value
    return _number(table, name, default, source, where, minimum=rule.low, maximum=rule.high, integer=rule.integer)


def _int_list(value: Any, source: str, bounds: tuple[int, int], name: str, where: str = "decode") -> tuple[int, ...]:
    low, high = bounds
    if not isinstance(value, list | tuple) or not all(
            isinstance(k, int) and not isinstance(k, bool) and low <= k <= high for k in value):
        raise ConfigError(f"expected an array of integers in [{low}, {high}], got {value!r}", source=source,
                          key=f"{where}.{name}")
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
