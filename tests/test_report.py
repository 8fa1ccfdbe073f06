"""`testbed report`: figures and report.md from recorded run summaries; bad input names the file and the key."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.report import build as report
from testbed.report import figures
from testbed.studies.dsd import figures as dsd_figures
from testbed.studies.place import figures as place_figures
from testbed.studies.regimes import figures as regime_figures
from testbed.studies.tp import figures as tp_figures
from testbed.studies.tree import figures as tree_figures
from testbed.studies.codecs.measure import CodecRow
from testbed.core.decode import HEAD_PLACEMENTS
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary
from testbed.studies.dsd.measure import CapacityRow, DsdResult, DsdRow, JitterRow, crossover
from testbed.studies.tp.measure import TpResult, TpRow
from testbed.studies.place.measure import Placement, PlaceResult
from testbed.studies.tree.measure import TreeFit, TreeRow, TreeSweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
PLAIN_FILE, SPEC_FILE, SWEEP_FILE = (DATA / name for name in (
    "summary-plain.json", "summary-speculative.json", "summary-sweep.json"))
PLAIN = RunSummary.from_json(PLAIN_FILE.read_text(encoding="utf-8"))
SPEC = RunSummary.from_json(SPEC_FILE.read_text(encoding="utf-8"))
SWEEP = [RunSummary.from_dict(item) for item in json.loads(SWEEP_FILE.read_text(encoding="utf-8"))]


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 10_000 and data.startswith(PNG_MAGIC), path


def markdown_row(markdown: str, source: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| {source} |"))


def cells(*values: str) -> str:
    return "| " + " | ".join(values) + " |"


def test_recorded_sweep_is_a_k_sweep():
    assert len(SWEEP) == 1 and SWEEP[0].spec is not None
    assert [row.k for row in SWEEP[0].spec.per_k] == [1, 2, 3]


def test_report_from_recorded_plain_speculative_and_sweep_runs(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    for file in (PLAIN_FILE, SPEC_FILE, SWEEP_FILE):
        shutil.copy(file, results / file.name)
    out = tmp_path / "out"

    assert report.main([str(results), "--out", str(out)]) == 0

    assert_png(out / "fig1_wall.png")
    assert_png(out / "fig2_spec.png")
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "![fig1_wall](fig1_wall.png)" in markdown and "![fig2_spec](fig2_spec.png)" in markdown
    for summary, source in ((PLAIN, results / PLAIN_FILE.name), (SPEC, results / SPEC_FILE.name),
                            (SWEEP[0], f"{results / SWEEP_FILE.name}[0]")):
        row = markdown_row(markdown, str(source))
        assert cells(f"{summary.t_ring_s * 1e3:.1f}", f"{summary.compute_s * 1e3:.1f}", str(summary.laps),
                     f"{summary.measured_tok_s:.2f}", f"{summary.predicted_tok_s:.2f}",
                     f"{summary.error_pct:+.1f}") in row, row
    spec = SPEC.spec
    speculation = markdown.split("## Speculation")[1]
    row = markdown_row(speculation, str(results / SPEC_FILE.name))
    assert cells(f"{spec.k:g}", f"{spec.alpha:.2f}", f"{spec.draft_per_token_s * 1e3:.2f}",
                 f"{spec.gamma_measured:.2f}", f"{spec.gamma_predicted:.2f}", f"{SPEC.measured_tok_s:.2f}",
                 f"{spec.predicted_tok_s:.2f}", f"{SPEC.error_pct:+.1f}", f"{spec.plain_predicted_tok_s:.2f}",
                 str(spec.k_star), f"{spec.k_star_tok_s:.2f}") in row, row
    sweep_rows = [line for line in markdown.split("## K sweeps")[1].splitlines() if SWEEP_FILE.name in line]
    for per_k in SWEEP[0].spec.per_k:
        assert any(cells(str(per_k.k), str(per_k.rounds), f"{per_k.gamma_measured:.2f}") in line
                   and f"| {per_k.formula_tok_s:.2f} |" in line for line in sweep_rows), per_k
    assert f"K* measured = {SWEEP[0].spec.k_star_measured}" in markdown
    assert str(out / "report.md") in capsys.readouterr().out


def test_report_reads_the_runs_own_prediction(tmp_path):
    odd = replace(SPEC, predicted_tok_s=12.34, error_pct=-42.0,
                  spec=replace(SPEC.spec, predicted_tok_s=12.34, gamma_predicted=5.67,
                               plain_predicted_tok_s=0.5, k_star=7, k_star_tok_s=8.9))
    source = write(tmp_path / "odd.json", odd.to_dict())
    assert report.main([str(source), "--out", str(tmp_path / "out")]) == 0
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "| 12.34 | -42.0 |" in markdown_row(markdown, str(source))
    assert "| 5.67 |" in markdown and "| 12.34 | -42.0 | 0.50 | 7 | 8.90 |" in markdown


def test_plain_results_only_write_no_spec_figure(tmp_path):
    out = tmp_path / "out"
    assert report.main([str(PLAIN_FILE), "--out", str(out)]) == 0
    assert_png(out / "fig1_wall.png")
    assert not (out / "fig2_spec.png").exists()
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "## Speculation" not in markdown and "## K sweeps" not in markdown
    assert f"| {PLAIN.t_ring_s * 1e3:.1f} | {PLAIN.compute_s * 1e3:.1f} |" in markdown


def test_compute_groups_split_distinct_ceilings():
    runs = [replace(PLAIN, compute_s=c) for c in (0.0083, 0.033, 0.0085, 0.034)]
    groups = figures.group_by_compute(runs)
    assert [[run.compute_s for run in group] for group in groups] == [[0.0083, 0.0085], [0.033, 0.034]]


def test_sweep_plots_one_measured_point_per_k():
    sweep = SWEEP[0]
    assert figures.measured_k_points(sweep) == [(row.k, row.measured_tok_s) for row in sweep.spec.per_k]
    assert figures.measured_k_points(SPEC) == [(SPEC.spec.k, SPEC.measured_tok_s)]


def without(data: dict, key: str) -> dict:
    return {k: v for k, v in data.items() if k != key}


PLAIN_DICT = PLAIN.to_dict()
SPEC_DICT = SPEC.to_dict()


@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "not JSON"),
    (json.dumps(without(PLAIN_DICT, "compute_s")), "missing field(s) compute_s"),
    (json.dumps({**PLAIN_DICT, "throughput": 3.0}), "unknown field(s) throughput"),
    (json.dumps({**PLAIN_DICT, "compute_s": None}), "compute_s: expected a number, got null"),
    (json.dumps({**PLAIN_DICT, "measured_tok_s": "fast"}), "measured_tok_s: expected a finite number, got 'fast'"),
    (json.dumps({**SPEC_DICT, "spec": without(SPEC_DICT["spec"], "gamma_measured")}),
     "spec: missing field(s) gamma_measured"),
    (json.dumps({**SPEC_DICT, "spec": None}), "spec: mode is 'speculative' but there is no spec object"),
    (json.dumps([PLAIN_DICT, {"scenario": "geo-ring"}]), "bad_summary.json[1]: not a run summary"),
    (json.dumps("a string"), "expected a JSON object"),
])
def test_bad_input_exits_2_naming_file_and_what_is_wrong(tmp_path, capsys, content, expected):
    bad = tmp_path / "bad_summary.json"
    bad.write_text(content, encoding="utf-8")
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bad_summary.json" in err and expected in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


def test_missing_file_and_empty_directory_exit_2(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope.json")]) == 2
    assert re.search(r"nope\.json: no such file", capsys.readouterr().err)
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert re.search(r"empty: directory holds no \*\.json", capsys.readouterr().err)


def test_module_entry_point_runs_without_traceback(tmp_path):
    bad = write(tmp_path / "broken.json", {"scenario": "geo-ring"})
    result = subprocess.run([sys.executable, "-m", "testbed.report.build", str(bad), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode == 2
    assert "broken.json" in result.stderr and "missing field(s)" in result.stderr and "t_ring_s" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- regime maps (`testbed regimes` JSON)

REGIMES_FILE = DATA / "regimes-small.json"  # a real `testbed regimes` run of tests/data/small.toml
REGIMES_DICT = json.loads(REGIMES_FILE.read_text(encoding="utf-8"))


def test_report_from_a_regimes_file_draws_streams_and_ttft_and_tables_every_row(tmp_path):
    out = tmp_path / "out"
    assert report.main([str(REGIMES_FILE), "--out", str(out)]) == 0

    assert_png(out / "fig3_streams.png")
    assert_png(out / "fig4_ttft.png")
    assert not (out / "fig1_wall.png").exists() and not (out / "fig2_spec.png").exists()  # no run summaries
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "![fig3_streams](fig3_streams.png)" in markdown and "![fig4_ttft](fig4_ttft.png)" in markdown
    table = [line for line in markdown.split("## Regimes")[1].splitlines() if line.startswith(f"| {REGIMES_FILE} |")]
    assert len(table) == len(REGIMES_DICT["rows"]) == 18
    for line, row in zip(table, REGIMES_DICT["rows"]):
        scale, unit = (1e3, "ms") if row["regime"] == "ttft" else (1.0, "tok/s")
        assert line == cells(str(REGIMES_FILE), row["regime"], row["label"], unit, f"{row['measured'] * scale:.2f}",
                             f"{row['predicted'] * scale:.2f}", f"{row['error_pct']:+.1f}")


def test_regimes_and_run_summaries_report_together(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for file in (PLAIN_FILE, REGIMES_FILE):
        shutil.copy(file, results / file.name)
    out = tmp_path / "out"
    assert report.main([str(results), "--out", str(out)]) == 0
    for name in ("fig1_wall.png", "fig3_streams.png", "fig4_ttft.png"):
        assert_png(out / name)
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "1 run summaries, 1 regime maps" in markdown
    assert markdown_row(markdown, str(results / PLAIN_FILE.name))
    assert markdown.index("## Measured vs predicted") < markdown.index("## Regimes")


def test_regime_series_group_by_batching_and_link_rate():
    result = report.load_inputs([REGIMES_FILE]).of("regimes")[0].result
    streams = regime_figures.streams_series([result])
    assert list(streams) == ["batching none", "batching continuous"]
    for name, rows in streams.items():
        expected = [r for r in REGIMES_DICT["rows"] if r["regime"] == "streams" and name.endswith(r["batching"])]
        assert [row.streams for row in rows] == [1, 2, 3, 6, 12]
        assert [row.measured for row in rows] == [r["measured"] for r in expected]
    ttft = regime_figures.ttft_series([result])
    assert list(ttft) == ["W unlimited", "W = 10 Mbit/s"]
    assert all([row.prompt_tokens for row in rows] == [16, 128, 240] for rows in ttft.values())
    two = regime_figures.streams_series([result, result])
    assert list(two) == ["small, batching none", "small, batching continuous"]
    assert len(two["small, batching none"]) == 10


def with_row(index: int, **changes) -> dict:
    rows = [dict(row) for row in REGIMES_DICT["rows"]]
    rows[index] = {key: value for key, value in {**rows[index], **changes}.items() if value != "drop"}
    return {**REGIMES_DICT, "rows": rows}


@pytest.mark.parametrize(("content", "expected"), [
    (with_row(3, measured="drop"), "not a regimes result: RegimesResult.rows[3]: missing field(s) measured"),
    (without(REGIMES_DICT, "stages"), "not a regimes result: RegimesResult: missing field(s) stages"),
    (with_row(0, speed=1.0), "RegimesResult.rows[0]: unknown field(s) speed"),
    (with_row(7, per_stream_tok_s=None), "rows[7].per_stream_tok_s: expected a number, got null"),
    (with_row(0, prompt_tokens=None), "rows[0].prompt_tokens: expected a number, got null"),
    (with_row(8, batching="greedy"), "rows[8].batching: expected one of none, continuous, got 'greedy'"),
    (with_row(1, regime="prefill"), "rows[1].regime: expected one of ttft, streams, decode, speculative"),
    (with_row(16, predicted="fast"), "rows[16].predicted: expected a finite number, got 'fast'"),
    ({**REGIMES_DICT, "rows": []}, "rows: expected at least one row"),
])
def test_bad_regimes_input_exits_2_naming_file_and_field(tmp_path, capsys, content, expected):
    bad = write(tmp_path / "bad_regimes.json", content)
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: " in err and expected in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


# ---------------------------------------------------------------- placement (`place --json`, `tp --json`)

REGIONS = ("us-east", "eu-west", "ap-south", "sa-east")
BEST_ORDER, WORST_ORDER = ("entry", "s2", "s1", "s3"), ("entry", "s3", "s1", "s2")


def place_result(measured: bool = True) -> PlaceResult:
    """What `place geo --measure --head-region eu-west --json F` writes: as given, best, worst, and the best order
    with a separate head (listed last, as place lists it)."""
    def placement(label, order, t_ring_s, predicted, measured_tok_s=None, head="entry"):
        regions = tuple(REGIONS[int(name[1:]) if name.startswith("s") else 0] for name in order)
        if head == "separate":
            order, regions = order + ("head",), regions + ("eu-west",)
        error = None if measured_tok_s is None else 100 * (measured_tok_s / predicted - 1)
        return Placement(order, regions, t_ring_s, predicted, measured_tok_s, error, label, head)

    rates = (4.71, 2.02, 4.40) if measured else (None, None, None)
    return PlaceResult("geo", "userspace" if measured else "-", 6, 0.310, (
        placement("as given", ("entry", "s1", "s2", "s3"), 0.262, 3.51),
        placement("best", BEST_ORDER, 0.182, 4.82, rates[0]),
        placement("worst", WORST_ORDER, 0.451, 2.07, rates[1]),
        placement("best, head in eu-west", BEST_ORDER, 0.197, 4.49, rates[2], head="separate"),
    ))


def tp_result() -> TpResult:
    """What `tp small --hop-scale 0.25,0.5,1 --json F` writes (rows as measured, the largest scale first)."""
    def row(scale, pp_ms, tp_ms, same=True):
        link_ms = 20.0 * scale
        pp_pred, tp_pred = 40.0 + 4 * link_ms, 2 * 4 * 2 * 3 * link_ms + 10.0
        return TpRow(scale, link_ms, pp_ms, pp_pred, tp_ms, tp_pred, tp_ms / pp_ms, tp_pred / pp_pred, 4.0,
                     3072.0, 1024.0, same)

    return TpResult("small", "userspace", 4, 4, "ring",
                    (row(1.0, 121.0, 975.0), row(0.25, 59.5, 255.0, same=False), row(0.5, 81.0, 495.0)))


PLACE_DICT, TP_DICT = place_result().to_dict(), tp_result().to_dict()


def test_report_from_place_and_tp_results_draws_fig5_fig6_and_tables_every_point(tmp_path):
    place_file, tp_file = write(tmp_path / "place.json", PLACE_DICT), write(tmp_path / "tp.json", TP_DICT)
    out = tmp_path / "out"
    assert report.main([str(place_file), str(tp_file), "--out", str(out)]) == 0

    assert_png(out / "fig5_placement.png")
    assert_png(out / "fig6_tp.png")
    assert not any((out / f"fig{i}_{name}.png").exists() for i, name in
                   ((1, "wall"), (2, "spec"), (3, "streams"), (4, "ttft")))
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "![fig5_placement](fig5_placement.png)" in markdown and "![fig6_tp](fig6_tp.png)" in markdown
    assert "0 run summaries, 0 regime maps, 1 placement searches, 1 PP-vs-TP sweeps" in markdown
    section = markdown.split("## Placement")[1]
    assert "place.json: geo, shaper userspace, all 6 orders searched, median T_ring 310.0 ms." in section
    table = [line for line in section.splitlines() if line.startswith(f"| {place_file} |")]
    # the separate head sits right under the best order it adds its agent to
    assert [line.split(" | ")[1] for line in table] == ["as given", "best", "best, head in eu-west", "worst"]
    assert table[0] == cells(str(place_file), "as given", "entry (us-east) -> s1 (eu-west) -> s2 (ap-south) -> "
                             "s3 (sa-east) -> entry", "262.0", "3.51", "–", "–")
    assert table[2] == cells(str(place_file), "best, head in eu-west", "entry (us-east) -> s2 (ap-south) -> "
                             "s1 (eu-west) -> s3 (sa-east) -> head (eu-west) -> entry", "197.0", "4.49", "4.40",
                             f"{100 * (4.40 / 4.49 - 1):+.1f}")
    tp = [line for line in section.splitlines() if line.startswith(f"| {tp_file} |")]
    assert [line.split(" | ")[1] for line in tp] == ["0.25", "0.5", "1"]  # by link latency
    row = TP_DICT["tp_rows"][1]
    assert tp[0] == cells(str(tp_file), "0.25", "5.0", "59.5", f"{row['pp_predicted_token_ms']:.1f}", "255.0",
                          f"{row['tp_predicted_token_ms']:.1f}", f"{row['ratio_measured']:.2f}",
                          f"{row['ratio_predicted']:.2f}", "4.00", "no")
    assert "tp.json: small, 4 agents, 4 layers, ring all-reduce, shaper userspace." in section


def test_place_tp_and_run_summaries_in_one_list_report_together(tmp_path):
    both = write(tmp_path / "both.json", [PLACE_DICT, place_result(measured=False).to_dict(), TP_DICT])
    inputs = report.load_inputs([both, PLAIN_FILE])
    assert [item.source for item in inputs.of("place")] == [f"{both}[0]", f"{both}[1]"]
    assert [item.source for item in inputs.of("tp")] == [f"{both}[2]"] and len(inputs.runs) == 1
    assert inputs.of("place")[0].result == place_result() and inputs.of("tp")[0].result == tp_result()
    out = tmp_path / "out"
    assert report.main([str(both), str(PLAIN_FILE), "--out", str(out)]) == 0
    for name in ("fig1_wall.png", "fig5_placement.png", "fig6_tp.png"):
        assert_png(out / name)
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert markdown.index("## Measured vs predicted") < markdown.index("## Placement")
    unmeasured = markdown_row(markdown.split(f"{both}[1]: geo")[1], f"{both}[1]")
    assert unmeasured.endswith("| 262.0 | 3.51 | – | – |"), unmeasured


def test_no_inputs_is_an_error_and_placement_results_alone_are_enough(tmp_path):
    with pytest.raises(ConfigError, match="no run summaries or results given"):
        report.load_inputs([])
    inputs = report.load_inputs([write(tmp_path / "tp.json", TP_DICT)])
    assert not inputs.runs and not inputs.of("regimes") and not inputs.of("place") and len(inputs.of("tp")) == 1


def group_labels(result: PlaceResult) -> list[list[str]]:
    return [[p.label for p in group] for group in place_figures.placement_groups(result)]


def test_a_separate_head_is_drawn_under_the_order_it_derives_from():
    result = place_result()
    assert group_labels(result) == [["as given"], ["best", "best, head in eu-west"], ["worst"]]
    # "as given" may be the best order itself: the label says which one the head was added to
    given = replace(result.placements[0], order=BEST_ORDER)
    assert group_labels(replace(result, placements=(given, *result.placements[1:]))) == [
        ["as given"], ["best", "best, head in eu-west"], ["worst"]]
    # a head whose order matches none is still drawn, last
    stray = replace(result.placements[3], order=("entry", "s9", "head"), label="odd, head in eu-west",
                    regions=REGIONS[:3])
    assert group_labels(replace(result, placements=(*result.placements[:3], stray)))[-1] == [stray.label]
    assert [row.hop_scale for row in tp_figures.tp_series(tp_result())] == [0.25, 0.5, 1.0]


def changed(data: dict, rows: str, index: int, **changes) -> dict:
    items = [dict(item) for item in data[rows]]
    items[index] = {key: value for key, value in {**items[index], **changes}.items() if value != "drop"}
    return {**data, rows: items}


@pytest.mark.parametrize(("content", "expected"), [
    (changed(PLACE_DICT, "placements", 3, head="side"),
     f"placements[3].head: expected one of {', '.join(HEAD_PLACEMENTS)}, got 'side'"),
    (changed(PLACE_DICT, "placements", 1, predicted_tok_s="fast"),
     "placements[1].predicted_tok_s: expected a finite number, got 'fast'"),
    (changed(PLACE_DICT, "placements", 2, t_ring_s=None), "placements[2].t_ring_s: expected a number, got null"),
    (changed(PLACE_DICT, "placements", 2, measured_tok_s=-1.0),
     "placements[2].measured_tok_s: expected a number >= 0, got -1.0"),
    (changed(PLACE_DICT, "placements", 0, regions=["us-east"]),
     "placements[0].regions: expected one region per stage (4), got 1"),
    (changed(PLACE_DICT, "placements", 0, order="entry,s1"), "placements[0].order: expected a non-empty list"),
    (changed(PLACE_DICT, "placements", 1, label=""), "placements[1].label: expected a non-empty string"),
    (changed(PLACE_DICT, "placements", 0, order="drop"),
     "not a placement result: PlaceResult.placements[0]: missing field(s) order"),
    ({**PLACE_DICT, "placements": []}, "placements: expected a non-empty list of placements"),
    ({**PLACE_DICT, "evaluated": -1}, "evaluated: expected an integer >= 0, got -1"),
    (changed(TP_DICT, "tp_rows", 1, tp_token_ms=0.0), "tp_rows[1].tp_token_ms: expected a number > 0, got 0.0"),
    (changed(TP_DICT, "tp_rows", 0, mean_link_ms=None), "tp_rows[0].mean_link_ms: expected a number, got null"),
    (changed(TP_DICT, "tp_rows", 2, same_tokens="yes"), "tp_rows[2].same_tokens: expected true or false"),
    (changed(TP_DICT, "tp_rows", 0, speed=1.0), "not a PP-vs-TP result: TpResult.tp_rows[0]: unknown field(s) speed"),
    ({**TP_DICT, "allreduce": "tree"}, "allreduce: expected one of ring, all-to-all, got 'tree'"),
    ({**TP_DICT, "ranks": 0}, "ranks: expected an integer >= 1, got 0"),
    ({**TP_DICT, "tp_rows": []}, "tp_rows: expected a non-empty list of rows"),
])
def test_bad_place_or_tp_input_exits_2_naming_file_and_field(tmp_path, capsys, content, expected):
    bad = write(tmp_path / "bad_placement.json", content)
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: " in err and expected in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


# ---------------------------------------------------------------- tree sweeps (`sweep --tree-n`) and codec tables

TREE_NS = (1, 4, 16, 64)


def tree_result() -> TreeSweep:
    """What `sweep small --tree-n 1,4,16,64 --rates 0,10 --json F` writes: f32 at two link rates, and their fits."""
    def row(rate, n, tokens, ring_ms, measured):
        lap = 12.0 + ring_ms
        predicted = 1e3 * tokens / lap
        return TreeRow("f32", rate, float(n), 6, tokens, lap, 4.0, 8.0, ring_ms, ring_ms - 80.0, 1052.0 * (n + 1),
                       measured, predicted, 100 * (measured / predicted - 1))

    unlimited = [row(0.0, n, 1.6 + 0.5 * math.log(n), 80.0, 1e3 * (1.6 + 0.5 * math.log(n)) / 95.0)
                 for n in TREE_NS]
    slow = [row(10.0, n, 1.6 + 0.5 * math.log(n), 80.0 + 3.4 * (n + 1), 1e3 * (1.6 + 0.5 * math.log(n)) /
                (95.0 + 3.4 * (n + 1))) for n in TREE_NS]
    fits = (TreeFit("f32", 0.0, 1.6, 0.5, 64.0, 64.0, None, None),
            TreeFit("f32", 10.0, 1.58, 0.51, 16.0, 4.0, 23.5, 31.2))
    return TreeSweep("small", "userspace", 0.080, "best-first", (*unlimited, *slow), fits)


def codec_rows() -> list[CodecRow]:
    """What `codecs small --measure --json F` writes, the last row without a TTFT run."""
    return [CodecRow("f32", 64, 1052, 131_100, 1.0, 21.0, 9.0, 1.0, 0.0, 0.7131, 0.5123, 0.4987, 131_100),
            CodecRow("f16", 64, 540, 65_564, 0.5001, 35.0, 30.0, 0.9991, 2.1e-6, 0.7130, 0.3012, 0.2950, 65_564),
            CodecRow("int8-block", 64, 300, 34_844, 0.2658, 140.0, 95.0, 0.9874, 3.4e-4, 0.7102, 0.1987, 0.1902,
                     34_844),
            CodecRow("int8-block", 16, 348, 41_000, 0.3127, 150.0, 99.0, 0.9930, 1.2e-4, 0.7119)]


TREE_DICT, CODEC_DICTS = tree_result().to_dict(), [row.to_dict() for row in codec_rows()]


def test_report_from_tree_and_codec_results_draws_fig7_and_tables_every_row(tmp_path):
    tree_file, codec_file = write(tmp_path / "tree.json", TREE_DICT), write(tmp_path / "codecs.json", CODEC_DICTS)
    out = tmp_path / "out"
    assert report.main([str(tree_file), str(codec_file), "--out", str(out)]) == 0

    assert_png(out / "fig7_tree.png")
    assert sorted(path.name for path in out.glob("*.png")) == ["fig7_tree.png"]
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "![fig7_tree](fig7_tree.png)" in markdown
    assert ("0 PP-vs-TP sweeps, 1 tree sweeps, 4 codec rows, 0 DSD results, 0 acceptance calibrations, 0 overlap "
            "studies, 0 faults results, 0 deployments, 0 probes, 0 transport checks, 0 weight distributions, 0 searches, "
            "0 serving studies, 0 reproductions, 0 bench runs.") in markdown
    assert markdown.index("## Tree speculation") < markdown.index("## Wire codecs")
    section = markdown.split("## Tree speculation")[1].split("## Wire codecs")[0]
    assert "tree.json: small, best-first policy, T_ring 80.0 ms, shaper userspace." in section
    table = [line for line in section.splitlines() if line.startswith(f"| {tree_file} |")]
    assert len(table) == len(TREE_DICT["tree_rows"])
    for line, row in zip(table, tree_result().tree_rows, strict=True):
        rate = f"{row.rate_mbit:g}" if row.rate_mbit else "unlimited"
        assert line == cells(str(tree_file), "f32", rate, f"{row.n:g}", f"{row.tokens_per_round:.2f}",
                             f"{row.lap_ms:.1f}", f"{row.bytes_per_hop:.0f}", f"{row.measured_tok_s:.2f}",
                             f"{row.predicted_tok_s:.2f}", f"{row.error_pct:+.1f}")
    assert "- f32, unlimited: L(n) = 1.60 + 0.50 ln n; best n measured 64, predicted 64\n" in section
    assert ("- f32, 10 Mbit/s: L(n) = 1.58 + 0.51 ln n; best n measured 16, predicted 4; W* predicted 24, "
            "measured 31\n\n## Wire codecs") in markdown
    codecs = [line for line in markdown.split("## Wire codecs")[1].splitlines() if line.startswith(f"| {codec_file}")]
    assert [line.split(" | ")[0:2] for line in codecs] == [[f"| {codec_file}[{i}]", label] for i, label in
                                                            enumerate(("f32", "f16", "int8-block (block 64)",
                                                                       "int8-block (block 16)"))]
    assert codecs[2] == cells(f"{codec_file}[2]", "int8-block (block 64)", "300", "34844", "0.266", "140", "95",
                              "0.9874", "3.40e-04", "0.7102", "198.7 / 190.2")
    assert codecs[3].endswith("| 0.9930 | 1.20e-04 | 0.7119 | – |"), codecs[3]


def test_tree_sweeps_codec_rows_and_run_summaries_in_one_list_report_together(tmp_path):
    mixed = write(tmp_path / "mixed.json", [CODEC_DICTS[0], PLAIN_DICT, TREE_DICT, CODEC_DICTS[3]])
    inputs = report.load_inputs([mixed])
    assert [item.source for item in inputs.of("codecs")] == [f"{mixed}[0]", f"{mixed}[3]"]
    assert [item.row for item in inputs.of("codecs")] == [codec_rows()[0], codec_rows()[3]]
    assert [item.source for item in inputs.of("tree")] == [f"{mixed}[2]"] and inputs.of("tree")[0].result == tree_result()
    assert [item.source for item in inputs.runs] == [f"{mixed}[1]"]
    out = tmp_path / "out"
    assert report.main([str(mixed), "--out", str(out)]) == 0
    for name in ("fig1_wall.png", "fig7_tree.png"):
        assert_png(out / name)
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert markdown.index("## Measured vs predicted") < markdown.index("## Tree speculation")


def test_codec_rows_alone_are_enough_and_draw_no_figure(tmp_path):
    out = tmp_path / "out"
    assert report.main([str(write(tmp_path / "codecs.json", CODEC_DICTS)), "--out", str(out)]) == 0
    assert not list(out.glob("*.png"))
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "## Wire codecs" in markdown and "## Tree speculation" not in markdown


def test_tree_series_group_by_codec_and_rate_each_by_n():
    result = tree_result()
    shuffled = replace(result, tree_rows=tuple(reversed(result.tree_rows)))
    series = tree_figures.tree_series(shuffled)
    assert list(series) == [("f32", 10.0), ("f32", 0.0)]  # in the order the sweep ran them
    assert all([row.n for row in rows] == list(TREE_NS) for rows in series.values())
    assert tree_figures.fit_of(result, "f32", 10.0) == result.fits[1]
    assert tree_figures.fit_of(result, "f16", 10.0) is None


def test_fig7_draws_a_single_width_and_a_sweep_without_fits(tmp_path):
    result = tree_result()
    one = replace(result, tree_rows=result.tree_rows[4:5], fits=(replace(result.fits[1], w_star_measured=None),))
    tree_figures.plot_tree([one, replace(result, scenario="geo", fits=())], tmp_path / "fig7.png")
    assert_png(tmp_path / "fig7.png")


@pytest.mark.parametrize(("content", "expected"), [
    (changed(TREE_DICT, "tree_rows", 2, n=0), "tree_rows[2].n: expected a number > 0, got 0"),
    (changed(TREE_DICT, "tree_rows", 0, codec="f8"), "tree_rows[0].codec: expected one of f32, f16, int8-block, "
                                                     "got 'f8'"),
    (changed(TREE_DICT, "tree_rows", 5, lap_ms=None), "tree_rows[5].lap_ms: expected a number, got null"),
    (changed(TREE_DICT, "tree_rows", 1, measured_tok_s="fast"),
     "tree_rows[1].measured_tok_s: expected a finite number, got 'fast'"),
    (changed(TREE_DICT, "tree_rows", 3, rounds=0), "tree_rows[3].rounds: expected an integer >= 1, got 0"),
    (changed(TREE_DICT, "tree_rows", 6, bytes_per_hop="drop"),
     "not a tree sweep: TreeSweep.tree_rows[6]: missing field(s) bytes_per_hop"),
    (changed(TREE_DICT, "fits", 1, w_star_predicted=-3.0), "fits[1].w_star_predicted: expected a number > 0"),
    (changed(TREE_DICT, "fits", 0, b=None), "fits[0].b: expected a number, got null"),
    (changed(TREE_DICT, "fits", 1, rate_mbit=5.0), "fits[1]: no tree_rows at f32, 5 Mbit/s to fit"),
    ({**TREE_DICT, "tree_rows": []}, "tree_rows: expected at least one row"),
    ({**TREE_DICT, "t_ring_s": -0.1}, "t_ring_s: expected a number >= 0, got -0.1"),
])
def test_bad_tree_input_exits_2_naming_file_and_field(tmp_path, capsys, content, expected):
    bad = write(tmp_path / "bad_tree.json", content)
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: " in err and expected in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


@pytest.mark.parametrize(("index", "changes", "expected"), [
    (1, {"greedy_agreement": 1.5}, "greedy_agreement: expected a number in [0, 1], got 1.5"),
    (2, {"alpha_hat": "high"}, "alpha_hat: expected a finite number, got 'high'"),
    (2, {"block": 0}, "block: expected an integer >= 1, got 0"),
    (0, {"codec": "zip"}, "codec: expected one of f32, f16, int8-block, got 'zip'"),
    (0, {"ttft_predicted_s": None}, "ttft_predicted_s: expected TTFT measured and predicted both or neither"),
    (3, {"ttft_measured_s": -1.0}, "ttft_measured_s: expected a number >= 0, got -1.0"),
    (1, {"speed": 1.0}, "not a codec row: CodecRow: unknown field(s) speed"),
])
def test_bad_codec_row_exits_2_naming_file_row_and_field(tmp_path, capsys, index, changes, expected):
    bad = write(tmp_path / "bad_codecs.json", changed({"rows": CODEC_DICTS}, "rows", index, **changes)["rows"])
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}[{index}]: {expected}" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


# ---------------------------------------------------------------- speculation at a distance (`dsd --json`)

DSD_RTTS = (5.0, 10.0, 20.0, 50.0, 100.0, 200.0)


def dsd_result() -> DsdResult:
    """What `dsd edge-cloud --rtts 5,10,20,50,100,200 --clients 1,2,4,8 --jitters 0,20 --json F` writes, the rows
    as measured (by RTT), the batched capacity row last."""
    def row(rtt):
        return DsdRow(rtt, 740.0 + rtt, 738.0 + rtt, 750.0 + 10 * rtt, 745.0 + 10 * rtt, 700.0 + 4 * rtt,
                      702.0 + 4 * rtt, 800.0 + rtt, 798.0 + rtt, 0.79, 10.4, 20.9, 0.42)

    rows = tuple(row(rtt) for rtt in DSD_RTTS)
    capacity = tuple(CapacityRow(e, "none", 48.9 * min(e, 3), 52.6 * min(e, 3), min(0.3 * e, 0.9), 1.0, 20.4,
                                 48.9 * min(e, 3) / e) for e in (1, 2, 4, 8))
    capacity += (CapacityRow(8, "continuous", 307.6, 331.4, 0.77, 3.02, 24.4, 38.4),)
    jitter = (JitterRow(200.0, 0.0, 2791.7, 2757.2, 1.25, 0.79, 10.1, 20.5, 264.1),
              JitterRow(200.0, 20.0, 2936.4, 2753.8, 6.63, None, 10.1, 20.5, 273.6))
    return DsdResult("edge-cloud", "userspace", 4, 40, rows, crossover(list(rows)), 14.2,
                     crossover(list(rows), "sync", "autoregressive"), 6.1, 54.1, capacity, 146.7 / 54.1, 2.99, jitter,
                     27.0, 2, 2)


DSD_DICT = dsd_result().to_dict()


def test_report_from_a_dsd_result_draws_fig8_and_tables_every_row(tmp_path):
    dsd_file = write(tmp_path / "dsd.json", DSD_DICT)
    out = tmp_path / "out"
    assert report.main([str(dsd_file), "--out", str(out)]) == 0

    assert_png(out / "fig8_dsd.png")
    assert sorted(path.name for path in out.glob("*.png")) == ["fig8_dsd.png"]
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "![fig8_dsd](fig8_dsd.png)" in markdown and (
        "0 codec rows, 1 DSD results, 0 acceptance calibrations, 0 overlap studies, 0 faults results, 0 deployments, "
        "0 probes, 0 transport checks, 0 weight distributions, 0 searches, 0 serving studies, 0 reproductions, "
        "0 bench runs.") in markdown
    section = markdown.split("## Speculation at a distance")[1]
    assert "dsd.json: edge-cloud, K = 4, 40 tokens a request, shaper userspace." in section
    table = [line for line in section.splitlines() if line.startswith(f"| {dsd_file} |")]
    latency, capacity, jitter = table[:6], table[6:11], table[11:]
    assert [line.split(" | ")[1] for line in latency] == ["5", "10", "20", "50", "100", "200"]
    assert latency[2] == cells(str(dsd_file), "20", "760 / 758", "950 / 945", "780 / 782", "820 / 818", "0.790",
                               "10.40", "20.90", "0.42")
    crossovers = dsd_result().crossover_rtt_ms, dsd_result().ar_crossover_rtt_ms
    assert (f"- crossover RTT (measured / predicted): pipelined DSD beats co-located SD below {crossovers[0]:.1f} ms "
            f"/ 14.2 ms; synchronous DSD beats cloud AR below {crossovers[1]:.1f} ms / 6.1 ms\n") in section
    assert [line.split(" | ")[1:3] for line in capacity] == [["1", "none"], ["2", "none"], ["4", "none"],
                                                             ["8", "none"], ["8", "continuous"]]
    assert capacity[3] == cells(str(dsd_file), "8", "none", "146.7 / 157.8", "18.3", "90%", "1.00", "20.4")
    assert capacity[4] == cells(str(dsd_file), "8", "continuous", "307.6 / 331.4", "38.4", "77%", "3.02", "24.4")
    assert "(co-located server: 54.1 tok/s)" in section
    assert "- multiplier: 2.71 measured (the most clients without batching over the co-located server), " \
           "1 + K t_d / t_v = 2.99 predicted\n" in section
    assert "- clients sustained at 27.0 tok/s a client: 2 with the server drafting for them, 2 with the drafts " \
           "offloaded (of those measured)" in section
    assert jitter == [cells(str(dsd_file), "200", "0", "2792 / 2757", "+1.2", "264.1", "0.790", "10.10", "20.50"),
                      cells(str(dsd_file), "200", "20", "2936 / 2754", "+6.6", "273.6", "–", "10.10", "20.50")]


def test_a_dsd_result_with_nulls_and_no_capacity_or_jitter_runs_reports_with_other_inputs(tmp_path):
    result = dsd_result()
    bare = replace(result, dsd_rows=(replace(result.dsd_rows[0], rtt_ms=0.0, alpha_hat=None),), capacity=(),
                   jitter=(), crossover_rtt_ms=None, crossover_predicted_rtt_ms=0.0, ar_crossover_rtt_ms=None,
                   ar_crossover_predicted_rtt_ms=-12.5, multiplier_measured=None, clients_offloaded=0)
    mixed = write(tmp_path / "mixed.json", [TREE_DICT, bare.to_dict(), DSD_DICT])
    inputs = report.load_inputs([mixed])
    assert [item.source for item in inputs.of("dsd")] == [f"{mixed}[1]", f"{mixed}[2]"]
    assert [item.result for item in inputs.of("dsd")] == [bare, result] and len(inputs.of("tree")) == 1
    out = tmp_path / "out"
    assert report.main([str(mixed), "--out", str(out)]) == 0
    for name in ("fig7_tree.png", "fig8_dsd.png"):
        assert_png(out / name)
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert markdown.index("## Tree speculation") < markdown.index("## Speculation at a distance")
    section = markdown.split(f"{mixed}[2]: edge-cloud")[0].split("## Speculation at a distance")[1]
    assert markdown_row(section, f"{mixed}[1]") == cells(f"{mixed}[1]", "0", "745 / 743", "800 / 795", "720 / 722",
                                                         "805 / 803", "–", "10.40", "20.90", "0.42")
    assert ("pipelined DSD beats co-located SD below not on the grid / never (0.0 ms); synchronous DSD beats cloud "
            "AR below not on the grid / never (-12.5 ms)") in section
    assert f"{mixed}[1]: no capacity runs (`dsd --clients`)." in section and "jitter (ms)" not in section
    assert markdown.count("| jitter (ms) |") == 1  # the full result's only


def test_capacity_series_puts_no_batching_first_each_by_clients_and_fig8_draws_several_results(tmp_path):
    result = dsd_result()
    shuffled = replace(result, capacity=tuple(reversed(result.capacity)))
    series = dsd_figures.capacity_series(shuffled)
    assert list(series) == ["none", "continuous"]
    assert [row.clients for row in series["none"]] == [1, 2, 4, 8]
    assert [row.rtt_ms for row in dsd_figures.dsd_series(replace(result, dsd_rows=result.dsd_rows[::-1]))] == \
        list(DSD_RTTS)
    one = replace(result, scenario="edge-far", dsd_rows=result.dsd_rows[:1], capacity=(), crossover_rtt_ms=None)
    dsd_figures.plot_dsd([result, one], tmp_path / "fig8.png")
    assert_png(tmp_path / "fig8.png")


@pytest.mark.parametrize(("content", "expected"), [
    (changed(DSD_DICT, "dsd_rows", 2, sync_ms=0.0), "dsd_rows[2].sync_ms: expected a number > 0, got 0.0"),
    (changed(DSD_DICT, "dsd_rows", 0, rtt_ms=-5.0), "dsd_rows[0].rtt_ms: expected a number >= 0, got -5.0"),
    (changed(DSD_DICT, "dsd_rows", 1, hit_rate=1.6), "dsd_rows[1].hit_rate: expected a number in [0, 1.5], got 1.6"),
    (changed(DSD_DICT, "dsd_rows", 3, pipelined_predicted_ms=None),
     "dsd_rows[3].pipelined_predicted_ms: expected a number, got null"),
    (changed(DSD_DICT, "dsd_rows", 4, alpha_hat="high"), "dsd_rows[4].alpha_hat: expected a finite number, got 'high'"),
    (changed(DSD_DICT, "dsd_rows", 5, verify_ms="drop"),
     "not a DSD result: DsdResult.dsd_rows[5]: missing field(s) verify_ms"),
    (changed(DSD_DICT, "capacity", 4, batching="greedy"),
     "capacity[4].batching: expected one of none, continuous, got 'greedy'"),
    (changed(DSD_DICT, "capacity", 1, server_busy=2.0), "capacity[1].server_busy: expected a number in [0, 1.5], got 2.0"),
    (changed(DSD_DICT, "capacity", 0, aggregate_tok_s=-1.0),
     "capacity[0].aggregate_tok_s: expected a number >= 0, got -1.0"),
    (changed(DSD_DICT, "capacity", 2, clients=0), "capacity[2].clients: expected an integer >= 1, got 0"),
    (changed(DSD_DICT, "jitter", 1, predicted_request_ms=0), "jitter[1].predicted_request_ms: expected a number > 0"),
    (changed(DSD_DICT, "jitter", 0, error_pct=None), "jitter[0].error_pct: expected a number, got null"),
    ({**DSD_DICT, "colocated_tok_s": -54.1}, "colocated_tok_s: expected a number >= 0, got -54.1"),
    ({**DSD_DICT, "crossover_predicted_rtt_ms": None}, "crossover_predicted_rtt_ms: expected a number, got null"),
    ({**DSD_DICT, "multiplier_measured": "x3"}, "multiplier_measured: expected a finite number, got 'x3'"),
    ({**DSD_DICT, "k": 0}, "k: expected an integer >= 1, got 0"),
    ({**DSD_DICT, "clients_offloaded": 1.5}, "clients_offloaded: expected an integer >= 0, got 1.5"),
    ({**DSD_DICT, "dsd_rows": []}, "dsd_rows: expected at least one row"),
    ({**DSD_DICT, "capacity": None}, "capacity: expected a list of rows, got None"),
])
def test_bad_dsd_input_exits_2_naming_file_and_field(tmp_path, capsys, content, expected):
    bad = write(tmp_path / "bad_dsd.json", content)
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: " in err and expected in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()
