"""The echo mode's typed facts: which prompt byte a lap carried, and what the run echoed (its RunSummary part)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord


@dataclass(frozen=True)
class Echoed(LapFacts):
    """The `position`-th prompt byte, `byte`, went around the ring."""

    position: int
    byte: int


@dataclass(frozen=True)
class EchoSummary(JsonRecord):
    """The run's echo laps: how many bytes went around, and the first and last position they carried."""

    bytes: int
    first: int
    last: int
