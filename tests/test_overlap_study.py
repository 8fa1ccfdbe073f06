"""The overlap study (testbed.studies.overlap) on virtual time: every rate measured equals its closed form, the gain
over synchronous speculation exceeds 1 on the geo ring and grows with T_ring, the report's section and figure, and
bad options named with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import testbed
from testbed import cli
from testbed.report import build as report
from testbed.studies import STUDIES
from testbed.studies.overlap.figures import parse_overlap
from testbed.studies.overlap.measure import RINGS, OverlapResult
from tests.ringutil import EXACT

pytestmark = pytest.mark.exact

TOKENS = 40  # ~10 rounds a run at K 5, alpha 0.8: a run is a fraction of a second on virtual time
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def study_json(tmp_path_factory) -> Path:
    """`testbed overlap` at its defaults but a small --tokens: the four rings at W 4, its JSON under a temporary
    directory."""
    path = tmp_path_factory.mktemp("overlap") / "overlap.json"
    assert cli.main(["overlap", "--tokens", str(TOKENS), "--json", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def result(study_json) -> OverlapResult:
    return OverlapResult.from_json(study_json.read_text())


def small_overlap_result() -> OverlapResult:
    """The geo ring alone at W 4 (three short runs: about a second once the models are loaded)."""
    return testbed.study("overlap", rings="geo", tokens=TOKENS)


def test_the_study_is_registered_on_virtual_time_by_default():
    study = STUDIES["overlap"]
    assert study.report is not None and study.report.key == "overlap_rows" and not study.scenario
    args = study.parser().parse_args([])
    assert (args.shaper, args.k, args.alpha, args.draft_ms, args.temperature, args.window, args.tokens) == (
        "virtual", 5, 0.8, 5.0, 0.7, "4", 160)


def test_every_rate_measured_equals_its_closed_form(result):
    """On virtual time the overlapped rate is its realized closed form (physics.overlap_run_s over the runs), to
    1e-6; plain decode 1 / (C + T_ring) and synchronous speculation r_spec with the measured Gamma too."""
    assert [row.ring for row in result.overlap_rows] == [name for name, _ in RINGS]
    assert [row.t_ring_ms for row in result.overlap_rows] == pytest.approx([0.0, 2.1, 21.0, 280.0])
    for row in result.overlap_rows:
        assert row.queue_free, row.ring
        assert row.overlap_tok_s == pytest.approx(row.overlap_predicted_tok_s, rel=EXACT), row.ring
        assert row.plain_tok_s == pytest.approx(row.plain_predicted_tok_s, rel=EXACT), row.ring
        assert row.sync_tok_s == pytest.approx(row.sync_predicted_tok_s, rel=EXACT), row.ring
        assert row.plain_predicted_tok_s == pytest.approx(1e3 / (row.compute_ms + row.t_ring_ms), rel=1e-9)
        assert abs(row.error_pct) < EXACT * 100


def test_every_ring_runs_the_same_tokens(result):
    """One prompt, draft and seed on every ring: the same Gamma and h, so the rates differ by T_ring alone."""
    first = result.overlap_rows[0]
    for row in result.overlap_rows:
        assert (row.gamma, row.hit_rate, row.rounds, row.runs) == (first.gamma, first.hit_rate, first.rounds,
                                                                   first.runs), row.ring
        assert row.compute_ms == pytest.approx(33.0, rel=1e-9)


def test_the_gain_exceeds_1_on_the_geo_ring_and_grows_with_t_ring(result):
    rows = sorted(result.overlap_rows, key=lambda row: row.t_ring_ms)
    geo = rows[-1]
    assert geo.ring == "geo" and geo.gain_measured > 1.2 and geo.gain_predicted > 1.2
    for shorter, longer in zip(rows, rows[1:]):
        assert longer.gain_measured > shorter.gain_measured, (shorter.ring, longer.ring)
        assert longer.gain_predicted > shorter.gain_predicted, (shorter.ring, longer.ring)
    for row in rows:
        assert row.gain_measured == pytest.approx(row.overlap_tok_s / row.sync_tok_s, rel=1e-12)
        assert row.sync_tok_s < row.overlap_tok_s <= row.overlap_bound_tok_s * (1 + EXACT)
        assert row.gain_predicted <= row.gain_bound * (1 + EXACT) and row.gain_bound < 1 / (1 - row.hit_rate)


def test_a_wider_window_gains_up_to_the_bound():
    """--window 1,4 on the geo ring: one plain and one synchronous run, an overlapped run a window."""
    found = testbed.study("overlap", rings="geo", window=[1, 4], tokens=TOKENS)
    one, four = found.overlap_rows
    assert (one.window, four.window) == (1, 4) and one.sync_tok_s == four.sync_tok_s
    assert 1 < one.gain_measured < four.gain_measured <= four.gain_bound * (1 + EXACT)
    assert one.overlap_tok_s == pytest.approx(one.overlap_predicted_tok_s, rel=EXACT)


def test_the_json_reads_back_and_the_report_draws_it(study_json, result, tmp_path):
    assert json.loads(result.to_json()) == json.loads(study_json.read_text())
    assert parse_overlap(json.loads(study_json.read_text()), str(study_json)).result == result
    out = tmp_path / "report"
    assert report.main([str(study_json), "--out", str(out)]) == 0
    assert (out / "fig11_overlap.png").read_bytes()[:8] == PNG
    markdown = (out / "report.md").read_text()
    assert "## Overlapped speculation" in markdown and "1 overlap studies" in markdown
    geo = result.overlap_rows[-1]
    assert (f"| {study_json} | geo | 280 | 33.0 | {geo.plain_tok_s:.2f} / {geo.plain_predicted_tok_s:.2f} |"
            in markdown)
    assert "Overlap cannot help where h is small" in markdown


def test_a_bad_result_is_named_by_its_field(study_json, tmp_path, capsys):
    data = json.loads(study_json.read_text())
    data["overlap_rows"][1]["hit_rate"] = 1.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "overlap_rows[1].hit_rate" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--window", "0"], "--window"),
    (["--window", "4,65"], "--window"),
    (["--window", "wide"], "--window"),
    (["--rings", "geo,mars"], "--rings"),
    (["--k", "0"], "--k"),
    (["--k", "five"], "--k"),
    (["--alpha", "1.5"], "--alpha"),
    (["--tokens", "0"], "--tokens"),
    (["--draft-ms", "-1"], "--draft-ms"),
    (["--shaper", "carrier-pigeon"], "--shaper"),
])
def test_bad_options_exit_2_naming_the_option(argv, flag, capsys):
    try:
        code = cli.main(["overlap", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out = capsys.readouterr()
    assert code == 2
    assert flag in out.out + out.err and "Traceback" not in out.out + out.err
