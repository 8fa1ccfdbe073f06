"""The echo mode's part of RunSummary: summarize(laps, scenario) -> EchoSummary, from its laps' typed facts."""

from __future__ import annotations

from tests.echo_mode.facts import Echoed, EchoSummary


def summarize(laps, scenario) -> EchoSummary | None:
    positions = [lap.facts.position for lap in laps if isinstance(lap.facts, Echoed)]
    return EchoSummary(len(positions), min(positions), max(positions)) if positions else None
