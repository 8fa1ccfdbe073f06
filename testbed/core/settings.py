"""ModeSettings: the base of a decode mode's own keys (its folder's settings.py: [decode], or a table of its own such
as [workload]), each field with its rule."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.core.jsonrecord import JsonRecord, field_names, record_from_dict


@dataclass(frozen=True)
class Rule:
    """What a [decode] key of a mode's settings may hold, checked where a scenario is loaded
    (testbed.scenario.decode): a number in [low, high] (an integer if `integer`; one of `words` instead, as
    decode.k = "auto"), one of `choices`, (`listed`) an array of integers in [low, high], or (`text`) any string (a
    path: workload.trace)."""

    low: float | None = None
    high: float | None = None
    integer: bool = False
    words: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    listed: bool = False
    text: bool = False


def between(low: float, high: float | None = None, *, integer: bool = False, words: tuple[str, ...] = ()) -> Rule:
    return Rule(low=low, high=high, integer=integer, words=words)


def one_of(*choices: str) -> Rule:
    return Rule(choices=choices)


def integers(low: int, high: int) -> Rule:
    return Rule(low=low, high=high, integer=True, listed=True)


def text() -> Rule:
    return Rule(text=True)


def setting(default: Any, rule: Rule) -> Any:
    """A field of a mode's settings: its default (the one place it lives) and the rule its [decode] key obeys."""
    return dataclasses.field(default=default, metadata={"rule": rule})


class SettingError(ValueError):
    """A mode's own check (ModeSettings.check) refused its settings: `key` is the key of its table to blame."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class ModeSettings(JsonRecord):
    """A decode mode's own keys, typed: a mode declares a frozen subclass in its folder (settings.py), every field
    made with setting(default, rule), and names it on its card (ModeInfo.settings). The keys are in [decode]
    (`k = 4`, `tree_n = 16`), or in the table its TABLE names (the serve mode's [workload]: `rate = 2.0`, named
    workload.rate in errors); DecodeConfig carries one instance of every registered mode's settings, read with
    decode.settings(TheClass). A subclass registers by its class name, so DecodeConfig read back from JSON gets its
    settings back as that class (as LapFacts does). A field whose name ends in "_ms" is a duration: time dilation
    and [scenario] scale multiply it (a subclass whose durations are named otherwise overrides time_scaled)."""

    TYPES: ClassVar[dict[str, type[ModeSettings]]] = {}
    TABLE: ClassVar[str] = "decode"  # the scenario's table its keys are in

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ModeSettings.TYPES[cls.__name__] = cls

    def check(self) -> None:
        """The mode's checks across its fields (each field's own rule is checked first): raise SettingError."""

    def fixed_decode(self) -> dict[str, Any]:
        """[decode] keys of DecodeConfig's own that its mode runs with only (the serve mode: batching =
        "continuous"): set where the table leaves them out, an error naming the key where it says otherwise."""
        return {}

    def cache_slots(self) -> int:
        """Cache slots its mode's stages keep beyond the positions (a token tree's nodes), where this is its mode's."""
        return 0

    def time_scaled(self, factor: float) -> ModeSettings:
        return dataclasses.replace(self, **{name: getattr(self, name) * factor for name in field_names(type(self))
                                            if name.endswith("_ms")})

    def to_dict(self) -> dict[str, Any]:
        return {"settings": type(self).__name__, **super().to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModeSettings:
        """Its JSON object -> the class it names (registered on import of its mode's card); unknown: an error."""
        if not isinstance(data, dict):
            raise ValueError(f"DecodeConfig.mode_settings: expected an object, got {type(data).__name__}")
        name = data.get("settings")
        if name not in ModeSettings.TYPES:
            raise ValueError(f"DecodeConfig.mode_settings: settings {name!r} is not one of "
                             f"{', '.join(sorted(ModeSettings.TYPES))} (its mode's card is not imported)")
        return record_from_dict(ModeSettings.TYPES[name], {k: v for k, v in data.items() if k != "settings"},
                                what=f"DecodeConfig.mode_settings ({name})")


def rules(cls: type[ModeSettings]) -> dict[str, tuple[Any, Rule]]:
    """Each key a settings class owns (in its TABLE) -> (its default, its rule)."""
    out = {}
    for f in dataclasses.fields(cls):
        if "rule" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name}: a mode's setting is made with setting(default, rule)")
        out[f.name] = (f.default, f.metadata["rule"])
    return out
