"""Each decode mode's part of the run summary (its totals from the run log's laps), and its part of the run log.

LAP_PARTS: a mode's running aggregate of the laps it cares about, O(1) a lap, with the Prometheus families it
exports. Each is a class with a `name` (its key in RunLog.parts), `__init__(scenario, lap_buckets,
compute_buckets)`, `add(records, compute, decode)` (every lap of the run, a batch of alike laps at a time:
RunLog.add_laps; it keeps those it wants) and
`metrics(logs, current)` (its families over every phase's run log). The run log and the collector loop over
them and name no mode.
"""

from __future__ import annotations

from testbed.run.modes.speculative_metrics import SpecRounds
from testbed.run.modes.streams_metrics import StreamsRecent

LAP_PARTS = (SpecRounds, StreamsRecent)
