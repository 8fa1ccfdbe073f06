"""Tensor parallelism: every agent a rank, two all-reduces a layer over the links."""

from __future__ import annotations

from agents.modes.tp.facts import TpSummary, TpToken  # noqa: F401  (registered: laps read back get them)
from testbed.core.decode import ModeInfo

INFO = ModeInfo("tp", __name__, metric_kind="tp", every_agent=True, window_counts=(("tokens", "decode"),),
                summary=TpSummary, summary_field="tp")
