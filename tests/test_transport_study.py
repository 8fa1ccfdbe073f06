"""The transport study: the virtual backend's transfers equal testbed.core.tcp's model exactly, the predictions
follow the closed forms, and the figures (the window's cap, slow start's rounds, the ceiling's marks) come out of
the rows as stated."""

from __future__ import annotations

import json
import math
import statistics

import pytest

import testbed
from testbed.core.errors import ConfigError
from testbed.core.tcp import KERNEL_WINDOW_CAP_BYTES, TcpParams, cold_transfer_s
from testbed.report import build as report
from testbed.studies.transport import grid, measure, parse
from testbed.studies.transport.grid import KiB, MiB, Point, predict
from testbed.studies.transport.result import TransferRow


@pytest.fixture(scope="module")
def quick():
    return testbed.transport(shapers="virtual", quick=True)


def test_virtual_transfers_equal_the_model_to_1e_6(quick):
    assert quick.backends == ("virtual",) and len(quick.transport_rows) == len(grid.grid(quick=True)[0])
    assert quick.repeats == grid.REPEATS
    for r in quick.transport_rows:
        assert r.measured_s == pytest.approx(r.model_s, rel=1e-6), r
        assert r.repeats == (grid.REPEATS if r.loss_pct else 1), r
        assert r.measured_draws_s == pytest.approx(r.model_draws_s, rel=1e-6), r  # draw by draw, seed by seed
        if r.connections == 1 and not r.loss_pct:  # the closed form, written apart from TcpFlow
            assert r.measured_s == pytest.approx(r.predicted_s, rel=1e-6), r
    assert any(r.loss_pct for r in quick.transport_rows) and any(r.connections > 1 for r in quick.transport_rows)


def test_a_cold_transfer_counts_slow_start_s_rounds():
    """64 KiB at RTT 100 ms from IW = 14,480 B: rounds of 14,480, 28,960 and the 22,096 B left, so two RTTs, the
    last round's bytes at the rate and one way."""
    point = Point(50.0, 1000.0, 0.0, 64 * KiB)
    expected = 2 * 0.1 + 22_096 / 125e6 + 0.05
    assert predict(point).predicted_s == pytest.approx(expected, rel=1e-12)
    assert grid.rounds_of(point, expected) == pytest.approx(2.0, abs=0.01)


def test_n_connections_are_predicted_as_one_flow_with_n_windows():
    point = Point(50.0, 1000.0, 0.0, 16 * MiB, 4)
    params = TcpParams(0.1, 125e6, initial_window=4 * 14480, window_cap=4 * KERNEL_WINDOW_CAP_BYTES)
    assert predict(point).predicted_s == pytest.approx(cold_transfer_s(16 * MiB, params, 0.05), rel=1e-12)
    assert predict(point).predicted_s < predict(Point(50.0, 1000.0, 0.0, 16 * MiB)).predicted_s


def test_lossy_points_print_mathis_beside_the_seeded_model():
    prediction = predict(Point(25.0, 100.0, 0.1, 4 * MiB))
    assert prediction.model_s == grid.modelled_s(Point(25.0, 100.0, 0.1, 4 * MiB)) and prediction.how.startswith("TcpFlow")
    mathis_rate = 1448 / 0.05 * (1.5 / 0.001) ** 0.5
    assert prediction.mathis_s == pytest.approx(4 * MiB / mathis_rate + 0.025, rel=1e-9)


def test_the_grid_spans_the_issue_s_ranges_and_leaves_out_long_points_by_name():
    points, left = grid.grid()
    rtts = {2 * p.delay_ms for p in points}
    assert min(rtts) == 2 and max(rtts) == 280
    assert {p.rate_mbit for p in points} >= {10, 1000} and {p.loss_pct for p in points} >= {0, 1}
    assert {p.size_bytes for p in points} >= {64 * KiB, 256 * MiB} and {p.connections for p in points} == {1, 4}
    assert all(grid.estimate_s(p) > grid.MAX_POINT_S for p in left) and left
    assert all(grid.estimate_s(p) <= grid.MAX_POINT_S for p in points)


def _row(size: int, seconds: float, purpose: str = "cap", rate: float = 1000.0) -> TransferRow:
    return TransferRow("netem", purpose, 140.0, rate, 0.0, size, 1, 1.0, "", 1.0, None, seconds)


def test_the_window_cap_is_the_plateau_rate_times_the_rtt():
    cap = 4 * MiB  # a planted cap: 4 MiB a round trip of 280 ms
    rows = [_row(64 * MiB, 3.0), _row(256 * MiB, 3.0 + 192 * MiB / (cap / 0.28))]
    figures = measure.figures_of("netem", rows, 600.0)
    assert figures.window_cap_bytes == pytest.approx(cap) and figures.cap_rtt_ms == 280
    assert measure.figures_of("netem", rows[:1], 600.0).window_cap_bytes is None


def test_a_point_faster_than_the_backend_s_ceiling_is_marked_not_fitted():
    fast, slow = Point(1.0, 1000.0, 0.0, 16 * MiB), Point(10.0, 100.0, 0.0, 16 * MiB)
    assert measure._row("netem", fast, [1.0], 600.0).limited.startswith("guest-limited")
    assert measure._row("netem", slow, [1.0], 600.0).limited == ""
    # one stream at RTT 280 ms is held to cap / RTT (~90 Mbit/s), under the ceiling whatever the link's rate
    assert measure._row("netem", Point(140.0, 1000.0, 0.0, 64 * MiB), [1.0], 600.0).limited == ""
    assert measure._row("virtual", fast, [1.0], None).limited == ""


def test_a_point_within_reach_of_the_backend_s_own_cost_a_transfer_is_marked_with_the_figure():
    """64 KiB at RTT 2 ms is predicted 5.2 ms: a guest that takes 1 ms a transfer of its own is 19% of it, marked
    with that figure; at RTT 100 ms (250 ms) it is under the 5% share and counted."""
    small, far = Point(1.0, 1000.0, 0.0, 64 * KiB), Point(50.0, 1000.0, 0.0, 64 * KiB)
    row = measure._row("netem", small, [0.0066], 4000.0, floor_s=0.001)
    assert row.limited.startswith("floor-limited") and "1.00 ms" in row.limited and "19% of the predicted 5.2 ms" in row.limited
    assert measure._row("netem", far, [0.26], 4000.0, floor_s=0.001).limited == ""


def test_the_result_lands_in_the_report_and_a_bad_row_is_named(quick, tmp_path):
    path = tmp_path / "transport.json"
    path.write_text(quick.to_json())
    assert report.main([str(path), "--out", str(tmp_path / "out")]) == 0
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "## Transport" in markdown and "1 transport checks" in markdown
    assert "| virtual | 20 | 100 | 0 | 64 KiB | 1 | 0.0518 | 0.0518 | +0.00 |  |" in markdown
    data = json.loads(quick.to_json())
    data["transport_rows"][0]["measured_s"] = -1.0
    with pytest.raises(ConfigError, match="measured_s"):
        parse(data, "bad.json")


def test_an_unknown_backend_is_named():
    with pytest.raises(ConfigError, match="--shapers"):
        testbed.transport(shapers="virtual,nosuch")


@pytest.mark.fidelity
def test_the_peer_processes_carry_every_byte_through_the_relay():
    """The real backends' ends (python -m testbed.studies.transport.peer) on the relay: fresh connections each time,
    every byte at the receiver, a time on the box's clock (its size is the relay's table's, not asserted here)."""
    import trio

    from testbed.studies.transport.harness import measure_link

    points = [Point(1.0, 0.0, 0.0, 256 * KiB), Point(1.0, 0.0, 0.0, 256 * KiB, 2)]
    name, rows = trio.run(measure_link, "userspace", points, lambda line: None)
    assert name == "userspace" and [(p, n) for p, n, _ in rows] == [(p, p.size_bytes) for p in points]
    assert all(seconds > 0 for _, _, seconds in rows)


def test_a_lossy_point_is_repeated_on_seeds_of_its_own_and_predicted_by_the_model_s_expectation():
    """A loss-free point is one transfer (deterministic); a lossy one is `repeats`, each over a link with a seed
    SEED_STRIDE apart (a transfer's k-th connection draws from seed + k, so no two repeats share a stream). Its
    prediction is the model's mean over MODEL_SEEDS such seeds, with that mean's standard error; the model column
    is the model on exactly the draws' seeds (the first of them)."""
    clean, lossy = Point(25.0, 100.0, 0.0, 4 * MiB, 4), Point(25.0, 100.0, 0.1, 4 * MiB, 4)
    assert grid.draws(clean, 5) == [clean]
    seeds = [p.seed for p in grid.draws(lossy, 5)]
    assert seeds == [i * grid.SEED_STRIDE for i in range(5)] and grid.SEED_STRIDE > 4
    assert {p.link.seed for p in grid.draws(lossy, 5)} == set(seeds)
    prediction = predict(lossy, 5)
    draws = [grid.modelled_s(p) for p in grid.draws(lossy, 5)]
    assert prediction.model_draws_s == tuple(draws) and len(set(draws)) > 1  # the seeds really draw apart
    assert prediction.model_s == pytest.approx(sum(draws) / 5, rel=1e-12)
    every = grid.expectation(lossy)
    assert len(every) == grid.MODEL_SEEDS and every[:5] == tuple(draws)
    assert prediction.predicted_s == pytest.approx(statistics.mean(every), rel=1e-12)
    assert prediction.predicted_se_s == pytest.approx(statistics.stdev(every) / grid.MODEL_SEEDS ** 0.5, rel=1e-12)
    assert prediction.how == f"TcpFlow, mean of {grid.MODEL_SEEDS} seeds" and predict(lossy).model_s == draws[0]


def test_repeats_run_over_links_of_their_own_and_the_row_holds_their_mean_and_spread(monkeypatch):
    """measure_backend on a fake real backend: the ceiling and the floor first, then one link per (link, seed),
    each with all of that link's points; the row's measured time is the mean of its draws, kept in seed order beside
    the model's, and its error has the two means' standard errors."""
    clean, lossy = Point(25.0, 100.0, 0.0, MiB), Point(25.0, 100.0, 0.1, MiB)
    planted = {0: 0.30, grid.SEED_STRIDE: 0.50, 2 * grid.SEED_STRIDE: 0.40}
    links = []

    def fake(kind, points, log):
        links.append([(p.purpose, p.seed, p.loss_pct) for p in points])
        seconds = {"ceiling": 0.5, "floor": 0.002}
        return "fake", [(p, p.size_bytes, seconds.get(p.purpose, planted[p.seed] if p.loss_pct else 0.2))
                        for p in points]

    monkeypatch.setattr(measure, "_measure", fake)
    rows, figures = measure.measure_backend("userspace", [clean, lossy], lambda line: None, repeats=3)
    assert links[0] == [("ceiling", 0, 0.0)] * 3 + [("floor", 0, 0.0)] * 3
    assert links[1:] == [[("grid", 0, 0.0)], [("grid", 0, 0.1)], [("grid", 1000, 0.1)], [("grid", 2000, 0.1)]]
    assert figures.floor_s == 0.002 and figures.ceiling_mbit == pytest.approx(64 * MiB * 8 / 0.5 / 1e6)
    one, mean = rows
    assert one.repeats == 1 and one.measured_s == 0.2 and one.measured_draws_s == ()
    assert mean.measured_draws_s == (0.30, 0.50, 0.40) and mean.measured_s == pytest.approx(0.40)
    assert mean.model_draws_s == predict(lossy, 3).model_draws_s and mean.model_s == predict(lossy, 3).model_s
    assert mean.predicted_s == predict(lossy).predicted_s and mean.predicted_se_s == predict(lossy).predicted_se_s > 0
    assert mean.measured_se_s == pytest.approx(0.1 / 3 ** 0.5)
    ratio = 0.40 / mean.predicted_s
    expected = ratio * math.hypot(mean.measured_se_s / 0.40, mean.predicted_se_s / mean.predicted_s) * 100
    assert mean.error_se_pct == pytest.approx(expected, rel=1e-12)


def test_a_repeated_row_prints_its_mean_with_its_standard_error_and_range():
    from testbed.studies.transport.cells import error_cell, measured_cell, time_cell

    from testbed.studies.transport.cells import predicted_cell

    row = TransferRow("netem", "grid", 25.0, 100.0, 0.1, MiB, 1, 0.4, "", 0.4, None, 0.4, "", (0.3, 0.5, 0.4),
                      (0.4, 0.4, 0.4), 0.01)
    assert measured_cell(row) == f"0.4000 ±{0.1 / 3 ** 0.5:.4f} [0.3000-0.5000]"
    assert predicted_cell(row) == "0.4000 ±0.0100"
    assert error_cell(row) == f"+0.00 ±{row.error_se_pct:.2f}" and row.error_se_pct > 0
    assert time_cell(0.25) == "0.2500" and time_cell(0.25, (0.25,)) == "0.2500"


def test_repeats_must_be_a_whole_number_of_at_least_one():
    with pytest.raises(ConfigError, match="--repeats"):
        testbed.transport(shapers="virtual", quick=True, repeats=0)
