"""The run's headline predictions from its running aggregates: the one owner of "predicted" (O(1) per call)."""

from __future__ import annotations

from testbed.core import physics
from testbed.run.modes.speculative_metrics import SpecRounds
from testbed.run.modes.streams_metrics import StreamsWindow
from testbed.run.runlog import RunLog


def wall_tok_s(log: RunLog) -> float | None:
    """r = 1 / (C + T_ring): measured mean C of the decode laps, configured T_ring (seed 000, Eq. 2), plus, on
    rate-limited links, each hop's bytes at its rate (Eq. 1; 0 on unlimited links)."""
    compute = log.mean_compute_s
    return physics.wall_rate(compute, log.scenario.t_ring_s + log.serialization_s) if compute is not None else None


def spec_tok_s(log: RunLog) -> float | None:
    """r_spec = Gamma / (K c_d + C + T_ring) with the measured Gamma, K c_d and C (seed 000, Eq. 7)."""
    rounds = spec_rounds(log)
    if not rounds.rounds:
        return None
    n = rounds.rounds
    return (rounds.tokens / n) / (rounds.draft_s_sum / n + rounds.compute_s_sum / n + log.scenario.t_ring_s
                                  + log.serialization_s)


def spec_rounds(log: RunLog) -> SpecRounds:
    """The run log's speculation rounds (its SpecRounds part)."""
    return log.parts[SpecRounds.name]


def predicted_tok_s(log: RunLog) -> float | None:
    """The headline prediction: the speculative rate once there are rounds, else the wall."""
    spec = spec_tok_s(log)
    return spec if spec is not None else wall_tok_s(log)


def streams_rates(log: RunLog, window: StreamsWindow) -> tuple[float, float, list[float]]:
    """(per-stream tok/s, aggregate tok/s, each stage's utilization) of physics.streams_rates for the run's M and
    batching, with the window's measured cost of a forward pass (testbed.run.modes.streams.predicted_rates)."""
    from testbed.run.modes.streams import predicted_rates

    per, aggregate, busy, _ceiling = predicted_rates(log.scenario, list(window.stage_pass_s))
    return per, aggregate, busy
