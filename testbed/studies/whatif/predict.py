"""What a deployment will do, in closed form: decode, TTFT, speculation at K*, streams, and where a token's time goes.

Every figure comes from the scenario alone (the stages' rooflines, the hops' delays and rates, the geometry's bytes
on the wire); nothing here is measured, so the measured run is an independent check of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agents.process import wire
from testbed.scenario.config import Scenario
from testbed.core import physics
from testbed.core.records import JsonRecord
from testbed.core.roofline import Roofline

K_MAX = 32  # speculation: the largest K searched for K*


@dataclass(frozen=True)
class TimeShare(JsonRecord):
    """One part of a decode token's time: a stage's compute, or a link's serialization or propagation."""

    part: str  # "compute", "serialization", "propagation"
    where: str  # the stage's or the link's name
    ms: float
    share: float  # of the whole token time


def frame_bytes(scenario: Scenario, hop: int, n_positions: int) -> int:
    """Bytes of a HIDDEN frame of `n_positions` on ring hop `hop`: header, one stamp per stage passed, payload."""
    codec = scenario.wire
    if codec.width:
        payload = wire.emulated_payload_bytes(n_positions, codec)
    else:
        from agents.zoo.configs import model_config

        payload = wire.payload_bytes(_zeros(n_positions, model_config(scenario.model).n_embd), codec)
    return wire.HEADER.size + (hop + 1) * wire.STAMP.size + payload


def _zeros(n_positions: int, width: int):
    import numpy as np

    return np.zeros((1, n_positions, width), np.float32)


def stage_s(scenario: Scenario, n_tok: int, batch: int, context: float) -> list[float]:
    """Each stage's emulated forward pass (StageConfig.cost_ms), seconds."""
    return [st.cost_ms(n_tok, batch, context) / 1e3 for st in scenario.stages]


def serialization_s(scenario: Scenario, n_positions: int, frames: int = 1) -> list[float]:
    """Each ring hop's serialization of `frames` frames of `n_positions` positions at the hop's rate (0 where
    unlimited)."""
    return [0.0 if math.isinf(link.rate_bytes_s) else frames * frame_bytes(scenario, i, n_positions)
            / link.rate_bytes_s for i, link in enumerate(scenario.ring)]


def lap_s(scenario: Scenario, n_tok: int = 1, batch: int = 1, context: float = 1) -> float:
    """One lap of a block of n_tok positions of `batch` streams (a burst): compute, propagation, serialization."""
    return (sum(stage_s(scenario, n_tok, batch, context)) + scenario.t_ring_s
            + sum(serialization_s(scenario, n_tok, batch)))


def decode_tok_s(scenario: Scenario, prompt_tokens: int, decode_laps: int) -> float:
    """Single-stream decode after a prompt of `prompt_tokens`: decode lap j (j = 1..) feeds one token at position
    P + j - 1 and attends to P + j positions; the rate is laps over their summed time (the wall, Eq. 2, with the
    context's KV reads)."""
    total = sum(lap_s(scenario, 1, 1, prompt_tokens + j) for j in range(1, decode_laps + 1))
    return decode_laps / total


def ttft_s(scenario: Scenario, prompt_tokens: int) -> float:
    """Eq. 5: C_prefill(P) + T_ring + the prompt's hidden state serialized on every hop (one chunk)."""
    return lap_s(scenario, prompt_tokens, 1, prompt_tokens)


def prefill_compute_s(scenario: Scenario, prompt_tokens: int) -> float:
    """Eq. 5's C_prefill(P): every stage's pass over the whole prompt, one after another (the roofline's, past its
    ridge F_tok x P / FLOPS)."""
    return sum(stage_s(scenario, prompt_tokens, 1, prompt_tokens))


def draft_s(draft: Roofline | None, context: float) -> float:
    return draft.seconds(1, 1, context) if draft is not None else 0.0


def spec_at_best_k(scenario: Scenario, alpha: float, draft: Roofline | None, context: float) -> tuple[int, float]:
    """K* and its rate: Gamma(a, K) / (K c_d + lap of K + 1 positions) (Eq. 7, the verification block's own
    compute and bytes), over K = 1..K_MAX."""
    c_d = draft_s(draft, context)
    rates = {k: physics.gamma(alpha, k) / (k * c_d + lap_s(scenario, k + 1, 1, context + k))
             for k in range(1, K_MAX + 1)}
    best = max(rates, key=lambda k: (rates[k], -k))
    return best, rates[best]


def streams_tok_s(scenario: Scenario, streams: int, context: float) -> float:
    """M streams as one continuously batched convoy: M / (sum of the stages' batched passes + T_ring + the burst's
    serialization) (physics.streams_rates, continuous, with the roofline's batched cost)."""
    return streams / lap_s(scenario, 1, streams, context)


def breakdown(scenario: Scenario, context: float) -> tuple[TimeShare, ...]:
    """Where one decode token's time goes, largest first."""
    parts = [("compute", st.name, s) for st, s in zip(scenario.stages, stage_s(scenario, 1, 1, context))]
    names = [f"{scenario.stages[link.src].name} -> {scenario.stages[link.dst].name}" for link in scenario.ring]
    parts += [("propagation", name, link.delay_ms / 1e3) for name, link in zip(names, scenario.ring)]
    parts += [("serialization", name, s) for name, s in zip(names, serialization_s(scenario, 1)) if s > 0]
    total = sum(s for _, _, s in parts)
    shares = [TimeShare(part, where, s * 1e3, s / total) for part, where, s in parts]
    return tuple(sorted(shares, key=lambda x: -x.ms))


def upgrade_first(shares: tuple[TimeShare, ...]) -> str:
    """What to change first, in words: the largest part of a token's time."""
    top = shares[0]
    if top.part == "compute":
        return f"stage {top.where}'s compute ({top.ms:.2f} ms, {top.share:.0%}): more or faster devices there"
    if top.part == "serialization":
        return f"link {top.where}'s bandwidth ({top.ms:.2f} ms, {top.share:.0%}): a faster link or a codec"
    return (f"link {top.where}'s propagation ({top.ms:.1f} ms, {top.share:.0%}): only a closer region, a shorter "
            "ring or fewer laps (speculation) buy it back")
