"""Speculative decoding at the entry: K drafted, one lap verifies them, r_spec = Gamma / (K c_d + C + T_ring)."""

from __future__ import annotations

from agents.modes.speculative.facts import SpecRound, SpecSummary  # noqa: F401  (registered: laps read back get them)
from agents.modes.speculative.settings import SpecSettings
from testbed.core.decode import ModeInfo

INFO = ModeInfo("speculative", __name__, metric_kind="speculative", lap_kind="spec", spec_headline=True, drafts=True,
                edge_as="dsd", summary=SpecSummary, summary_field="spec", settings=(SpecSettings,))
