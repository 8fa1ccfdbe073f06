"""The timeline (testbed.launch.trace) against the run it traced: per lap, the stage and link spans add up to the lap's
time, and every hop span is that hop's measured latency; on the virtual backend, so both to float rounding."""

from __future__ import annotations

import json

import pytest
import trio

from testbed.scenario.config import scenario_from_dict
from testbed.core.errors import ConfigError
from testbed.launch.launcher import run_scenario
from testbed.launch.runlog import RunLog
from testbed.launch.trace import TILING_CATEGORIES, laps_of, read_trace, tracing
from tests.ringutil import RUN_TIMEOUT_S

pytestmark = pytest.mark.exact

TILE = 1e-9  # relative: sums of simulated times in microseconds, rounded as floats
HOPS_MS = [20.0, 5.0, 12.0]
MODES = {
    "plain": {},
    "speculative": {"mode": "speculative", "k": 3},
    "streams": {"mode": "streams", "streams": 3, "batching": "continuous"},
    "tree": {"mode": "tree", "tree_n": 6},
}


def traced(tmp_path, decode: dict, rate_mbit: float = 0.0):
    raw = {"name": "traced", "stages": [{"name": f"s{i}", "compute_ms": 3.0} for i in range(len(HOPS_MS))],
           "network": {"hops_ms": HOPS_MS, "rate_mbit": rate_mbit}, "decode": {"tokens": 12, **decode}}
    scenario = scenario_from_dict(raw, "<test>")
    path = tmp_path / "run.trace.json"

    async def main():
        with trio.fail_after(RUN_TIMEOUT_S):
            return await run_scenario(scenario, "virtual", runlog=log, log=lambda m: None)

    with tracing(path):
        log = RunLog(scenario)  # made inside the block: it writes to that trace
        trio.run(main)
    return list(log.laps), read_trace(path), path


@pytest.mark.parametrize("mode", MODES)
def test_the_spans_of_every_lap_tile_it_and_each_hop_is_its_latency(tmp_path, mode):
    records, events, _ = traced(tmp_path, MODES[mode])
    laps = laps_of(events)
    assert sorted(laps) == list(range(len(records))), "one seq per lap, every lap traced"
    for seq, record in enumerate(records):
        spans = laps[seq]
        tiled = sum(e["dur"] for e in spans if e["cat"] in TILING_CATEGORIES)
        assert tiled == pytest.approx(record.duration_s * 1e6, rel=TILE), (mode, seq, record)
        hops = [e["dur"] for e in spans if e["name"] == "hop"]
        assert hops == pytest.approx([h * 1e6 for h in record.hop_latencies_s() if h > 0], rel=TILE), (mode, seq)
        assert {e["args"]["lap"] for e in spans} == {record.lap} and {e["tid"] for e in spans} == {record.stream}


def test_a_rate_limited_hop_shows_its_serialization_inside_it(tmp_path):
    records, events, _ = traced(tmp_path, {}, rate_mbit=10.0)
    serialize = [e for e in events if e.get("name") == "serialize"]
    assert serialize, "a 10 Mbit/s link serializes every frame"
    hops = {(e["args"]["seq"], e["pid"]): e for e in events if e.get("name") == "hop"}
    for span in serialize:
        hop = hops[span["args"]["seq"], span["pid"]]
        assert span["dur"] == pytest.approx(span["args"]["bytes"] * 8 / 10e6 * 1e6)
        assert hop["ts"] == span["ts"] and span["dur"] <= hop["dur"]


def test_tracks_are_named_and_the_file_is_whole_however_the_block_ends(tmp_path):
    _, events, path = traced(tmp_path, {})
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"stage 0 s0", "stage 1 s1", "stage 2 s2", "link 0->1", "link 1->2", "link 2->0"}
    assert json.loads(path.read_text())["displayTimeUnit"] == "ms"
    broken = tmp_path / "broken.trace.json"
    with pytest.raises(KeyboardInterrupt):
        with tracing(broken):
            raise KeyboardInterrupt
    assert read_trace(broken) == []
    (tmp_path / "not.json").write_text("{")
    with pytest.raises(ConfigError, match="not a readable trace"):
        read_trace(tmp_path / "not.json")


def test_the_report_draws_the_timeline_and_names_a_broken_one(tmp_path, capsys):
    from testbed.report.build import main as report_main

    traced(tmp_path, MODES["streams"])
    out = tmp_path / "out"
    assert report_main([str(tmp_path / "run.trace.json"), "--out", str(out)]) == 0
    assert (out / "timeline.png").stat().st_size > 0
    markdown = (out / "report.md").read_text()
    assert "## Timeline" in markdown and "1 timelines" in markdown
    bad = json.loads((tmp_path / "run.trace.json").read_text())
    next(e for e in bad["traceEvents"] if e["ph"] == "X").pop("dur")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert report_main([str(tmp_path / "bad.json"), "--out", str(out)]) == 2
    assert "complete event without pid, tid, ts, dur and args" in capsys.readouterr().err
