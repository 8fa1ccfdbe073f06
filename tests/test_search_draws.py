"""A speculating candidate's confirmation is a draw (testbed.studies.search.draws): a run of N tokens needs the
rounds lap_law gives (i.i.d. acceptance, the last round's surplus dropped), so its expected rate is below the steady
Gamma a round, and its spread is the rounds' spread; both checked against drawing the rounds directly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from testbed.studies.search.draws import finite_run
from testbed.studies.search.measure import Confirmation
from testbed.studies.search.space import Candidate

pytestmark = pytest.mark.exact


class Spec:
    def __init__(self, tokens: int, alpha: float) -> None:
        self.tokens, self.alpha = tokens, alpha


def rounds_drawn(tokens: int, alpha: float, k: int, runs: int = 40_000) -> np.ndarray:
    """Rounds to keep `tokens` tokens, each round keeping j + 1 with P(j) = alpha^j (1 - alpha), j < K, K + 1 else."""
    rng = np.random.default_rng(3)
    gains = np.minimum(rng.geometric(1 - alpha, size=(runs, tokens)), k + 1)  # tokens a round (>= 1)
    return (np.cumsum(gains, axis=1) < tokens).sum(axis=1) + 1


@pytest.mark.parametrize("tokens, alpha, k", [(24, 0.7, 4), (24, 0.8, 6), (400, 0.7, 4)])
def test_a_short_run_is_slower_than_the_steady_rate_by_its_rounds_law(tokens, alpha, k):
    got = finite_run(Spec(tokens, alpha), Candidate((0,), (1,), "even", "sync", k), 10.0)
    rounds = rounds_drawn(tokens, alpha, k)
    gamma = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert got["finite_tok_s"] == pytest.approx(10.0 * tokens / (rounds.mean() * gamma), rel=0.01)
    assert got["draw_sd_pct"] == pytest.approx(rounds.std() / rounds.mean() * 100, rel=0.03)
    assert got["finite_tok_s"] < 10.0  # the last round's surplus is dropped
    if tokens == 400:
        assert got["finite_tok_s"] > 9.9 and got["draw_sd_pct"] < 5  # a long run: close to the steady rate


def test_plain_and_overlapped_candidates_have_no_finite_run_figure_and_z_counts_sds():
    assert finite_run(Spec(24, 0.7), Candidate((0,), (1,), "even", "off"), 10.0) == {}
    assert finite_run(Spec(24, 0.7), Candidate((0,), (1,), "even", "async", 4, 2), 10.0) == {}
    c = Confirmation(1, "ring", "spec K 4", 10.0, 9.0, 9.0, "virtual", finite_tok_s=9.5, draw_sd_pct=10.0)
    assert c.draw_z == pytest.approx((9.0 / 9.5 - 1) * 100 / 10.0)
    assert replace(c, draw_sd_pct=None).draw_z is None
