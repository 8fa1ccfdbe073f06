"""Acceptance per draft position (Sequoia's positional acceptance vector): a_i = P(accept draft i | drafts 0..i-1
accepted), from rounds of the exact rule, and the tokens a round yields at any K predicted from it.

The i.i.d. model Gamma(alpha, K) = (1 - a^(K+1)) / (1 - a) holds a draft's acceptance to one rate at every position;
a trained draft's is not (a draft that has matched the target so far tends to keep matching it), so the i.i.d. form
misses the measured Gamma. The vector does not: the share of rounds that accept drafts 0..i is S_i = prod_{j<=i} a_j
and a round at K yields Gamma(K) = 1 + sum_{i<K} S_i tokens (physics.survival_gamma).

The vector is estimated from (K drafted, accepted) pairs, the facts every round of a speculating mode has
(SpecRound.k, SpecRound.accepted): position i is *reached* by a round that drafted it (K > i) with drafts 0..i-1
accepted, and a_i is the share of the rounds that reached it that accepted it. Rounds at several K pool correctly
(a round at K = 2 says nothing about position 5), unlike the share of all rounds that accepted 0..i.

    rounds = [(8, 3), (8, 0), (8, 8), (4, 4)]
    acceptance = positional_acceptance(rounds)  # acceptance.vector: a_0..a_7; .reached, .accepted: the counts
    predict_gamma(acceptance.vector, 4)  # tokens a round at K = 4 yields

This module computes from counts only (it is on the modes' ground floor, tests/test_layers.py): running models to
get the rounds is testbed.studies.acceptance's offline calibration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from testbed.core import physics
from testbed.core.jsonrecord import JsonRecord

TAIL_CAP = 0.999  # past the measured positions the vector is extended at its last a_i, kept below 1 (a finite K*)


@dataclass(frozen=True)
class PositionalAcceptance(JsonRecord):
    """The counts behind a positional acceptance vector: position i reached in reached[i] rounds (drafted, with drafts
    0..i-1 accepted), and accepted in accepted[i] of them."""

    reached: tuple[int, ...]
    accepted: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.reached) != len(self.accepted):
            raise ValueError(f"PositionalAcceptance: {len(self.reached)} reached counts, {len(self.accepted)} accepted")
        if any(not 0 <= a <= r for a, r in zip(self.accepted, self.reached)):
            raise ValueError(f"PositionalAcceptance: expected 0 <= accepted <= reached, got {self.accepted}, "
                             f"{self.reached}")

    @property
    def positions(self) -> int:
        """Leading positions that some round reached: the vector's length."""
        return next((i for i, r in enumerate(self.reached) if r == 0), len(self.reached))

    @property
    def vector(self) -> tuple[float, ...]:
        """a_i = accepted[i] / reached[i] over the leading positions some round reached."""
        return tuple(a / r for a, r in zip(self.accepted[:self.positions], self.reached[:self.positions]))

    @property
    def standard_errors(self) -> tuple[float, ...]:
        """Each a_i's binomial standard error, sqrt(a (1 - a) / reached)."""
        return tuple(math.sqrt(a * (1 - a) / r) for a, r in zip(self.vector, self.reached))

    @property
    def survival(self) -> tuple[float, ...]:
        """S_i = prod_{j<=i} a_j: the share of rounds at K > i that accept drafts 0..i."""
        return survival_of(self.vector)

    def __add__(self, other: PositionalAcceptance) -> PositionalAcceptance:
        """Counts of two sets of rounds pooled (position by position, the shorter padded with zeros)."""
        n = max(len(self.reached), len(other.reached))
        pad = lambda counts: tuple(counts) + (0,) * (n - len(counts))  # noqa: E731
        return PositionalAcceptance(tuple(map(sum, zip(pad(self.reached), pad(other.reached)))),
                                    tuple(map(sum, zip(pad(self.accepted), pad(other.accepted)))))


def positional_acceptance(rounds: Iterable[tuple[int, int]]) -> PositionalAcceptance:
    """The counts (and so the vector) of rounds given as (K drafted, drafts accepted) pairs."""
    reached: list[int] = []
    accepted: list[int] = []
    for k, kept in rounds:
        if not 0 <= kept <= k:
            raise ValueError(f"positional_acceptance: a round of K = {k} cannot accept {kept} drafts")
        if k > len(reached):
            reached += [0] * (k - len(reached))
            accepted += [0] * (k - len(accepted))
        for i in range(min(kept + 1, k)):  # positions 0..kept reached (kept < K: the rejected one too)
            reached[i] += 1
            accepted[i] += int(i < kept)
    return PositionalAcceptance(tuple(reached), tuple(accepted))


def survival_of(vector: Sequence[float]) -> tuple[float, ...]:
    """S_i = prod_{j<=i} a_j."""
    return tuple(math.prod(vector[:i + 1]) for i in range(len(vector)))


def tail_of(vector: Sequence[float], alpha: float | None = None) -> float:
    """The rate to extend a vector with past its last position: its last a_i (else `alpha`), capped at TAIL_CAP."""
    if not vector and alpha is None:
        raise ValueError("tail_of: an empty vector needs an alpha to extend it with")
    return min(vector[-1] if vector else alpha, TAIL_CAP)


def predict_gamma(vector: Sequence[float], k: int, alpha_tail: float | None = None) -> float:
    """Expected tokens a round at K yields, 1 + sum_{i<K} S_i, from the positional vector (positions past its end
    at `alpha_tail`, default its last a_i: tail_of)."""
    return physics.survival_gamma(list(survival_of(vector)), k, tail_of(vector, alpha_tail))


def two_state_gamma(after_residual: Sequence[float], after_target: Sequence[float], k: int) -> float:
    """Expected tokens a round at K yields when acceptance depends on how the round before ended: a round that starts
    after a residual token (the last round rejected a draft) has one vector, a round that starts after a token drawn
    from the target's own p (the bonus of a round that accepted all K, or the prefill's) another. The start is a
    two-state Markov chain, from state s to "after the target" with probability S^s_{K-1} (all K accepted); Gamma(K)
    is the mean of each state's 1 + sum_{i<K} S^s_i under its stationary distribution (renewal-reward: tokens over
    rounds). A state with no vector takes the other's."""
    after_residual = after_residual or after_target
    after_target = after_target or after_residual
    all_accepted = {name: physics.survival_gamma(list(survival_of(v)), k, tail_of(v))
                    - physics.survival_gamma(list(survival_of(v)), k - 1, tail_of(v))
                    for name, v in (("residual", after_residual), ("target", after_target))}
    # stationary share of rounds that start after the target's token: f_r / (1 - f_t + f_r)
    denominator = 1.0 - all_accepted["target"] + all_accepted["residual"]
    share = all_accepted["residual"] / denominator if denominator > 0 else 1.0
    return (1 - share) * predict_gamma(after_residual, k) + share * predict_gamma(after_target, k)


def best_k(vector: Sequence[float], draft_s: float, compute_s: float, t_ring_s: float, k_max: int = 64,
           alpha_tail: float | None = None) -> tuple[int, float]:
    """K* maximizing predict_gamma / (K c_d + C + T_ring) over 1..k_max, with its rate (physics.best_k_survival)."""
    return physics.best_k_survival(list(survival_of(vector)), tail_of(vector, alpha_tail), draft_s, compute_s,
                                   t_ring_s, k_max)


def jackknife_se(groups: Sequence[object], statistic: Callable[[Sequence[object]], float]) -> float:
    """The delete-one jackknife standard error of `statistic` over `groups` (e.g. one group of rounds per prompt:
    rounds of one prompt are correlated, prompts are not); 0 for fewer than two groups."""
    n = len(groups)
    if n < 2:
        return 0.0
    leave_out = [statistic([g for j, g in enumerate(groups) if j != i]) for i in range(n)]
    mean = sum(leave_out) / n
    return math.sqrt((n - 1) / n * sum((x - mean) ** 2 for x in leave_out))
