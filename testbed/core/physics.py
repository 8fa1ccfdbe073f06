"""The seed papers' closed forms, as pure functions (seconds, bytes, tokens/s)."""

from __future__ import annotations

import math


def b_hop(n_tok: int, d_model: int, bytes_per_elem: int) -> int:
    """Eq. 1: bytes of the hidden state crossing one pipeline cut."""
    if n_tok < 0 or d_model <= 0 or bytes_per_elem <= 0:
        raise ValueError(f"b_hop needs n_tok >= 0, d_model > 0, bytes_per_elem > 0, got {n_tok}, {d_model}, {bytes_per_elem}")
    return n_tok * d_model * bytes_per_elem


def wall_rate(compute_s: float, t_ring_s: float) -> float:
    """Eq. 2: single-stream decode rate r = 1 / (C + T_ring), tokens/s."""
    lap = compute_s + t_ring_s
    if lap <= 0:
        raise ValueError(f"C + T_ring must be positive, got {lap}")
    return 1.0 / lap


def ttft(prefill_compute_s: float, t_ring_s: float, prompt_bytes_per_hop: float = 0.0,
         bandwidth_bytes_s: float = math.inf, n_hops: int = 1) -> float:
    """Eq. 5: time to first token, C_prefill(P) + T_ring, plus the prompt's serialization over each hop."""
    xmit = 0.0 if math.isinf(bandwidth_bytes_s) else n_hops * prompt_bytes_per_hop / bandwidth_bytes_s
    return prefill_compute_s + t_ring_s + xmit


def gamma(alpha: float, k: int) -> float:
    """Eq. 6: expected tokens per speculation round, (1 - a^(K+1)) / (1 - a)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def spec_round_s(k: int, draft_s: float, compute_s: float, t_ring_s: float) -> float:
    """Eq. 7: one round = K local draft steps + one target traversal."""
    return k * draft_s + compute_s + t_ring_s


def spec_rate(alpha: float, k: int, draft_s: float, compute_s: float, t_ring_s: float) -> float:
    """Eq. 7/boxed: r_spec = Gamma(a, K) / (K c_d + C + T_ring)."""
    return gamma(alpha, k) / spec_round_s(k, draft_s, compute_s, t_ring_s)


def best_k(alpha: float, draft_s: float, compute_s: float, t_ring_s: float, k_max: int = 64) -> tuple[int, float]:
    """K* maximizing r_spec over 1..k_max, with its rate (ties go to the smaller K)."""
    best = max(range(1, k_max + 1), key=lambda k: (spec_rate(alpha, k, draft_s, compute_s, t_ring_s), -k))
    return best, spec_rate(alpha, best, draft_s, compute_s, t_ring_s)


def tp_pp_latency_ratio(n_layers: int, n_nodes: int) -> float:
    """Eq. 8: lower bound of TP/PP critical-path latency per token, 4L/N."""
    if n_layers <= 0 or n_nodes <= 0:
        raise ValueError(f"need n_layers > 0 and n_nodes > 0, got {n_layers}, {n_nodes}")
    return 4.0 * n_layers / n_nodes


def tree_rate(expected_tokens: float, hop_latencies_s: list[float], n_nodes_tree: int, hidden_bytes: int,
              bandwidths_bytes_s: list[float], compute_s: float, return_s: float = 0.0) -> float:
    """Seed 001: tok/s = L(n) / T_lap(n), T_lap = sum[l_i + n s_h / BW_i] + compute(n) + T_return."""
    lap = sum(l + n_nodes_tree * hidden_bytes / bw for l, bw in zip(hop_latencies_s, bandwidths_bytes_s, strict=True))
    return expected_tokens / (lap + compute_s + return_s)


def survival_gamma(survival: list[float], k: int, alpha_tail: float) -> float:
    """Expected tokens per round from a measured survival curve: 1 + sum_{i<K} S_i.

    S_i is the probability that drafts 0..i are all accepted (seed 000's Gamma assumes S_i = a^(i+1), i.i.d.
    rejections; a trained draft's rejections are correlated, so its S_i falls faster or slower than that).
    Past the measured positions the curve is extended i.i.d. at `alpha_tail`: S_i = S_last * a^(i - last).
    """
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    total, last = 1.0, 1.0
    for i in range(k):
        last = survival[i] if i < len(survival) else last * alpha_tail
        total += last
    return total


def best_k_survival(survival: list[float], alpha_tail: float, draft_s: float, compute_s: float, t_ring_s: float,
                    k_max: int = 64) -> tuple[int, float]:
    """K* maximizing survival_gamma / (K c_d + C + T_ring) over 1..k_max, with its rate."""
    def rate(k: int) -> float:
        return survival_gamma(survival, k, alpha_tail) / spec_round_s(k, draft_s, compute_s, t_ring_s)

    best = max(range(1, k_max + 1), key=lambda k: (rate(k), -k))
    return best, rate(best)


def survival_tail(survival: list[float], alpha: float) -> float:
    """Per-position acceptance to extend a measured survival curve with: its last conditional step, else alpha."""
    if len(survival) >= 2 and survival[-2] > 0:
        return min(1.0, survival[-1] / survival[-2])
    return alpha


SURVIVAL_MIN_ROUNDS = 8  # a position's acceptance is trusted from this many rounds that drafted it


def survival_curve(drafted_at: list[int], accepted_at: list[int], min_rounds: int = SURVIVAL_MIN_ROUNDS) -> list[float]:
    """S_i = accepted_at[i] / drafted_at[i] over the leading positions drafted in at least `min_rounds` rounds."""
    curve = []
    for drafted, accepted in zip(drafted_at, accepted_at):
        if drafted < min_rounds:
            break
        curve.append(accepted / drafted)
    return curve
