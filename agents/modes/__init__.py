"""The decode modes, a folder each (card, facts, settings; runner, summary, metrics), and MODES: one line each.

A new mode is a folder here (or anywhere: tests/echo_mode) with INFO = ModeInfo(...) in its __init__, and its line
below. This module imports the modes' cards and facts only (no torch, no run machinery): ModeInfo.part finds the rest.
"""

from __future__ import annotations

from dataclasses import fields

from agents.modes import dsd, overlap, plain, serve, speculative, streams, tp, tree
from testbed.core.decode import DecodeConfig, ModeInfo
from testbed.core.settings import ModeSettings

MODES: dict[str, ModeInfo] = {mode.INFO.name: mode.INFO for mode in (
    plain,
    speculative,
    streams,
    tree,
    dsd,
    tp,
    serve,
    overlap,
)}


def modes_with(form: str) -> tuple[str, ...]:
    """The modes that have a `form` ("streams_as", "edge_as") of their own, but for that form's own mode."""
    return tuple(name for name, info in MODES.items() if getattr(info, form) not in (None, name))


def decode_lap_kinds() -> tuple[str, ...]:
    """The lap kinds that make decode tokens: every mode's `lap_kind`."""
    return tuple(sorted({info.lap_kind for info in MODES.values()}))


def parts(role: str) -> list:
    """Every registered mode's `role` module (ModeInfo.part) that exists, in registry order."""
    return [module for module in (info.part(role) for info in MODES.values()) if module is not None]


def mode_settings() -> tuple[type[ModeSettings], ...]:
    """Every registered mode's settings classes (ModeInfo.settings), once each, in registry order; two that claim
    one key of a table ([decode], or a mode's own table: ModeSettings.TABLE), or a [decode] key of DecodeConfig's
    own, are an error."""
    classes = tuple(dict.fromkeys(cls for info in MODES.values() for cls in info.settings))
    owner = {("decode", f.name): DecodeConfig.__name__ for f in fields(DecodeConfig)}
    for cls in classes:
        for f in fields(cls):
            if owner.setdefault((cls.TABLE, f.name), cls.__name__) != cls.__name__:
                raise ValueError(f"{cls.TABLE}.{f.name} is claimed by {cls.__name__} and {owner[cls.TABLE, f.name]}")
    return classes


def per_stream(mode: str) -> bool:
    """Laps of this mode keep each stream's tokens and feed the per-stream figures (ModeInfo.per_stream)."""
    info = MODES.get(mode)
    return info is not None and info.per_stream
