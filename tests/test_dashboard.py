"""The live dashboard renders recorded RunSummary objects into a capture console: content, fit, the refresh loop."""

from __future__ import annotations

import functools
import io
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from rich.console import Console

from dashboards.live import LINE_MIN_INTERVAL_S, MEASURED_MARK, render, render_line, render_summary, run_dashboard
from testbed.core.summary import RunSummary

DATA = Path(__file__).resolve().parent / "data"
PLAIN = RunSummary.from_json((DATA / "summary-plain.json").read_text(encoding="utf-8"))
SPEC = RunSummary.from_json((DATA / "summary-speculative.json").read_text(encoding="utf-8"))
# A real run of tests/data/small.toml (testbed run ... --set decode.streams=4 --set decode.tokens=12).
STREAMS = RunSummary.from_json((DATA / "summary-streams.json").read_text(encoding="utf-8"))
# Before the first decode lap: the ring is known, nothing is measured.
EARLY = replace(
    PLAIN, tokens=0, laps=0, wall_s=0.0, compute_s=None, compute_real_s=None, t_ring_measured_s=None,
    measured_tok_s=None, predicted_tok_s=None, error_pct=None, lap_residual_ms=None, overhead_ms_per_hop=None,
    per_hop=tuple(replace(h, measured_ms_p50=None, measured_ms_p99=None, bytes_per_lap=None) for h in PLAIN.per_hop),
    per_stage=tuple(replace(s, compute_ms_mean=None, real_ms_mean=None) for s in PLAIN.per_stage),
    ttft=None, history=(), text="", token_ids=(), generated_tokens=None)
WIDE = (160, 48)


def capture(summary: RunSummary | None, width: int, height: int) -> list[str]:
    console = Console(record=True, width=width, height=height, file=io.StringIO())
    console.print(render(summary, width, height))
    return console.export_text().rstrip("\n").split("\n")


def assert_fits(lines: list[str], width: int, height: int) -> None:
    assert len(lines) <= height, f"{len(lines)} lines for a {height}-line terminal"
    too_wide = [line for line in lines if len(line.rstrip()) > width]
    assert not too_wide, too_wide


def test_recordings_are_what_the_tests_assume():
    assert PLAIN.mode == "plain" and PLAIN.spec is None and PLAIN.laps > 0 and len(PLAIN.history) > 1
    assert SPEC.is_speculative and SPEC.spec is not None and SPEC.spec.k == 4
    assert SPEC.predicted_tok_s == SPEC.spec.predicted_tok_s  # in speculative mode the headline is r_spec


def test_plain_summary_at_80x24_shows_everything_and_fits():
    lines = capture(PLAIN, 80, 24)
    text = "\n".join(lines)
    assert_fits(lines, 80, 24)
    assert PLAIN.scenario in lines[0] and PLAIN.shaper in lines[0] and f"phase {PLAIN.phase}" in lines[0]
    assert f"{PLAIN.stages} stages" in lines[1] and "→".join(PLAIN.stage_names) in lines[1]
    assert f"T_ring {PLAIN.t_ring_s * 1e3:.1f} ms" in lines[1] and f"C {PLAIN.compute_s * 1e3:.1f} ms" in lines[1]
    assert lines[2].startswith(f"decode {PLAIN.measured_tok_s:.2f} tok/s measured  {PLAIN.predicted_tok_s:.2f} "
                               f"predicted  error {PLAIN.error_pct:+.1f}%")
    assert f"{PLAIN.tokens} tok {PLAIN.laps} laps" in lines[2]
    for hop in PLAIN.per_hop:
        row = next(line for line in lines if line.startswith(hop.hop + " "))
        assert re.search(rf"{hop.configured_ms:.1f} +{hop.measured_ms_p50:.1f} +{hop.measured_ms_p99:.1f} "
                         rf"+{hop.bytes_per_lap}\b", row), row
    for stage in PLAIN.per_stage:
        assert any(f"{stage.stage} {stage.name}"[:12] in line and f"{stage.compute_ms_mean:.2f}" in line
                   for line in lines), stage
    assert not any(line.startswith("spec ") for line in lines)  # no speculation line in the plain phase
    assert MEASURED_MARK in text and "0.1" in lines[-2] and "1000" in lines[-2]  # the wall plot and its axis
    assert lines[-1].startswith("rate ") and f"now {PLAIN.history[-1][1]:.2f} tok/s" in lines[-1]


def test_spec_summary_shows_k_alpha_gamma_and_r_spec():
    spec = SPEC.spec
    lines = capture(SPEC, 80, 24)
    assert f"phase {SPEC.phase}" in lines[0]
    line = next(line for line in lines if line.startswith("spec "))
    assert f"K={spec.k:g}" in line and f"K*={spec.k_star}" in line
    assert f"α {spec.alpha:.2f}" in line and f"Γ {spec.gamma_measured:.2f}/{spec.gamma_predicted:.2f}" in line
    assert f"r_spec {SPEC.measured_tok_s:.2f}/{SPEC.predicted_tok_s:.2f} {SPEC.error_pct:+.1f}%" in line


def test_predictions_are_read_from_the_summary_not_recomputed():
    odd = replace(SPEC, predicted_tok_s=12.34, error_pct=-42.0,
                  spec=replace(SPEC.spec, gamma_predicted=5.67, plain_predicted_tok_s=0.5,
                               predicted_tok_s=12.34))
    narrow, wide = "\n".join(capture(odd, 80, 24)), "\n".join(capture(odd, *WIDE))
    assert "12.34 predicted  error -42.0%" in narrow and "Γ " in narrow and "/5.67" in narrow
    assert f"= {odd.measured_tok_s / 0.5:.1f}× the wall" in wide and "= 0.50 tok/s" in wide
    assert "predicted=12.34tok/s" in render_line(odd) and "gamma=" in render_line(odd)


def test_wide_terminal_uses_more_space_and_detail():
    spec = SPEC.spec
    small = capture(SPEC, 80, 24)
    lines = capture(SPEC, *WIDE)
    text = "\n".join(lines)
    assert_fits(lines, *WIDE)
    assert len(lines) > len(small)
    names = SPEC.stage_names
    assert f"{names[0]}→{names[1]}" in text and f"{names[-1]}→{names[0]}" in text  # link names in the hop table
    assert (f"1/({spec.verify_compute_s * 1e3:.1f} + {SPEC.t_ring_s * 1e3:.1f} ms) = "
            f"{spec.plain_predicted_tok_s:.2f} tok/s") in text  # the summarizer's wall, evaluated
    assert f"overhead {SPEC.overhead_ms_per_hop:.2f} ms/hop" in text
    widest = "\n".join(capture(SPEC, 240, 48))  # the rate line's last detail
    assert f"TTFT {SPEC.ttft.measured_s * 1e3:.0f} ms (pred {SPEC.ttft.predicted_s * 1e3:.0f})" in widest
    assert f"Γ {spec.gamma_measured:.2f} (pred {spec.gamma_predicted:.2f})" in text
    assert f"{SPEC.measured_tok_s / spec.plain_predicted_tok_s:.1f}× the wall" in text
    assert "share of C" in text and f"{spec.draft} draft" in text


@pytest.mark.parametrize(("width", "height"), [(80, 24), (80, 14), (60, 20), (50, 12), (40, 6), (200, 60)])
@pytest.mark.parametrize("summary", [PLAIN, SPEC, STREAMS, EARLY, None],
                         ids=["plain", "spec", "streams", "early", "none"])
def test_every_size_fits_and_keeps_the_rate(summary, width, height):
    lines = capture(summary, width, height)
    assert_fits(lines, width, height)
    assert any(line.startswith("decode ") for line in lines)
    assert (summary.scenario if summary is not None else " ? ") in lines[0]


def test_small_terminal_drops_the_plot_before_the_tables():
    text = "\n".join(capture(PLAIN, 80, 14))
    assert "wall r = 1/(C + T_ring)" not in text
    assert PLAIN.per_hop[0].hop in text and PLAIN.per_stage[0].name in text


def test_early_summary_shows_placeholders():
    lines = capture(EARLY, 80, 24)
    text = "\n".join(lines)
    assert "decode – tok/s measured  – predicted  error –%" in text
    assert re.search(rf"^{re.escape(EARLY.per_hop[0].hop)} +{EARLY.per_hop[0].configured_ms:.1f} +– +– +–",
                     text, re.MULTILINE), text
    assert "waiting for the first laps" in text and "no history yet" in text


def test_no_summary_yet_shows_placeholders():
    text = "\n".join(capture(None, 80, 24))
    assert "phase starting" in text and "decode – tok/s measured" in text and "waiting for the first laps" in text


def test_render_line_is_one_plain_line():
    spec = SPEC.spec
    line = render_line(SPEC)
    assert "\n" not in line and line.isascii()
    for part in (SPEC.scenario, f"phase={SPEC.phase}", f"shaper={SPEC.shaper}", f"stages={SPEC.stages}",
                 f"T_ring={SPEC.t_ring_s * 1e3:.1f}ms", f"C={SPEC.compute_s * 1e3:.1f}ms", f"laps={SPEC.laps}",
                 f"rate={SPEC.measured_tok_s:.2f}tok/s", f"predicted={SPEC.predicted_tok_s:.2f}tok/s",
                 f"error={SPEC.error_pct:+.1f}%", f"K={spec.k:g}", f"alpha={spec.alpha:.2f}",
                 f"gamma={spec.gamma_measured:.2f}/{spec.gamma_predicted:.2f}"):
        assert part in line, part
    assert "rate=-tok/s" in render_line(EARLY)
    assert render_line(None).startswith("?")


def test_render_summary_has_one_row_per_phase():
    console = Console(record=True, width=80, file=io.StringIO())
    console.print(render_summary([PLAIN, SPEC]))
    lines = console.export_text().split("\n")
    assert_fits(lines, 80, 100)
    plain = next(line for line in lines if line.strip().startswith("plain"))
    spec_row = next(line for line in lines if line.strip().startswith("spec"))
    for summary, row in ((PLAIN, plain), (SPEC, spec_row)):
        cells = [f"{summary.t_ring_s * 1e3:.1f}", f"{summary.compute_s * 1e3:.1f}", str(summary.laps),
                 f"{summary.measured_tok_s:.2f}", f"{summary.predicted_tok_s:.2f}", f"{summary.error_pct:+.1f}"]
        assert re.search(" +".join(map(re.escape, cells)), row), (cells, row)
    spec = SPEC.spec
    assert re.search(rf"{spec.k:g} +{spec.alpha:.2f} +{spec.gamma_measured:.2f} +{spec.gamma_predicted:.2f}$",
                     spec_row.rstrip()), spec_row
    assert plain.rstrip().endswith("–")  # no speculation columns for the plain phase
    assert f"shaper {PLAIN.shaper}" in lines[0]


def busiest(summary: RunSummary) -> tuple[str, float, float]:
    """The busiest stage of a streams summary, found here independently of the renderer."""
    st = summary.streams
    busy, i = max((busy, i) for i, busy in enumerate(st.stage_busy))
    return summary.stage_names[i], busy, st.stage_busy_predicted[i]


def test_streams_recording_is_what_the_tests_assume():
    st = STREAMS.streams
    assert STREAMS.mode == "streams" and STREAMS.spec is None and st is not None
    assert st.streams == 4 and st.batching == "none" and len(st.per_stream_tok_s) == 4
    assert len(set(st.stage_busy)) == len(st.stage_busy)  # one stage is the busiest


def test_streams_line_shows_aggregate_per_stream_ceiling_and_busiest_stage():
    st = STREAMS.streams
    name, busy, busy_predicted = busiest(STREAMS)
    expected = [f"streams M={st.streams} {st.batching}",
                f"aggregate {st.aggregate_tok_s:.2f} tok/s (pred {st.aggregate_predicted_tok_s:.2f}, "
                f"{st.aggregate_error_pct:+.1f}%)",
                f"ceiling {st.ceiling_tok_s:.1f}",
                f"per stream p50 {st.per_stream_p50_tok_s:.2f} min {st.per_stream_min_tok_s:.2f} "
                f"(pred {st.per_stream_predicted_tok_s:.2f})",
                f"busiest {name} {busy:.0%} (pred {busy_predicted:.0%})"]
    narrow = capture(STREAMS, 80, 24)
    assert_fits(narrow, 80, 24)
    start = next(i for i, line in enumerate(narrow) if line.startswith("streams "))
    two_lines = " ".join(narrow[start:start + 2])
    assert all(part in two_lines for part in expected), two_lines
    wide = capture(STREAMS, *WIDE)
    assert_fits(wide, *WIDE)
    line = next(line for line in wide if line.startswith("streams "))
    assert all(part in line for part in expected), line
    assert not any(line.startswith("spec ") for line in wide)


def test_streams_figures_are_read_from_the_summary():
    odd = replace(STREAMS, streams=replace(
        STREAMS.streams, aggregate_predicted_tok_s=123.45, aggregate_error_pct=-9.9, per_stream_predicted_tok_s=6.78,
        ceiling_tok_s=432.1, stage_busy_predicted=(0.11, 0.22, 0.33)))
    name, busy, busy_predicted = busiest(odd)
    assert busy_predicted in (0.11, 0.22, 0.33)
    text = " ".join(capture(odd, *WIDE))
    assert "(pred 123.45, -9.9%)" in text and "(pred 6.78)" in text and "ceiling 432.1" in text
    assert f"busiest {name} {busy:.0%} (pred {busy_predicted:.0%})" in text
    line = render_line(odd)
    assert "\n" not in line and line.isascii()
    for part in ("streams=4", "batching=none", f"aggregate={odd.streams.aggregate_tok_s:.2f}/123.45tok/s",
                 f"per_stream_p50={odd.streams.per_stream_p50_tok_s:.2f}",
                 f"per_stream_min={odd.streams.per_stream_min_tok_s:.2f}", "per_stream_predicted=6.78tok/s",
                 "ceiling=432.10tok/s", f"busiest={busy:.2f}"):
        assert part in line, part
    assert "streams=" not in render_line(PLAIN)


def test_render_summary_adds_the_streams_table():
    console = Console(record=True, width=80, file=io.StringIO())
    console.print(render_summary([PLAIN, STREAMS]))
    lines = console.export_text().split("\n")
    assert_fits(lines, 80, 100)
    row = next(line for line in lines if line.strip().startswith("streams"))
    cells = [f"{STREAMS.t_ring_s * 1e3:.1f}", f"{STREAMS.compute_s * 1e3:.1f}", str(STREAMS.laps),
             f"{STREAMS.streams.aggregate_tok_s:.2f}", f"{STREAMS.streams.aggregate_predicted_tok_s:.2f}",
             f"{STREAMS.streams.aggregate_error_pct:+.1f}"]
    assert re.search(" +".join(map(re.escape, cells)), row), (cells, row)  # the headline is the aggregate
    st = STREAMS.streams
    name, busy, busy_predicted = busiest(STREAMS)
    per_stream = next(line for line in lines if line.startswith(STREAMS.scenario + " "))
    cells = [str(st.streams), st.batching, f"{st.per_stream_p50_tok_s:.2f}", f"{st.per_stream_min_tok_s:.2f}",
             f"{st.per_stream_predicted_tok_s:.2f}", f"{st.ceiling_tok_s:.1f}", name,
             f"{busy:.0%}/{busy_predicted:.0%}"]
    assert re.search(" +".join(map(re.escape, cells)), per_stream), (cells, per_stream)
    plain_only = Console(record=True, width=80, file=io.StringIO())
    plain_only.print(render_summary([PLAIN]))
    assert "per stream" not in plain_only.export_text()


class SummarySource:
    """get_summary for run_dashboard: a distinct summary per call (laps = FIRST_LAPS, FIRST_LAPS + 1, ...)."""

    FIRST_LAPS = 1001

    def __init__(self, base: RunSummary) -> None:
        self.base = base
        self.returned: list[RunSummary] = []

    def __call__(self) -> RunSummary:
        summary = replace(self.base, laps=self.FIRST_LAPS + len(self.returned))
        self.returned.append(summary)
        return summary


async def run_for(source: SummarySource, console: Console, interval_s: float, seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(run_dashboard, source, console=console, interval_s=interval_s))
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_run_dashboard_prints_rate_limited_status_lines_on_a_non_terminal(autojump_clock):
    out = io.StringIO()
    console = Console(file=out, width=100)
    source = SummarySource(PLAIN)
    seconds = 2.5 * LINE_MIN_INTERVAL_S
    await run_for(source, console, interval_s=0.05, seconds=seconds)
    lines = out.getvalue().splitlines()
    assert lines == [render_line(summary) for summary in source.returned]  # one line per summary, in order
    # at 0, LINE_MIN_INTERVAL_S and twice that (not one per 50 ms), then the final line on cancellation
    assert len(lines) == math.floor(seconds / LINE_MIN_INTERVAL_S) + 2


async def test_run_dashboard_draws_every_summary_on_a_terminal(autojump_clock):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, height=30, color_system=None)
    source = SummarySource(SPEC)
    interval_s, seconds = 0.25, 1.1
    await run_for(source, console, interval_s=interval_s, seconds=seconds)
    assert len(source.returned) == math.floor(seconds / interval_s) + 2  # every interval, and the final frame
    frames = [int(laps) for laps in re.findall(r"(\d+) laps", out.getvalue())]
    distinct = [laps for i, laps in enumerate(frames) if i == 0 or laps != frames[i - 1]]
    assert distinct == [summary.laps for summary in source.returned]  # each summary drawn, in order
    assert len(frames) <= len(source.returned) + 1  # no refresh thread: only Live.stop redraws the last frame
