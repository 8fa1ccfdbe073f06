"""The run's headline predictions from its running aggregates: the one owner of "predicted" (O(1) per call)."""

from __future__ import annotations

from testbed.core import physics
from testbed.launch.runlog import RunLog


def wall_tok_s(log: RunLog) -> float | None:
    """r = 1 / (C + T_ring): measured mean C of the decode laps, configured T_ring (seed 000, Eq. 2), plus, on
    rate-limited links, each hop's bytes at its rate (Eq. 1; 0 on unlimited links)."""
    compute = log.mean_compute_s
    return physics.wall_rate(compute, log.scenario.t_ring_s + log.serialization_s) if compute is not None else None


def predicted_tok_s(log: RunLog) -> float | None:
    """The headline prediction: a mode's part of the run log's own once it has one (speculation's r_spec once there
    are rounds), else the wall."""
    for part in log.parts.values():
        predicted = getattr(part, "predicted_tok_s", None)
        rate = predicted(log) if predicted is not None else None
        if rate is not None:
            return rate
    return wall_tok_s(log)
