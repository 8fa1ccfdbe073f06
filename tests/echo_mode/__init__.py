"""A decode mode sketched for the mode seam's tests, one folder: it feeds the prompt back one byte per lap
(teacher forcing). Its card (INFO) is the one registry line a test adds to agents.modes.MODES; its runner runs on
the agents, its facts travel with its laps, and its run-log part (metrics.PART) exports its own family,
its summary part is a field of RunSummary's JSON of its own, and its own [decode] key (settings.py) is checked by
its own rule (test_settings.py)."""

from __future__ import annotations

from testbed.core.decode import ModeInfo
from tests.echo_mode.facts import Echoed, EchoSummary  # noqa: F401  (registered: laps read back get them)
from tests.echo_mode.settings import EchoSettings

INFO = ModeInfo("echo", __name__, metric_kind="echo", summary=EchoSummary, summary_field="echo",
                settings=(EchoSettings,))
