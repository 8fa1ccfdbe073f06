"""The echo mode's own [decode] key, echo_stride: which prompt bytes its laps carry (checked by its rule)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.settings import ModeSettings, SettingError, between, setting

MAX_STRIDE = 8


@dataclass(frozen=True)
class EchoSettings(ModeSettings):
    """Every echo_stride-th prompt byte goes around the ring (1: every byte)."""

    echo_stride: int = setting(1, between(1, MAX_STRIDE, integer=True))

    def check(self) -> None:
        if self.echo_stride & (self.echo_stride - 1):  # a cross-check of the mode's own, beside the rule's range
            raise SettingError("echo_stride", f"expected a power of two, got {self.echo_stride}")
