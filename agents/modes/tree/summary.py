"""summarize(laps, scenario) -> TreeSummary: a tree-speculation run's L(n) and T_lap(n) against seed 001."""

from __future__ import annotations

import math

import numpy as np

from testbed.core import physics
from testbed.core.records import LapRecord
from agents.modes.tree.facts import TreeSummary
from testbed.scenario.config import Scenario


def hop_rates_bytes_s(sc: Scenario) -> list[float]:
    return [link.rate_bytes_s for link in sc.ring]


def summarize(laps: list[LapRecord], sc: Scenario) -> TreeSummary | None:
    rounds = [lap for lap in laps if lap.kind == "tree"]
    if not rounds:
        return None
    tokens = float(np.mean([lap.tokens for lap in rounds]))
    block = float(np.mean([lap.n_tok for lap in rounds]))  # n + 1: the root and the nodes
    draft = float(np.mean([lap.facts.draft_s for lap in rounds]))
    compute = float(np.mean([lap.compute_s for lap in rounds]))
    per_hop = [float(np.mean(lap.hop_bytes())) for lap in rounds if lap.hop_bytes()]
    bytes_per_hop = float(np.mean(per_hop)) if per_hop else 0.0
    rates = hop_rates_bytes_s(sc)
    hops = [link.delay_ms / 1e3 for link in sc.ring]
    # seed 001: tok/s = L(n) / (sum_i [l_i + n s_h / BW_i] + compute(n) + T_return); the return is hop N here
    predicted = physics.tree_rate(tokens, hops, block, bytes_per_hop / block, rates, compute + draft)
    measured = sum(lap.tokens for lap in rounds) / sum(lap.duration_s for lap in rounds)
    return TreeSummary(
        policy=rounds[0].facts.policy, n=block - 1, rounds=len(rounds), tokens_per_round=tokens,
        lap_ms=float(np.mean([lap.duration_s for lap in rounds])) * 1e3, draft_ms=draft * 1e3, compute_ms=compute * 1e3,
        ring_ms=float(np.mean([lap.ring_s for lap in rounds])) * 1e3,
        serialization_ms=sum(0.0 if math.isinf(r) else bytes_per_hop / r for r in rates) * 1e3,
        bytes_per_hop=bytes_per_hop, depth_mean=float(np.mean([lap.facts.depth for lap in rounds])),
        measured_tok_s=measured, predicted_tok_s=predicted, error_pct=(measured / predicted - 1) * 100)
