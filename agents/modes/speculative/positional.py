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

A round's acceptance also depends on how the round before it ended, so the vector of rounds at one K is not the
vector of rounds at another: the share of rounds that start in each way depends on K. The conditional form
(StartAcceptance) makes the start a Markov chain. A round's start state is s = (min(m, cap), full): m the drafts the
round before accepted, full whether that was all it drafted (the round starts on the target's own bonus token) or not
(it starts on a residual token, one the draft under-proposed); the first round of a sequence starts after the
prefill's token, (0, True). Each state has its own vector a^s_i, and with it S^s_i = prod_{j<=i} a^s_j. At K:

    states      R_K = {(min(m, cap), False) : m < K} + {(min(K, cap), True)}
    transition  s -> (min(m, cap), m == K) with P^s_K(m) = S^s_{m-1} - S^s_m for m < K, S^s_{K-1} for m = K
                (S^s_{-1} = 1): the round accepts m drafts
    reward      E[tokens | s] = 1 + sum_{i<K} S^s_i
    Gamma(K)    sum_{s in R_K} pi_K(s) (1 + sum_{i<K} S^s_i), pi_K the stationary distribution of P_K

(renewal-reward: over a long run, tokens over rounds). With cap = 0 it is the two-state chain (two_state_gamma); when
every state has the same vector, pi_K weighs one reward and Gamma(K) is predict_gamma's. a^s_i does not depend on
the K of the round itself (drafts 0..i and their verdicts are the same whether more drafts follow), so rounds at
any K estimate it, but state (m, True) only follows a round that drafted exactly m, and (m, False) one that drafted
more than m: a calibration at one K_cal never sees (m, True) for m < K_cal. Calibrating with K drawn afresh each
round from 1..K_cal observes every state up to K_cal. A state (or a position of it) that no round reached borrows
the vector of its kind (all starts with the same `full`), then that of all rounds.

This module computes from counts only (it is on the modes' ground floor, tests/test_layers.py): running models to
get the rounds is testbed.studies.acceptance's offline calibration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from testbed.core import physics
from testbed.core.jsonrecord import JsonRecord

TAIL_CAP = 0.999  # past the measured positions the vector is extended at its last a_i, kept below 1 (a finite K*)
PREFILL = (0, True)  # the start state of a sequence's first round: after the prefill's token, drawn from the target


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


StartState = tuple[int, bool]  # (drafts the round before accepted, capped; whether it accepted all it drafted)


def start_after(k: int, accepted: int, cap: int) -> StartState:
    """The start state of the round after one that drafted K and accepted `accepted`."""
    return min(accepted, cap), accepted == k


def rounds_by_start(sequences: Iterable[Iterable[tuple[int, int]]], cap: int
                    ) -> dict[StartState, list[tuple[int, int]]]:
    """Rounds, as (K, accepted), grouped by their start state; each sequence is one continuation's rounds in order,
    its first starting after the prefill (PREFILL)."""
    groups: dict[StartState, list[tuple[int, int]]] = {}
    for sequence in sequences:
        state = PREFILL
        for k, kept in sequence:
            groups.setdefault(state, []).append((k, kept))
            state = start_after(k, kept, cap)
    return groups


@dataclass(frozen=True)
class StartAcceptance:
    """Positional acceptance counts for each start state (the module's conditional form), and the predictions."""

    cap: int
    by_start: Mapping[StartState, PositionalAcceptance]

    @classmethod
    def of(cls, sequences: Iterable[Iterable[tuple[int, int]]], cap: int) -> StartAcceptance:
        """The counts of rounds given as sequences of (K, accepted) pairs, in order (rounds_by_start)."""
        if cap < 0:
            raise ValueError(f"StartAcceptance: expected cap >= 0, got {cap}")
        return cls(cap, {state: positional_acceptance(rounds)
                         for state, rounds in rounds_by_start(sequences, cap).items()})

    def pooled(self, full: bool | None = None) -> PositionalAcceptance:
        """The counts of every start (of those with this `full`, if given)."""
        total = PositionalAcceptance((), ())
        for state, counts in sorted(self.by_start.items()):
            if full is None or state[1] == full:
                total = total + counts
        return total

    def vector(self, state: StartState) -> tuple[float, ...]:
        """a^s_i over the positions some round of the state reached, then its kind's, then all rounds'."""
        vector = list(self.by_start[state].vector) if state in self.by_start else []
        for backoff in (self.pooled(state[1]).vector, self.pooled().vector):
            vector += backoff[len(vector):]
        if not vector:
            raise ValueError("StartAcceptance: no rounds")
        return tuple(vector)

    def stationary(self, k: int) -> dict[StartState, float]:
        """pi_K: the share of rounds at K that start in each state of R_K, over a long run."""
        return stationary_starts({state: self.vector(state) for state in states_at(k, self.cap)}, k, self.cap)

    def gamma(self, k: int) -> float:
        """Gamma(K) = sum_s pi_K(s) (1 + sum_{i<K} S^s_i)."""
        return sum(share * predict_gamma(self.vector(state), k) for state, share in self.stationary(k).items())

    def best_k(self, draft_s: float, compute_s: float, t_ring_s: float, k_max: int = 64) -> tuple[int, float]:
        """K* maximizing gamma(K) / (K c_d + C + T_ring) over 1..k_max, with its rate (ties to the smaller K)."""
        rate = lambda k: self.gamma(k) / physics.spec_round_s(k, draft_s, compute_s, t_ring_s)  # noqa: E731
        best = max(range(1, k_max + 1), key=lambda k: (rate(k), -k))
        return best, rate(best)


def states_at(k: int, cap: int) -> list[StartState]:
    """R_K: the start states of rounds at K after the first."""
    return sorted({(min(m, cap), False) for m in range(k)} | {(min(k, cap), True)})


def outcomes(vector: Sequence[float], k: int) -> list[float]:
    """P(the round accepts m drafts) for m = 0..K: S_{m-1} - S_m below K, S_{K-1} at K (S_{-1} = 1)."""
    tail = tail_of(vector)
    survival = list(survival_of(vector))
    while len(survival) < k:
        survival.append(survival[-1] * tail)
    before = [1.0] + survival[:k]
    return [before[m] - before[m + 1] for m in range(k)] + [before[k]]


def stationary_starts(vectors: Mapping[StartState, Sequence[float]], k: int, cap: int) -> dict[StartState, float]:
    """The stationary distribution of the start chain at K over the states given (R_K): pi P = pi, sum pi = 1, by
    Gaussian elimination (a handful of states)."""
    states = sorted(vectors)
    index = {state: n for n, state in enumerate(states)}
    size = len(states)
    # rows: (P^T - I) pi = 0, the last replaced by sum pi = 1
    matrix = [[-1.0 if i == j else 0.0 for j in range(size)] + [0.0] for i in range(size)]
    for j, state in enumerate(states):
        for m, p in enumerate(outcomes(vectors[state], k)):
            matrix[index[start_after(k, m, cap)]][j] += p
    matrix[-1] = [1.0] * size + [1.0]
    for col in range(size):
        pivot = max(range(col, size), key=lambda row: abs(matrix[row][col]))
        if abs(matrix[pivot][col]) < 1e-15:
            raise ValueError(f"stationary_starts: the start chain at K = {k} has no unique stationary distribution")
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        for row in range(size):
            if row != col and matrix[row][col]:
                factor = matrix[row][col] / matrix[col][col]
                matrix[row] = [a - factor * b for a, b in zip(matrix[row], matrix[col])]
    return {state: matrix[n][-1] / matrix[n][n] for n, state in enumerate(states)}


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
