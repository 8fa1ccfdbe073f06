"""Serving: requests arrive (a seeded workload, or the HTTP endpoint), wait in a queue at the entry, and are admitted
into the ring's continuous batch up to its cap; each request's record is the one source of its figures."""

from __future__ import annotations

from agents.modes.serve.facts import ServeLap, ServeSummary  # noqa: F401  (registered: laps read back get them)
from agents.modes.serve.settings import EndpointSettings, ServeSettings, ServeSpecSettings
from testbed.core.decode import ModeInfo

INFO = ModeInfo("serve", __name__, metric_kind="serve", min_stages=2, streams_as="serve", summary=ServeSummary,
                summary_field="serve", drafts=True, settings=(ServeSettings, EndpointSettings, ServeSpecSettings))
