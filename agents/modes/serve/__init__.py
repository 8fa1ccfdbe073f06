"""Serving: requests arrive (a seeded workload, or the HTTP endpoint), wait in a queue at the entry, and are admitted
into the ring's continuous batch up to its cap; each request's record is the one source of its figures."""

from __future__ import annotations

from agents.modes.serve.facts import ServeLap, ServeSummary  # noqa: F401  (registered: laps read back get them)
from agents.modes.serve.settings import EndpointSettings, ServeSettings, ServeSpecSettings
from agents.modes.serve.workload import check_fits
from testbed.core.decode import DecodeConfig, ModeInfo


def check_context(decode: DecodeConfig, context: int, model: str) -> None:
    """A fixed prompt or output length that cannot fit the model's context, refused where the scenario loads (a run
    with no workload of its own serves its endpoint's requests, which are checked one by one: HTTP 400)."""
    settings = decode.settings(ServeSettings)
    if settings.arrival != "trace" and not settings.requests and not settings.duration_s:
        return
    check_fits(settings.workload(), context, model)


def drafting(decode: DecodeConfig) -> bool:
    return decode.settings(ServeSpecSettings).speculate > 0  # speculation while serving


INFO = ModeInfo("serve", __name__, metric_kind="serve", min_stages=2, streams_as="serve", summary=ServeSummary,
                summary_field="serve", drafts=True, drafting=drafting,
                settings=(ServeSettings, EndpointSettings, ServeSpecSettings), check_context=check_context)
