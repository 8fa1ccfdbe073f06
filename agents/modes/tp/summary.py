"""summarize(laps, scenario) -> TpSummary: a tensor-parallel run's per-token latency against its prediction."""

from __future__ import annotations

import numpy as np

from agents.modes.tp.facts import TpSummary, TpToken
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.scenario.config import Scenario

# the predicted steady state is averaged over this many tokens (the max-plus system settles within a few)
PREDICT_TOKENS = 24


def link_times_s(sc: Scenario, message_bytes: float) -> dict[tuple[int, int], float]:
    """One all-reduce message's time on every configured link: one-way delay plus its bytes at the link's rate."""
    return {(link.src, link.dst): link.delay_ms / 1e3 + (message_bytes * 8 / (link.rate_mbit * 1e6)
                                                         if link.rate_mbit > 0 else 0.0)
            for link in sc.links}


def predicted_token_s(sc: Scenario, n_layers: int, segment_s: float, head_s: float, message_bytes: float) -> float:
    return physics.tp_token_s(link_times_s(sc, message_bytes), sc.n_stages, n_layers, segment_s, head_s,
                              sc.tp.allreduce, tokens=PREDICT_TOKENS)


def pp_token_s(sc: Scenario) -> float:
    """What pipeline parallelism takes per token on the same links: C + T_ring with the stages' configured compute."""
    return sc.emulated_compute_s + sc.t_ring_s


def summarize(laps: list[LapRecord], sc: Scenario) -> TpSummary | None:
    decode = [lap for lap in laps if lap.kind == "decode" and isinstance(lap.facts, TpToken)]
    if not decode:
        return None
    layers = decode[0].facts.collectives // 2
    durations = np.array([lap.duration_s for lap in decode])
    segment = float(np.mean([lap.facts.segment_s for lap in decode]))
    head = float(np.mean([lap.facts.head_s for lap in decode]))
    messages = float(np.mean([lap.facts.messages for lap in decode]))
    sent = float(np.mean([lap.stamps[0].sent_bytes for lap in decode]))
    predicted = predicted_token_s(sc, layers, segment, head, sent / messages if messages else 0.0)
    measured = float(durations.mean())
    pp = pp_token_s(sc)
    return TpSummary(
        allreduce=sc.tp.allreduce, ranks=sc.n_stages, layers=layers, tokens=len(decode), token_ms=measured * 1e3,
        token_ms_p99=float(np.percentile(durations, 99)) * 1e3, predicted_token_ms=predicted * 1e3,
        error_pct=(measured / predicted - 1) * 100, segment_ms=segment * 1e3, head_ms=head * 1e3,
        comm_ms=float(np.mean([lap.facts.comm_s for lap in decode])) * 1e3, messages_per_token=messages,
        bytes_per_token=sent, pp_predicted_token_ms=pp * 1e3, ratio_predicted=predicted / pp,
        ratio_bound=physics.tp_pp_latency_ratio(layers, sc.n_stages))
