"""`python -m testbed regimes`: the runs it plans, its bad-input errors, and one end-to-end run of the CLI."""

import json
import subprocess
import sys

import pytest

from testbed.scenario.config import load_scenario
from testbed.studies.regimes.measure import PROMPT_TOKENS, SLOW_RATE_MBIT, RegimesResult, knee, plan, stream_counts

SCENARIO = """name = "regimes-test"
[[stages]]
name = "a"
compute_ms = 10
[[stages]]
name = "b"
compute_ms = 10
[network]
hops_ms = [10, 10]
"""


def test_the_geo_ring_map_has_every_row_of_seed_000s_table():
    geo = load_scenario("geo-ring")
    runs = plan(geo, ("ttft", "streams", "decode", "speculative"), 16)
    labels = [label for label, _ in runs]
    # the geo ring holds (33 + 280) / 11 = 28.5 frames before a stage saturates: twice the knee is 58
    assert knee(geo) == pytest.approx(313 / 11)
    assert stream_counts(3, knee(geo)) == [1, 2, 3, 6, 12, 58]
    # TTFT at the scenario's rate (unlimited) and at 10 Mbit/s for every P; M in {1, 2, N, 2N, 4N} x two policies
    assert sum(label.startswith("ttft") for label in labels) == 2 * len(PROMPT_TOKENS)
    assert any(f"network.rate_mbit={SLOW_RATE_MBIT}" in overrides for _, overrides in runs)
    assert sum(label.startswith("streams") for label in labels) == 12
    assert labels[-2:] == ["decode (one stream)", "speculative (one stream)"]


def test_stream_counts_are_distinct_on_a_two_stage_ring():
    assert stream_counts(2) == [1, 2, 4, 8]


def test_an_unknown_part_is_a_clear_error():
    result = subprocess.run([sys.executable, "-m", "testbed", "regimes", "geo-ring", "--only", "ttft,prefix"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--only" in result.stdout and "prefix" in result.stdout


def test_the_command_measures_and_writes_json(tmp_path):
    scenario = tmp_path / "r.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "regimes.json"
    result = subprocess.run([sys.executable, "-m", "testbed", "regimes", str(scenario), "--shaper", "virtual",
                             "--dilation", "4", "--only", "streams", "--streams", "4", "--tokens", "8", "--json", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    regimes = RegimesResult.from_json(out.read_text())
    assert [(row.regime, row.streams, row.batching) for row in regimes.rows] == [
        ("streams", 4, "none"), ("streams", 4, "continuous")]
    for row in regimes.rows:
        assert row.measured > 0 and abs(row.error_pct) < 10, row
    assert "Regime map of regimes-test" in result.stdout
    assert json.loads(out.read_text())["stages"] == 2


@pytest.mark.exact
def test_a_cold_prompt_pays_slow_start_on_every_hop_beside_the_warm_one():
    """The cold rows (transport "kernel"): the same prompt as the TTFT rows, on fresh connections, equal to Eq. 5 with
    a cold connection's transfer on each hop (testbed.core.tcp) on virtual time, and slower than the warm row."""
    import trio

    from testbed.studies.regimes.measure import measure

    args = type("Args", (), {"overrides": [], "streams": None, "shaper": "virtual", "dilation": "auto",
                             "compensate": False})()
    result = trio.run(measure, "geo-ring", args, ("cold",), 2, lambda line: None)
    cold = [row for row in result.rows if row.regime == "cold"]
    assert len(cold) == 2 and all(row.prompt_tokens == 240 for row in cold)
    for row in cold:
        assert row.measured == pytest.approx(row.predicted, rel=1e-9)
        # warm, the same prompt takes 313 ms unlimited and 608 ms at 10 Mbit/s (the ttft rows); cold, 1.99 and 2.05 s
        assert row.serialization_s > 1.5 and row.measured > 1.9
