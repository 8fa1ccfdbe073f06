"""Overlapped speculation's own [decode] key (decode.window): OverlapSettings. K and the rounds are speculation's
(SpecSettings: decode.k, decode.min_rounds)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.settings import ModeSettings, between, setting

MAX_WINDOW = 64


@dataclass(frozen=True)
class OverlapSettings(ModeSettings):
    """How many rounds may be on the ring at once, awaiting their verdicts."""

    window: int = setting(4, between(1, MAX_WINDOW, integer=True))  # W: rounds in flight at most
