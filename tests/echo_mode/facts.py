"""The echo mode's per-lap facts: which prompt byte a lap carried."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.facts import LapFacts


@dataclass(frozen=True)
class Echoed(LapFacts):
    """The `position`-th prompt byte, `byte`, went around the ring."""

    position: int
    byte: int
