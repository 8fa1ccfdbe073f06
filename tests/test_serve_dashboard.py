"""The dashboard's serve parts (exact): the live line, render_line's figures and the final table show a serve run's
measured figures beside its predictions, read from the summary of a run on the virtual backend."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from agents.modes.serve.facts import ServeSummary
from dashboards.render import MODE_VIEWS, render, render_line, render_summary
from testbed.core.summary import RunSummary
from testbed.launch.runlog import RunLog
from tests.ringutil import ring_scenario, run
from tests.test_serve_mode import serve_scenario

DATA = Path(__file__).resolve().parent / "data"
PLAIN = RunSummary.from_json((DATA / "summary-plain.json").read_text(encoding="utf-8"))
STREAMS = RunSummary.from_json((DATA / "summary-streams.json").read_text(encoding="utf-8"))
WIDE = (160, 48)
TARGETS = "ttft:200 tpot:60"  # some requests meet them, some do not


@pytest.fixture(scope="module")
def served() -> RunSummary:
    """Six requests at 40 req/s on a cap of 2 (they queue), with SLO targets."""
    scenario = serve_scenario(arrival="poisson", rate=40.0, requests=6, prompt_tokens=12, output_tokens=6, seed=3,
                              goodput=TARGETS)
    return run(scenario, runlog=RunLog(scenario))


def capture(renderable, width: int, height: int = 200) -> list[str]:
    console = Console(record=True, width=width, height=height, file=io.StringIO())
    console.print(renderable)
    return console.export_text().rstrip("\n").split("\n")


def assert_fits(lines: list[str], width: int, height: int) -> None:
    assert len(lines) <= height, f"{len(lines)} lines for a {height}-line terminal"
    assert not [line for line in lines if len(line.rstrip()) > width]


def serve_lines(summary: RunSummary, width: int, height: int) -> str:
    """The serve lines of the live frame, joined."""
    lines = capture(render(summary, width, height), width, height)
    assert_fits(lines, width, height)
    start = next(i for i, line in enumerate(lines) if line.startswith("serve "))
    return " ".join(lines[start:start + 2])


def test_the_run_is_what_the_tests_assume(served):
    serve = served.serve
    assert serve is not None and serve.predicted is not None and serve.measured.completed == 6
    assert serve.measured.aborted == 0 and serve.measured.slo_attainment_pct not in (None, 0.0, 100.0)
    latencies = [getattr(serve.measured, f"{s}_{stem}_ms") for s in ("median", "p99") for stem in ("ttft", "tpot")]
    assert min(latencies + [serve.light_ttft_ms, serve.wall_tpot_ms]) >= 10  # shown as whole ms


def test_the_live_line_shows_requests_rate_and_percentiles_against_light_load(served):
    serve, measured = served.serve, served.serve.measured
    expected = [f"serve running {serve.running} waiting {serve.waiting} done {measured.completed}",
                f"{measured.request_throughput:.2f} req/s",
                f"SLO {measured.slo_attainment_pct:.0f}%",
                f"TTFT p50 {measured.median_ttft_ms:.0f} p99 {measured.p99_ttft_ms:.0f} ms (light "
                f"{serve.light_ttft_ms:.0f}",
                f"TPOT p50 {measured.median_tpot_ms:.0f} p99 {measured.p99_tpot_ms:.0f} ms (wall "
                f"{serve.wall_tpot_ms:.0f}"]
    narrow = serve_lines(served, 80, 24)
    assert all(part in narrow for part in expected), narrow
    assert "model" not in narrow
    wide = serve_lines(served, *WIDE)
    assert all(part in wide for part in expected), wide
    assert f"(light {serve.light_ttft_ms:.0f}, model p50 {serve.predicted.median_ttft_ms:.0f})" in wide
    assert f"(wall {serve.wall_tpot_ms:.0f}, model p50 {serve.predicted.median_tpot_ms:.0f})" in wide
    assert f"queueing p50 {measured.median_queue_ms:.0f} p99 {measured.p99_queue_ms:.0f} ms" in wide
    assert "queueing" not in narrow


def test_the_live_line_reads_its_figures_from_the_summary(served):
    serve = served.serve
    odd = replace(serve, light_ttft_ms=777.0, wall_tpot_ms=5.5, measured=replace(
        serve.measured, completed=40, aborted=2, request_throughput=12.34, median_ttft_ms=1234.0, p99_ttft_ms=4321.0,
        median_tpot_ms=66.0, p99_tpot_ms=99.0, slo_attainment_pct=None))
    counted = replace(odd, running=3, waiting=5)
    line = serve_lines(replace(served, serve=counted), 80, 24)
    for part in ("serve running 3 waiting 5 done 42 (2 aborted)  12.34 req/s", "TTFT p50 1234 p99 4321 ms (light 777)",
                 "TPOT p50 66 p99 99 ms (wall 5.5)"):
        assert part in line, line
    assert "SLO" not in line
    at_the_edge = capture(render(replace(served, serve=replace(counted, measured=replace(
        counted.measured, slo_attainment_pct=93.0))), 120, 30), 120, 30)
    start = next(i for i, line in enumerate(at_the_edge) if line.startswith("serve "))
    assert "model p50" in at_the_edge[start + 1] and at_the_edge[start + 2].startswith("hops")  # two lines, unwrapped
    early = replace(odd, measured=replace(odd.measured, completed=0, aborted=1))  # vLLM's 0 is no figure yet
    line = serve_lines(replace(served, serve=early), 80, 24)
    assert "TTFT p50 – p99 – ms (light 777)" in line and "TPOT p50 – p99 – ms" in line, line


def test_before_any_request_ends_the_line_says_so_and_other_modes_have_none(served):
    assert "serve no request has ended yet" in capture(render(replace(served, serve=None), 80, 24), 80)
    for summary in (PLAIN, STREAMS, None):
        lines = capture(render(summary, 80, 24), 80)
        assert not any(line.startswith("serve ") for line in lines)


def test_render_line_has_the_serve_figures(served):
    serve, measured = served.serve, served.serve.measured
    line = render_line(served)
    assert "\n" not in line and line.isascii()
    for part in (f"done={measured.completed}", "aborted=0", f"req_rate={measured.request_throughput:.2f}req/s",
                 f"ttft_p50={measured.median_ttft_ms:.1f}ms", f"ttft_p99={measured.p99_ttft_ms:.1f}ms",
                 f"ttft_light={serve.light_ttft_ms:.1f}ms", f"tpot_p50={measured.median_tpot_ms:.1f}ms",
                 f"tpot_p99={measured.p99_tpot_ms:.1f}ms", f"tpot_wall={serve.wall_tpot_ms:.1f}ms",
                 f"slo_attainment={measured.slo_attainment_pct:.1f}%"):
        assert part in line, part
    assert f"running={serve.running} waiting={serve.waiting}" in line
    counted = replace(serve, running=2, waiting=4)
    assert "running=2 waiting=4 done=6" in render_line(replace(served, serve=counted))
    assert "req_rate=" not in render_line(PLAIN) and "req_rate=" not in render_line(STREAMS)


def row_of(lines: list[str], label: str) -> str:
    return next(line for line in lines if line.startswith(label + " "))


def test_the_final_table_sets_vllms_figures_beside_the_predictions(served):
    serve, measured, predicted = served.serve, served.serve.measured, served.serve.predicted
    lines = capture(render_summary([PLAIN, served]), 100)
    assert_fits(lines, 100, 200)
    assert any(line.startswith("serve geo") or "vLLM's figures, measured vs predicted" in line for line in lines)
    assert re.search(rf"^Successful requests +{measured.completed} +– +–$", row_of(lines, "Successful requests"))
    assert not any(line.startswith("Aborted requests") for line in lines)  # none aborted
    modelled = [("Benchmark duration (s)", "duration_s"), ("Request throughput (req/s)", "request_throughput"),
                ("Output token throughput (tok/s)", "output_throughput")]
    for name, stem in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2EL", "e2el"), ("queueing", "queue")):
        modelled += [(f"{label} {name} (ms)", f"{statistic}_{stem}_ms")
                     for label, statistic in (("Mean", "mean"), ("Median", "median"), ("P99", "p99"))]
    for label, field in modelled:
        ours, theirs = getattr(measured, field), getattr(predicted, field)
        cells = [f"{ours:.2f}", f"{theirs:.2f}", f"{(ours / theirs - 1) * 100:+.1f}"]
        assert re.search(rf"^{re.escape(label)} +" + " +".join(map(re.escape, cells)) + "$", row_of(lines, label)), \
            (label, cells, row_of(lines, label))
    for label, statistic in (("Mean", "mean"), ("Median", "median"), ("P99", "p99")):  # the model has no ITL
        itl = getattr(measured, f"{statistic}_itl_ms")
        assert re.search(rf"^{label} ITL \(ms\) +{itl:.2f} +– +–$", row_of(lines, f"{label} ITL (ms)"))
    assert re.search(rf"^Request goodput \(req/s\) +{measured.request_goodput:.2f} +– +–$",
                     row_of(lines, "Request goodput (req/s)"))
    assert re.search(rf"^SLO attainment \(%\) +{measured.slo_attainment_pct:.1f} +– +–$",
                     row_of(lines, "SLO attainment (%)"))
    start = next(i for i, line in enumerate(lines) if line.startswith("workload: "))
    caption = " ".join(line.strip() for line in lines[start:])
    assert caption.startswith(f"workload: {serve.workload}.")
    for part in (f"TTFT {serve.light_ttft_ms:.2f} ms (Eq. 5)", f"TPOT {serve.wall_tpot_ms:.2f} ms (the wall",
                 f"saturation: {serve.ceiling_tok_s:.2f} tok/s", predicted.regime,
                 f"({predicted.knee_rate_req_s:.2f} req/s)", f"cap {serve.cap}"):
        assert part in caption, (part, caption)


def test_the_final_table_shows_aborted_requests_and_no_slo_rows_without_targets(served):
    measured = served.serve.measured
    odd = replace(served.serve, measured=replace(measured, aborted=3, request_goodput=None, slo_attainment_pct=None))
    lines = capture(render_summary([replace(served, serve=odd)]), 100)
    assert re.search(r"^Aborted requests +3 +– +–$", row_of(lines, "Aborted requests"))
    assert not any(line.startswith(("Request goodput", "SLO attainment")) for line in lines)
    assert "vLLM's figures" not in " ".join(capture(render_summary([PLAIN, STREAMS]), 100))


def test_every_mode_view_is_silent_outside_its_mode(served):
    """The seam render.py loops over: a mode's line, figures and table are None or empty for another mode's run."""
    assert len(MODE_VIEWS) >= 3
    overlap = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=12, mode="overlap", k=2, window=2))
    for view in MODE_VIEWS:
        shown = [summary for summary in (PLAIN, STREAMS, served, overlap)
                 if view.line(summary, True) is not None or view.parts(summary) or view.table([summary]) is not None]
        assert len(shown) == 1, (view, [s.mode for s in shown])  # its own run only
        assert view.line(PLAIN, True) is None and view.parts(PLAIN) == [] and view.table([PLAIN]) is None
        assert view.line(None, False) is None
