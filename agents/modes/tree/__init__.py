"""Tree speculation: a token tree drafted, verified in one lap (seed 001's L(n) and T_lap(n))."""

from __future__ import annotations

from agents.modes.tree.facts import TreeRound, TreeSummary  # noqa: F401  (registered: laps read back get them)
from agents.modes.tree.settings import TreeSettings
from testbed.core.decode import ModeInfo

INFO = ModeInfo("tree", __name__, metric_kind="tree", lap_kind="tree", heads=("entry", "last"),
                greedy_on_last=True, drafts=True, window_counts=(("rounds", "tree"),), summary=TreeSummary,
                summary_field="tree", settings=(TreeSettings,))
