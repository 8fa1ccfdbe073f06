"""Overlapped speculation: the draft keeps drafting while the ring verifies, up to W rounds in flight."""

from __future__ import annotations

from agents.modes.overlap.facts import OverlapRound, OverlapSummary  # noqa: F401  (registered: laps read back get them)
from agents.modes.overlap.settings import OverlapSettings
from agents.modes.speculative.settings import SpecSettings
from testbed.core.decode import ModeInfo

INFO = ModeInfo("overlap", __name__, metric_kind="overlap", lap_kind="overlap", drafts=True, no_k_sweep=True,
                window_counts=(("rounds", "overlap"),), summary=OverlapSummary, summary_field="overlap",
                settings=(SpecSettings, OverlapSettings))
