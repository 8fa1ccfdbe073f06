"""The speculative rule is exact: output distribution = target's, calibrated drafts hit the dialled alpha."""

import math

import pytest
import torch

from agents.modes.speculative.runner import KChooser, calibrated_q, overlap, probabilities, sample, verify
from testbed.core import physics

SIGNIFICANCE = 0.001  # every chi-square test below; seeds are fixed, so the outcome is deterministic
Z_SIGNIFICANCE = 3.0902  # standard normal quantile at 1 - SIGNIFICANCE


def chi2_critical(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at 1 - SIGNIFICANCE."""
    return df * (1 - 2 / (9 * df) + Z_SIGNIFICANCE * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: dict, expected: dict, n: int) -> tuple[float, int]:
    cells = [c for c in expected if expected[c] * n >= 5]
    stat = sum((counts.get(c, 0) - expected[c] * n) ** 2 / (expected[c] * n) for c in cells)
    return stat, len(cells) - 1


def random_dist(generator, vocab, sharp=1.0):
    return torch.softmax(torch.randn(vocab, generator=generator, dtype=torch.float64) * sharp, dim=-1)


def test_single_position_output_matches_target():
    g = torch.Generator().manual_seed(1)
    p, q = random_dist(g, 6, 2.0), random_dist(g, 6, 2.0)
    counts, n = {}, 20000
    for _ in range(n):
        x = sample(q, g)
        accepted, nxt = verify([x], [q], [p, p], g)
        first = x if accepted else nxt
        counts[first] = counts.get(first, 0) + 1
    stat, df = chi2(counts, {i: float(p[i]) for i in range(6)}, n)
    assert stat < chi2_critical(df), (stat, df)


def test_multi_token_sequences_match_plain_sampling():
    """A toy Markov target and a different draft: speculative 3-token outputs vs the exact joint distribution."""
    vocab, k, length, n = 3, 2, 3, 20000
    g = torch.Generator().manual_seed(7)
    target = {prev: random_dist(g, vocab, 1.5) for prev in range(vocab)}
    draft = {prev: random_dist(g, vocab, 1.5) for prev in range(vocab)}
    expected = {}
    for a in range(vocab):
        for b in range(vocab):
            for c in range(vocab):
                expected[(a, b, c)] = float(target[0][a] * target[a][b] * target[b][c])
    counts = {}
    for _ in range(n):
        seq = [0]
        while len(seq) < 1 + length:
            drafts, qs = [], []
            for _ in range(k):
                q = draft[(drafts or seq)[-1]]
                drafts.append(sample(q, g))
                qs.append(q)
            context = [seq[-1]] + drafts
            p = [target[context[i]] for i in range(k + 1)]
            accepted, nxt = verify(drafts, qs, p, g)
            seq += drafts[:accepted] + [nxt]
        key = tuple(seq[1:1 + length])
        counts[key] = counts.get(key, 0) + 1
    stat, df = chi2(counts, expected, n)
    assert stat < chi2_critical(df), (stat, df)


def test_greedy_is_token_for_token_target_argmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, generator=g)
    p = [probabilities(row, 0.0) for row in logits]
    best = [int(torch.argmax(row)) for row in logits]
    # right drafts: all accepted, bonus is the argmax of the last row
    assert verify(best[:2], p[:2], p, g) == (2, best[2])
    # a wrong first draft: rejected and replaced by the argmax
    wrong = (best[0] + 1) % 10
    q = [probabilities(logits[1], 0.0), p[1]]
    assert verify([wrong, best[1]], q, p, g) == (0, best[0])


@pytest.mark.parametrize("alpha", [0.6, 0.7, 0.8, 0.9, 0.95])
def test_calibrated_draft_has_the_dialled_acceptance(alpha):
    g = torch.Generator().manual_seed(3)
    for sharp in (0.5, 2.0, 6.0):
        p = random_dist(g, 256, sharp)
        q, eps = calibrated_q(p, alpha)
        assert float(q.sum()) == pytest.approx(1.0)
        assert overlap(p, q) == pytest.approx(alpha, abs=1e-9)
        assert 0 < eps <= 1


def test_calibrated_acceptance_is_alpha_in_practice():
    g = torch.Generator().manual_seed(5)
    alpha, k, rounds = 0.8, 4, 4000
    tokens = 0
    for _ in range(rounds):
        p = [random_dist(g, 50, 2.0) for _ in range(k + 1)]
        qs = [calibrated_q(row, alpha)[0] for row in p[:k]]
        drafts = [sample(q, g) for q in qs]
        accepted, _ = verify(drafts, qs, p, g)
        tokens += accepted + 1
    assert tokens / rounds == pytest.approx(physics.gamma(alpha, k), rel=0.03)


def test_k_chooser():
    fixed = KChooser(fixed=6, k_max=24)
    assert fixed.next_k() == 6
    auto = KChooser(fixed=None, k_max=24)
    assert auto.next_k() == 4  # warm-up
    for _ in range(5):
        auto.observe([0.9] * 4, draft_s=4 * 0.005, k=4, compute_s=1 / 30, ring_s=0.280)
    assert auto.alpha_hat == pytest.approx(0.9)
    assert auto.next_k() == physics.best_k(0.9, 0.005, 1 / 30, 0.280, 24)[0] == 21  # Table 3's K*


def test_k_chooser_trusts_the_measured_survival_over_the_iid_form():
    # Overlap says alpha 0.9, but the draft that misses once keeps missing: rounds accept 2 of 4, or 0.
    auto = KChooser(fixed=None, k_max=24)
    for round_no in range(20):
        auto.observe([0.9] * 4, draft_s=4 * 0.005, k=4, compute_s=1 / 30, ring_s=0.280,
                     accepted=2 if round_no % 5 else 0)
    assert auto.survival() == pytest.approx([0.8, 0.8, 0.0, 0.0])
    assert auto.next_k() == 2  # the i.i.d. form at alpha 0.9 would say 21
