"""Small formatting rules every dashboard part shares."""

from __future__ import annotations

from testbed.core.summary import RunSummary


def error_style(error_pct: float | None) -> str:
    """Green within 5%, yellow within 15%, red beyond; dim when there is no figure yet."""
    if error_pct is None:
        return "dim"
    size = abs(error_pct)
    return "green" if size < 5 else "yellow" if size < 15 else "bold red"


def stage_names(summary: RunSummary) -> list[str]:
    return list(summary.stage_names) or [f"stage {i}" for i in range(summary.stages)]
