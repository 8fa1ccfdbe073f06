"""The live dashboard renders a snapshot into a capture console: content, fit, and the refresh loop."""

from __future__ import annotations

import copy
import io

import pytest
import trio
from rich.console import Console

from dashboards.live import LINE_MIN_INTERVAL_S, MEASURED_MARK, render, render_line, render_summary, run_dashboard

PLAIN_SNAPSHOT = {
    "scenario": "geo-ring", "shaper": "userspace", "shaper_reason": "no CAP_NET_ADMIN", "phase": "plain",
    "stages": 3, "stage_names": ["hong-kong", "dublin", "new-york"],
    "hops_ms": [130.0, 40.0, 110.0],
    "tokens": 48, "laps": 48, "wall_s": 15.1,
    "compute_s": 0.0331, "compute_real_s": 0.0012,
    "per_stage": [
        {"stage": 0, "name": "hong-kong", "emulated_ms": 11.0, "compute_ms_mean": 11.02, "real_ms_mean": 0.4},
        {"stage": 1, "name": "dublin", "emulated_ms": 11.0, "compute_ms_mean": 11.05, "real_ms_mean": 0.41},
        {"stage": 2, "name": "new-york", "emulated_ms": 11.0, "compute_ms_mean": 11.03, "real_ms_mean": 0.42},
    ],
    "t_ring_s": 0.28, "t_ring_measured_s": 0.2806,
    "measured_tok_s": 3.19, "predicted_tok_s": 3.195, "error_pct": -0.2,
    "per_hop": [
        {"hop": "0->1", "configured_ms": 130.0, "measured_ms_p50": 130.2, "measured_ms_p99": 130.4, "bytes_per_lap": 560},
        {"hop": "1->2", "configured_ms": 40.0, "measured_ms_p50": 40.3, "measured_ms_p99": 40.6, "bytes_per_lap": 560},
        {"hop": "2->0", "configured_ms": 110.0, "measured_ms_p50": 110.1, "measured_ms_p99": 110.7, "bytes_per_lap": 560},
    ],
    "overhead_ms_per_hop": 0.21,
    "mode": "plain",
    "spec": None,
    "history": [[0.5 * i, 3.0 + 0.05 * (i % 5)] for i in range(40)],
    "metrics_url": "http://127.0.0.1:9464/metrics",
}

SPEC_SNAPSHOT = {
    **copy.deepcopy(PLAIN_SNAPSHOT),
    "phase": "speculative", "mode": "speculative",
    "measured_tok_s": 8.61, "predicted_tok_s": 8.9, "error_pct": -3.3,
    "spec": {"k": 8, "k_auto": True, "draft": "trained", "rounds": 10, "alpha": 0.71,
             "gamma_measured": 3.1, "gamma_predicted": 3.2, "draft_s": 0.04, "round_s": 0.36,
             "predicted_tok_s": 8.9, "k_star": 8},
}

EARLY_SNAPSHOT = {
    "scenario": "geo-ring", "shaper": "userspace", "shaper_reason": None, "phase": "plain", "stages": 3,
    "stage_names": ["hong-kong", "dublin", "new-york"], "hops_ms": [130.0, 40.0, 110.0], "tokens": 0, "laps": 0,
    "wall_s": None, "compute_s": None, "compute_real_s": None, "per_stage": [], "t_ring_s": 0.28,
    "t_ring_measured_s": None, "measured_tok_s": None, "predicted_tok_s": None, "error_pct": None, "per_hop": [],
    "overhead_ms_per_hop": None, "mode": "plain", "spec": None, "history": [], "metrics_url": None,
}


def capture(snapshot: dict, width: int, height: int) -> list[str]:
    console = Console(record=True, width=width, height=height, file=io.StringIO())
    console.print(render(snapshot, width, height))
    return console.export_text().rstrip("\n").split("\n")


def assert_fits(lines: list[str], width: int, height: int) -> None:
    assert len(lines) <= height, f"{len(lines)} lines for a {height}-line terminal"
    too_wide = [line for line in lines if len(line.rstrip()) > width]
    assert not too_wide, too_wide


def test_plain_snapshot_at_80x24_shows_everything_and_fits():
    lines = capture(PLAIN_SNAPSHOT, 80, 24)
    text = "\n".join(lines)
    assert_fits(lines, 80, 24)
    assert "geo-ring" in text and "userspace" in text and "no CAP_NET_ADMIN" in text
    assert "3 stages" in text and "hong-kong→dublin→new-york" in text
    assert "T_ring 280.0 ms" in text and "C 33.1 ms" in text
    assert "3.19 tok/s measured" in text and "3.19 predicted" in text and "error -0.2%" in text
    for hop, cells in (("0->1", "130.0  130.2  130.4"), ("1->2", "40.0   40.3   40.6"), ("2->0", "110.0  110.1  110.7")):
        row = next(line for line in lines if line.startswith(hop))
        assert cells in row and "560" in row
    for name, measured in (("hong-kong", "11.02"), ("dublin", "11.05"), ("new-york", "11.03")):
        assert any(name in line and measured in line for line in lines), name
    assert "spec" not in text.split("\n")[3]  # no speculation line in the plain phase
    assert MEASURED_MARK in text and "0.1" in lines[-2] and "1000" in lines[-2]  # the wall plot and its axis
    assert lines[-1].startswith("rate ") and "now 3.20 tok/s" in lines[-1]


def test_spec_snapshot_shows_k_alpha_gamma_and_r_spec():
    text = "\n".join(capture(SPEC_SNAPSHOT, 80, 24))
    assert "phase speculative" in text
    assert "K=8" in text and "K*=8" in text and "auto" in text
    assert "α 0.71" in text
    assert "Γ 3.10/3.20" in text
    assert "r_spec 8.61/8.90" in text and "-3.3%" in text
    assert "8.61 tok/s measured" in text and "8.90 predicted" in text


def test_wide_terminal_uses_more_space_and_detail():
    small = capture(SPEC_SNAPSHOT, 80, 24)
    lines = capture(SPEC_SNAPSHOT, 160, 48)
    text = "\n".join(lines)
    assert_fits(lines, 160, 48)
    assert len(lines) > len(small)
    assert "hong-kong→dublin" in text and "new-york→hong-kong" in text  # link names in the hop table
    assert "1/(33.1 + 280.0 ms) = 3.19 tok/s" in text  # the wall evaluated
    assert "overhead 0.21 ms/hop" in text
    assert "Γ 3.10 (pred 3.20)" in text and "2.7× the wall" in text
    assert "share of C" in text


@pytest.mark.parametrize(("width", "height"), [(80, 24), (80, 14), (60, 20), (50, 12), (40, 6), (200, 60)])
@pytest.mark.parametrize("snapshot", [PLAIN_SNAPSHOT, SPEC_SNAPSHOT, EARLY_SNAPSHOT, {}])
def test_every_size_fits_and_keeps_the_rate(snapshot, width, height):
    lines = capture(snapshot, width, height)
    assert_fits(lines, width, height)
    text = "\n".join(lines)
    assert "decode" in text
    if snapshot:
        assert "geo-ring" in text


def test_small_terminal_drops_the_plot_before_the_tables():
    text = "\n".join(capture(PLAIN_SNAPSHOT, 80, 14))
    assert "wall r = 1/(C + T_ring)" not in text
    assert "0->1" in text and "hong-kong" in text


def test_early_snapshot_shows_placeholders():
    text = "\n".join(capture(EARLY_SNAPSHOT, 80, 24))
    assert "decode – tok/s measured" in text
    assert "waiting for the first laps" in text
    assert "no history yet" in text


def test_render_line_is_one_plain_line():
    line = render_line(SPEC_SNAPSHOT)
    assert "\n" not in line and line.isascii()
    for part in ("geo-ring", "phase=speculative", "shaper=userspace", "stages=3", "T_ring=280.0ms", "C=33.1ms",
                 "laps=48", "rate=8.61tok/s", "predicted=8.90tok/s", "error=-3.3%", "K=8", "alpha=0.71",
                 "gamma=3.10/3.20"):
        assert part in line, part
    assert "rate=-tok/s" in render_line(EARLY_SNAPSHOT)
    assert render_line({}).startswith("?")


def test_render_summary_has_one_row_per_phase():
    console = Console(record=True, width=80, file=io.StringIO())
    console.print(render_summary([PLAIN_SNAPSHOT, SPEC_SNAPSHOT]))
    lines = console.export_text().split("\n")
    assert_fits(lines, 80, 100)
    plain = next(line for line in lines if line.strip().startswith("plain"))
    spec = next(line for line in lines if line.strip().startswith("spec"))
    assert "280.0" in plain and "33.1" in plain and "3.19" in plain and "-0.2" in plain
    assert "8.61" in spec and "8.90" in spec and "0.71" in spec and "3.10" in spec and "3.20" in spec
    assert "shaper userspace" in lines[0]


class SnapshotSource:
    """get_snapshot for run_dashboard, counting calls and signalling after `wanted` of them."""

    def __init__(self, snapshot: dict, wanted: int) -> None:
        self.snapshot = snapshot
        self.calls = 0
        self.wanted = wanted
        self.enough = trio.Event()

    def __call__(self) -> dict:
        self.calls += 1
        if self.calls >= self.wanted:
            self.enough.set()
        return self.snapshot


async def test_run_dashboard_prints_status_lines_on_a_non_terminal():
    out = io.StringIO()
    console = Console(file=out, width=100)
    assert not console.is_terminal
    source = SnapshotSource(PLAIN_SNAPSHOT, wanted=1)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_dashboard(source, console=console, interval_s=0.05,
                                                                  task_status=task_status))
            await source.enough.wait()
            await trio.sleep(0.3)  # far more than interval_s: lines are still rate-limited
            nursery.cancel_scope.cancel()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines  # the first line, then the final one on cancellation (not one per 50 ms)
    assert LINE_MIN_INTERVAL_S > 0.3
    assert all(line == render_line(PLAIN_SNAPSHOT) for line in lines)


async def test_run_dashboard_refreshes_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, height=30, color_system=None)
    assert console.is_terminal
    source = SnapshotSource(SPEC_SNAPSHOT, wanted=3)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_dashboard(source, console=console, interval_s=0.05,
                                                                  task_status=task_status))
            await source.enough.wait()
            nursery.cancel_scope.cancel()
    assert source.calls >= 4  # three loop frames and the final one
    frames = out.getvalue()
    assert frames.count("8.61 tok/s measured") >= 3, frames[-2000:]
    assert frames.count("0->1") >= 3
