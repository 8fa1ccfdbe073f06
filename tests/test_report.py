"""`testbed report`: figures and report.md from run summaries; bad input names the file and the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import report
from testbed.core.physics import gamma, spec_rate, wall_rate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parent.parent


def plain_summary(t_ring_s: float, compute_s: float, measured_factor: float = 0.99) -> dict:
    predicted = wall_rate(compute_s, t_ring_s)
    return {
        "scenario": "geo-ring", "shaper": "userspace", "mode": "plain", "spec": None,
        "stages": 3, "hops_ms": [t_ring_s * 1e3 / 3] * 3, "tokens": 48, "laps": 48,
        "wall_s": 48 / (predicted * measured_factor), "compute_s": compute_s, "t_ring_s": t_ring_s,
        "measured_tok_s": predicted * measured_factor, "predicted_tok_s": predicted,
        "error_pct": 100 * (measured_factor - 1), "per_hop": [], "overhead_ms_per_hop": 0.2,
    }


def spec_summary(alpha: float, k: int, t_ring_s: float = 0.28, compute_s: float = 0.033,
                 draft_per_token_s: float = 0.005) -> dict:
    predicted = spec_rate(alpha, k, draft_per_token_s, compute_s, t_ring_s)
    return {
        **plain_summary(t_ring_s, compute_s), "mode": "speculative",
        "measured_tok_s": predicted * 0.97,
        "spec": {"k": k, "k_auto": False, "draft": "calibrated", "rounds": 12, "alpha": alpha,
                 "gamma_measured": gamma(alpha, k) * 0.98, "gamma_predicted": gamma(alpha, k),
                 "draft_s": k * draft_per_token_s, "round_s": k * draft_per_token_s + compute_s + t_ring_s,
                 "predicted_tok_s": predicted},
    }


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 10_000 and data.startswith(PNG_MAGIC), path


def test_report_from_plain_and_speculative_results(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    write(results / "wall_c33.json", [plain_summary(t, 0.033) for t in (0.0003, 0.02, 0.06, 0.28)])
    write(results / "wall_c8.json", [plain_summary(t, 0.0083) for t in (0.0003, 0.02, 0.28)])
    for alpha in (0.6, 0.9):
        for k in (4, 8, 16):
            write(results / f"spec_a{alpha}_k{k}.json", spec_summary(alpha, k))
    extra = write(tmp_path / "single.json", plain_summary(0.15, 0.034))
    out = tmp_path / "out"

    assert report.main([str(results), str(extra), "--out", str(out)]) == 0

    assert_png(out / "fig1_wall.png")
    assert_png(out / "fig2_spec.png")
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "fig1_wall.png" in markdown and "fig2_spec.png" in markdown
    assert "| scenario |" in markdown and "T_ring (ms)" in markdown and "error (%)" in markdown
    # the global ring at C = 33 ms: 1/(0.033 + 0.280) = 3.19 tok/s predicted, 1% under measured
    row = next(line for line in markdown.splitlines() if "wall_c33.json[3]" in line)
    assert "| 280.0 | 33.0 |" in row and "| 3.16 | 3.19 | -1.0 |" in row
    # speculation at alpha 0.9, K = 16: Table 3 of seed 000 (Gamma 8.33, r 21.2; best 21.6 tok/s at K* = 21)
    spec_row = next(line for line in markdown.splitlines() if "spec_a0.9_k16.json" in line and "| 16 |" in line)
    assert "| 8.33 | 20.57 | 21.20 | -3.0 | 3.19 | 21 | 21.57 |" in spec_row
    assert str(out / "report.md") in capsys.readouterr().out


def test_plain_results_only_write_no_spec_figure(tmp_path):
    results = write(tmp_path / "run.json", plain_summary(0.006, 0.002))
    out = tmp_path / "out"
    assert report.main([str(results), "--out", str(out)]) == 0
    assert_png(out / "fig1_wall.png")
    assert not (out / "fig2_spec.png").exists()
    assert "| 6.0 | 2.0 |" in (out / "report.md").read_text(encoding="utf-8")


def test_compute_groups_split_distinct_ceilings():
    results = [report.parse_summary(plain_summary(0.02, c), "x") for c in (0.0083, 0.033, 0.0085, 0.034)]
    groups = report.group_by_compute(results)
    assert [[round(r.compute_s, 4) for r in g] for g in groups] == [[0.0083, 0.0085], [0.033, 0.034]]


@pytest.mark.parametrize(("content", "key"), [
    ("{not json", "not JSON"),
    (json.dumps({k: v for k, v in plain_summary(0.28, 0.033).items() if k != "compute_s"}), "compute_s"),
    (json.dumps({**plain_summary(0.28, 0.033), "measured_tok_s": "fast"}), "measured_tok_s"),
    (json.dumps({**spec_summary(0.7, 8), "spec": {"k": 8, "draft_s": 0.04}}), "spec.alpha"),
    (json.dumps([plain_summary(0.28, 0.033), {"scenario": "geo-ring"}]), "t_ring_s"),
    (json.dumps("a string"), "expected a JSON object"),
])
def test_bad_input_exits_2_naming_file_and_key(tmp_path, capsys, content, key):
    bad = tmp_path / "bad_summary.json"
    bad.write_text(content, encoding="utf-8")
    assert report.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bad_summary.json" in err and key in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "report.md").exists()


def test_missing_file_and_empty_directory_exit_2(tmp_path, capsys):
    assert report.main([str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert "empty" in capsys.readouterr().err


def test_module_entry_point_runs_without_traceback(tmp_path):
    bad = write(tmp_path / "broken.json", {"scenario": "geo-ring"})
    result = subprocess.run([sys.executable, "-m", "testbed.report", str(bad), "--out", str(tmp_path / "o")],
                            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode == 2
    assert "broken.json" in result.stderr and "t_ring_s" in result.stderr and "Traceback" not in result.stderr
