"""`testbed report`: figures and report.md from recorded run summaries; bad input names the file and the key."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from testbed import figures, placement_figures, report
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary
from testbed.parallel import TpResult, TpRow
from testbed.place import Placement, PlaceResult

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
                  spec=replace(SPEC.spec, predicted_tok_s=12.34, gamma_predicted=5.67, plain_predicted_tok_s=0.5,
                               k_star=7, k_star_tok_s=8.9))
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
    result = subprocess.run([sys.executable, "-m", "testbed.report", str(bad), "--out", str(tmp_path / "o")],
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
    result = report.load_inputs([REGIMES_FILE]).regimes[0].result
    streams = figures.streams_series([result])
    assert list(streams) == ["batching none", "batching continuous"]
    for name, rows in streams.items():
        expected = [r for r in REGIMES_DICT["rows"] if r["regime"] == "streams" and name.endswith(r["batching"])]
        assert [row.streams for row in rows] == [1, 2, 3, 6, 12]
        assert [row.measured for row in rows] == [r["measured"] for r in expected]
    ttft = figures.ttft_series([result])
    assert list(ttft) == ["W unlimited", "W = 10 Mbit/s"]
    assert all([row.prompt_tokens for row in rows] == [16, 128, 240] for rows in ttft.values())
    two = figures.streams_series([result, result])
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
    assert [item.source for item in inputs.placements] == [f"{both}[0]", f"{both}[1]"]
    assert [item.source for item in inputs.tp] == [f"{both}[2]"] and len(inputs.runs) == 1
    assert inputs.placements[0].result == place_result() and inputs.tp[0].result == tp_result()
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
    assert not inputs.runs and not inputs.regimes and not inputs.placements and len(inputs.tp) == 1


def group_labels(result: PlaceResult) -> list[list[str]]:
    return [[p.label for p in group] for group in placement_figures.placement_groups(result)]


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
    assert [row.hop_scale for row in placement_figures.tp_series(tp_result())] == [0.25, 0.5, 1.0]


def changed(data: dict, rows: str, index: int, **changes) -> dict:
    items = [dict(item) for item in data[rows]]
    items[index] = {key: value for key, value in {**items[index], **changes}.items() if value != "drop"}
    return {**data, rows: items}


@pytest.mark.parametrize(("content", "expected"), [
    (changed(PLACE_DICT, "placements", 3, head="side"), "placements[3].head: expected one of entry, separate, "
                                                        "got 'side'"),
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
