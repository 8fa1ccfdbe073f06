"""The serve study (testbed.studies.serve) on virtual time: its files, the wall at light load, the search for the
highest rate meeting the SLO, the report's section, and bad flags named with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.modes.serve.slo import request_ms
from testbed import cli
from testbed.api import serve
from testbed.report import build as report
from testbed.studies import STUDIES
from testbed.studies.base import make_scenario
from testbed.studies.serve.figures import parse_serve
from testbed.studies.serve.result import ServeResult

ROOT = Path(__file__).resolve().parent.parent
# A small workload: short prompts and outputs, a cap of 4, so each run takes a fraction of a second.
SMALL = ["--prompt-tokens", "16", "--output-tokens", "8", "--streams", "4"]
SMALL_KEYS = {"prompt_tokens": 16, "output_tokens": 8, "streams": 4}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def study_files(tmp_path_factory) -> Path:
    """`testbed serve` at a light rate (constant arrivals 10 s apart: each request alone on the ring) and at
    1 req/s, its files written under a temporary directory."""
    path = tmp_path_factory.mktemp("serve") / "serve-geo-ring.json"
    argv = ["serve", "geo-ring", "--rates", "0.1,1", "--arrival", "constant", "--requests", "6", *SMALL,
            "--goodput", "ttft:1000", "tpot:400", "--json", str(path)]
    assert cli.main(argv) == 0
    return path


def test_the_study_is_registered_with_its_report_part():
    study = STUDIES["serve"]
    assert study.report is not None and study.report.key == "serve_rows"
    args = study.parser().parse_args([])
    assert (args.scenario, args.shaper, args.attainment) == ("geo-ring", "virtual", 90.0)  # virtual time by default


def test_the_json_is_written_and_reads_back(study_files):
    text = study_files.read_text()
    result = ServeResult.from_json(text)
    assert json.loads(result.to_json()) == json.loads(text)  # every field survives the round trip
    assert [row.rate_req_s for row in result.serve_rows] == [0.1, 1.0]
    assert result.goodput == "ttft:1000 tpot:400" and result.cap == 4 and result.requests_jsonl
    assert all(row.records == () for row in result.serve_rows)  # the records are in the JSON lines, not here
    assert parse_serve(json.loads(text), str(study_files)).result == result
    table = [line for line in study_files.with_suffix(".md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 2  # the header and a row per rate


def test_at_a_light_rate_every_request_decodes_at_the_wall(study_files):
    result = ServeResult.from_json(study_files.read_text())
    scenario = make_scenario("geo-ring")
    wall_ms = (scenario.emulated_compute_s + scenario.t_ring_s) * 1e3  # C + T_ring: a token a lap
    light = result.serve_rows[0]
    assert result.wall_tpot_ms == pytest.approx(wall_ms, rel=1e-9)
    assert light.measured.median_tpot_ms == pytest.approx(wall_ms, rel=1e-6)
    assert light.measured.p99_tpot_ms == pytest.approx(wall_ms, rel=1e-6)
    assert light.measured.median_ttft_ms == pytest.approx(result.light_ttft_ms, rel=1e-6)  # Eq. 5
    assert light.measured.slo_attainment_pct == 100.0 and light.met
    assert abs(light.model_error_pct.p50_ttft) < 1e-4  # the model's light load: Eq. 5


def test_the_model_error_is_reported_per_percentile_below_the_knee(study_files):
    """Issue 54: the queueing model within 5% of the virtual run's p50 TTFT and TPOT below the knee."""
    result = ServeResult.from_json(study_files.read_text())
    for row in result.serve_rows:
        assert row.rate_req_s < result.knee_rate_req_s
        error = row.model_error_pct
        assert error.p50_ttft == pytest.approx((row.predicted.median_ttft_ms / row.measured.median_ttft_ms - 1) * 100)
        assert abs(error.p50_ttft) < 5 and abs(error.p50_tpot) < 5, (row.rate_req_s, error)


def test_the_requests_file_has_a_line_per_request(study_files):
    result = ServeResult.from_json(study_files.read_text())
    lines = Path(result.requests_jsonl).read_text().splitlines()
    assert len(lines) == sum(r.measured.completed + r.measured.aborted for r in result.serve_rows) == 2 * 6
    records = [json.loads(line) for line in lines]
    for rate in (0.1, 1.0):
        assert sorted(r["index"] for r in records if r["rate_req_s"] == rate) == list(range(6))
    light = [r for r in records if r["rate_req_s"] == 0.1]
    assert all(r["tpot_ms"] == pytest.approx(result.wall_tpot_ms, rel=1e-6) for r in light)
    assert all(r["variant"] == "" for r in records)


def test_the_figures_are_pngs_and_the_report_shows_them(study_files, tmp_path):
    stem = study_files.with_suffix("")
    for name in ("latency", "attainment"):
        assert Path(f"{stem}-{name}.png").read_bytes()[:8] == PNG
    out = tmp_path / "report"
    assert report.main([str(study_files), "--out", str(out)]) == 0
    for name in ("fig9_serve_latency.png", "fig10_serve_attainment.png"):
        assert (out / name).read_bytes()[:8] == PNG, name
    markdown = (out / "report.md").read_text()
    assert "## Serving" in markdown and "1 serving studies" in markdown and "| 0.1 | 6 |" in markdown


def test_search_finds_the_highest_rate_meeting_the_slo():
    result = serve("geo-ring", search=True, requests=12, goodput="ttft:1000", **SMALL_KEYS)
    found = result.search
    assert found.highest_met_req_s is not None and found.lowest_missed_req_s is not None, found.reason
    by_rate = {row.rate_req_s: row for row in result.serve_rows}
    assert found.runs == len(by_rate) <= 8  # the knee brackets it: a few runs
    assert by_rate[found.highest_met_req_s].measured.slo_attainment_pct >= 90.0
    assert by_rate[found.lowest_missed_req_s].measured.slo_attainment_pct < 90.0
    assert found.highest_met_req_s < found.lowest_missed_req_s <= found.highest_met_req_s * 1.05
    assert all(row.met == (rate <= found.highest_met_req_s) for rate, row in by_rate.items())
    twice = serve("geo-ring", rates=[2 * found.highest_met_req_s], requests=12, goodput="ttft:1000", **SMALL_KEYS)
    assert twice.serve_rows[0].met is False


def test_search_says_why_when_light_load_misses_the_slo():
    result = serve("geo-ring", search=True, requests=3, goodput="tpot:100", **SMALL_KEYS)  # below the wall
    assert result.search.highest_met_req_s is None
    assert "missed at every rate" in result.search.reason and "313.0 ms" in result.search.reason


def test_the_speculation_row_serves_both_and_speculation_meets_a_tpot_plain_decode_cannot():
    """A TPOT target under the geo ring's wall (313 ms): plain decode misses it at every rate; speculating (K 4, a
    calibrated draft at alpha 0.9, c_d 5 ms: a 333 ms lap over Gamma ~4 tokens) meets it up to some rate, which the
    search finds."""
    import trio

    from testbed.studies import STUDIES
    from testbed.studies.serve.compare import compare_speculation
    from testbed.studies.serve.measure import parse_goodput, serving_scenario
    from testbed.studies.serve.search import Server

    args = STUDIES["serve"].parser().parse_args(["geo-ring", "--requests", "4", "--prompt-tokens", "16",
                                                 "--output-tokens", "8", "--streams", "4", "--goodput", "tpot:250",
                                                 "--set", "decode.draft=calibrated", "--set", "decode.alpha=0.9"])
    scenario = serving_scenario(args, parse_goodput(args.goodput))
    row = trio.run(compare_speculation, Server(scenario, "geo-ring", args, 90.0, lambda m: None), args, 90.0,
                   lambda m: None)
    plain, speculating = row.variants
    assert row.kind == "speculation" and plain.search.highest_met_req_s is None
    assert speculating.search.highest_met_req_s is not None and "speculating (K 4)" in row.note


@pytest.mark.parametrize("argv, flag", [
    (["--rates=-1,2"], "--rates"),
    (["--rates", "0.5,fast"], "--rates"),
    (["--rates", "0,1"], "--rates"),
    (["--goodput", "ttft"], "--goodput"),
    (["--goodput", "latency:300"], "--goodput"),
    (["--attainment", "0"], "--attainment"),
    (["--search"], "--goodput"),
    (["--prompt-tokens", "0"], "--prompt-tokens"),
    (["--requests", "5", "--duration", "10"], "--duration"),
    (["--burstiness", "x"], "--burstiness"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    try:
        code = cli.main(["serve", "geo-ring", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out = capsys.readouterr()
    assert code == 2
    assert flag in out.out + out.err and "Traceback" not in out.out + out.err


def test_a_negative_rate_exits_2_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "testbed", "serve", "--rates=0.5,-1"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--rates" in out.stdout and "Traceback" not in out.stdout + out.stderr


def small_serve_result() -> ServeResult:
    """A one-rate serve result with its request records (a few runs' worth of CPU: about a second once warm)."""
    return serve("geo-ring", rates=[1.0], requests=5, goodput="ttft:1000", **SMALL_KEYS)


def test_every_request_figure_is_its_records():
    """The row's figures are the records' (slo.serving_metrics): p50 TTFT is the median of the records' TTFTs; the
    API's result, records and all, reads back as the report reads it."""
    result = small_serve_result()
    row = result.serve_rows[0]
    ttfts = sorted(request_ms(record)["ttft"] for record in row.records)
    assert len(row.records) == 5 and row.measured.median_ttft_ms == pytest.approx(ttfts[2], rel=1e-12)
    assert parse_serve(json.loads(result.to_json()), "api").result == result


def test_against_virtual_serves_every_rate_again_and_states_each_percentiles_error():
    """--against virtual (here the backend is itself virtual, as a stand-in that must agree to 0.00%)."""
    import trio

    from testbed.studies import STUDIES
    from testbed.studies.serve.compare import compare_backend
    from testbed.studies.serve.measure import parse_goodput, serving_scenario
    from testbed.studies.serve.search import Server

    args = STUDIES["serve"].parser().parse_args(["geo-ring", "--requests", "4", "--prompt-tokens", "16",
                                                 "--output-tokens", "6", "--against", "virtual"])
    real = Server(serving_scenario(args, parse_goodput(args.goodput)), "geo-ring", args, 90.0, lambda m: None)

    async def both():
        for rate in (0.5, 2.0):
            await real.row(rate)
        return await compare_backend(real, args, 90.0, lambda m: None)

    row = trio.run(both)
    assert row.kind == "backend" and [len(v.rows) for v in row.variants] == [2, 2]
    assert row.note.count("+0.00%") == 8 and "0.5 req/s" in row.note and "2 req/s" in row.note
