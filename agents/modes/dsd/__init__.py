"""Edge-cloud speculation: edge clients draft, the entry verifies (seeds 002/003); its laps are the edges' rounds."""

from __future__ import annotations

# registered: laps read back get them
from agents.modes.dsd.facts import DsdRequest, DsdRound, DsdSummary, DsdVerify  # noqa: F401
from agents.modes.speculative.settings import SpecSettings  # its edge clients draft K of them
from testbed.core.decode import ModeInfo

INFO = ModeInfo("dsd", __name__, metric_kind="dsd", lap_kind="spec", own_calibration=True,
                window_counts=(("rounds", "spec"),), edge_as="dsd", summary=DsdSummary, summary_field="dsd",
                settings=(SpecSettings,))
