"""Typed per-lap facts (LapRecord.facts): LapFacts, the base of each mode's own (agents/modes/*/facts.py); PrefillChunk."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.core.jsonrecord import JsonRecord, field_names, record_from_dict


@dataclass(frozen=True)
class LapFacts(JsonRecord):
    """What a decode mode knows about one of its laps beyond the stamps, typed: a mode declares a subclass for each
    lap it reports (a speculation round, a tree round, a DSD request: its folder's facts.py), and a subclass registers
    by its class name, so a lap read back from JSON gets its facts back as that class. On the wire and in the lap
    log they are the lap's "extra" object: the fields, and "facts", the class name. A field whose name ends in
    "_s" is a duration in seconds (time_scaled scales it with the stamps)."""

    TYPES: ClassVar[dict[str, type[LapFacts]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        LapFacts.TYPES[cls.__name__] = cls

    def draft_time_s(self) -> float:
        """The entry's drafting in this lap before its frame left (it precedes the first hop); 0 if none."""
        return 0.0

    def time_scaled(self, factor: float) -> LapFacts:
        return dataclasses.replace(self, **{name: getattr(self, name) * factor for name in field_names(type(self))
                                            if name.endswith("_s") and getattr(self, name) is not None})

    def to_extra(self) -> dict[str, Any]:
        return {"facts": type(self).__name__, **self.to_dict()}

    @staticmethod
    def from_extra(data: dict[str, Any], what: str = "LapRecord.extra") -> LapFacts:
        """A lap's "extra" object -> its facts, as the class it names; an unknown or missing name is an error."""
        if not isinstance(data, dict):
            raise ValueError(f"{what}: expected an object, got {type(data).__name__}")
        name = data.get("facts")
        if name not in LapFacts.TYPES:
            raise ValueError(f"{what}: facts {name!r} is not one of {', '.join(sorted(LapFacts.TYPES))}")
        return record_from_dict(LapFacts.TYPES[name], {k: v for k, v in data.items() if k != "facts"},
                                what=f"{what} ({name})")


@dataclass(frozen=True)
class PrefillChunk(LapFacts):
    """A chunk of a chunked prefill (agents.process.prefill): the `chunk`-th of `chunks`."""

    chunk: int
    chunks: int
