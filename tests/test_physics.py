"""The closed forms reproduce seed 000's Table 2 and Table 3 to the printed digits."""

import math

import pytest

from testbed.core import physics

C = 1 / 30  # the paper's r0 = 30 tok/s

# (T_ring ms, decode tok/s, % of r0) from Table 2
TABLE_2 = [(0, 30.0, 100), (0.3, 29.7, 99), (2, 28.3, 94), (20, 18.8, 63), (60, 10.7, 36), (150, 5.5, 18),
           (280, 3.2, 11)]



def half_up(x: float, digits: int = 0) -> float:
    """The paper rounds halves up (18.75/30 = 62.5% is printed as 63%)."""
    scale = 10**digits
    return math.floor(x * scale + 0.5) / scale


# alpha -> {K: (Gamma, r)}, best (rate, K*) from Table 3 (C = 1/30 s, printed as 33 ms; c_d = 5 ms; T_ring = 280 ms)
TABLE_3 = {
    0.6: ({4: (2.31, 6.9), 8: (2.47, 7.0), 16: (2.50, 6.4)}, (7.1, 6)),
    0.7: ({4: (2.77, 8.3), 8: (3.20, 9.1), 16: (3.33, 8.5)}, (9.1, 8)),
    0.8: ({4: (3.36, 10.1), 8: (4.33, 12.3), 16: (4.89, 12.4)}, (12.7, 12)),
    0.9: ({4: (4.10, 12.3), 8: (6.13, 17.3), 16: (8.33, 21.2)}, (21.6, 21)),
}


@pytest.mark.parametrize("t_ring_ms, rate, pct", TABLE_2)
def test_table_2(t_ring_ms, rate, pct):
    r = physics.wall_rate(C, t_ring_ms / 1e3)
    assert round(r, 1) == rate
    assert half_up(100 * r / physics.wall_rate(C, 0)) == pct


@pytest.mark.parametrize("alpha", sorted(TABLE_3))
def test_table_3(alpha):
    per_k, (best_rate, k_star) = TABLE_3[alpha]
    for k, (gamma, rate) in per_k.items():
        assert round(physics.gamma(alpha, k), 2) == gamma
        assert round(physics.spec_rate(alpha, k, 0.005, C, 0.280), 1) == rate
    k, r = physics.best_k(alpha, 0.005, C, 0.280)
    assert (k, round(r, 1)) == (k_star, best_rate)


def test_figure_1_convergence():
    # "Hold T_ring = 280 ms: r0 = 15 -> 2.9, 30 -> 3.2, 60 -> 3.4, 120 -> 3.5, 1000 -> 3.6 tok/s"
    got = [round(physics.wall_rate(1 / r0, 0.280), 1) for r0 in (15, 30, 60, 120, 1000)]
    assert got == [2.9, 3.2, 3.4, 3.5, 3.6]


def test_b_hop_and_tp_pp():
    assert physics.b_hop(1, 16384, 2) == 32768  # the paper's 32 KiB
    assert physics.b_hop(2000, 16384, 2) == 65_536_000  # "a 2000-token prompt crosses 65.5 MB per hop"
    assert physics.tp_pp_latency_ratio(100, 3) == pytest.approx(133.3, abs=0.1)  # ">= 130x"


def test_gamma_edges_and_errors():
    assert physics.gamma(1.0, 7) == 8
    assert physics.gamma(0.0, 7) == 1
    with pytest.raises(ValueError):
        physics.gamma(1.5, 4)
    with pytest.raises(ValueError):
        physics.wall_rate(0, 0)


def test_ttft_adds_serialization():
    assert physics.ttft(1.0, 0.28) == pytest.approx(1.28)
    # 65.5 MB over 280 MB/s ~ 234 ms per hop (seed 000, section 3)
    assert physics.ttft(0, 0, 65_536_000, 280e6) == pytest.approx(0.234, abs=0.001)


def test_survival_gamma_is_gamma_for_iid_rejections_and_less_for_correlated_ones():
    alpha = 0.8
    iid = [alpha ** (i + 1) for i in range(6)]
    for k in range(1, 10):  # measured through position 5, extended at the same alpha beyond
        assert physics.survival_gamma(iid, k, alpha) == pytest.approx(physics.gamma(alpha, k))
    # a draft that, once it fails, keeps failing: survival flattens at 0.6 after the first position
    correlated = [0.6, 0.55, 0.53, 0.52]
    assert physics.survival_gamma(correlated, 4, 0.98) == pytest.approx(1 + sum(correlated))
    assert physics.survival_tail(correlated, 0.8) == pytest.approx(0.52 / 0.53)
    assert physics.survival_curve([10, 9, 3], [6, 5, 2]) == [0.6, 5 / 9]  # position 2: too few rounds


def test_best_k_from_survival_stops_where_the_curve_stops_paying():
    # Each extra draft costs c_d = 5 ms on a 313 ms round; a draft accepted with probability S_i adds S_i tokens.
    flat_then_dead = [0.9, 0.85, 0.02, 0.01]
    k, _ = physics.best_k_survival(flat_then_dead, 0.5, 0.005, 0.033, 0.280, 24)
    assert k == 2
    k_iid, _ = physics.best_k(0.9, 0.005, 0.033, 0.280, 24)
    assert k_iid > 10  # the i.i.d. form at the same first-position acceptance would draft far too long
