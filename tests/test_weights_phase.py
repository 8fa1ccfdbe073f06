"""[weights] as a run's first phase: checked where the scenario is built, and on the virtual backend each stage's time
to ready is the weights study's prediction for the same shards, links and transport (testbed.launch.weights)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from testbed import cli
from testbed.core.errors import ConfigError
from testbed.launch.collector import RunCollector
from testbed.launch.runlog import RunLog
from testbed.launch.weights import WeightsPhase, modelled_phase, weights_metrics
from testbed.scenario.config import scenario_from_dict
from testbed.studies.weights import inputs, predict
from testbed.studies.weights.simulate import Strategy
from tests.ringutil import EXACT, run

pytestmark = pytest.mark.exact

REGIONS = {"names": ["virginia", "ireland", "tokyo"],
           "one_way_ms": [[0.0, 40.3, 72.7], [40.5, 0.0, 106.2], [72.9, 106.0, 0.0]]}  # asymmetric on purpose


def raw_scenario(weights: dict | None = None, **extra) -> dict:
    raw = {"name": "weights-ring", "model": "target-deep", "regions": REGIONS,
           "stages": [{"name": name, "region": name, "compute_ms": 4.0} for name in ("virginia", "ireland", "tokyo")],
           "decode": {"tokens": 3}, **extra}
    return raw | ({"weights": weights} if weights is not None else {})


@pytest.mark.parametrize("transport", ["tuned", "kernel"])
@pytest.mark.parametrize("strategy,streams", [("one", 1), ("parallel", 8), ("parallel", 3)])
def test_the_modelled_ready_time_is_the_weights_studys_prediction(transport, strategy, streams):
    weights = {"origin": "ireland", "strategy": strategy, "origin_up_mbit": 800.0, "down_mbit": 300.0}
    weights |= {"streams": streams} if strategy == "parallel" else {}
    scenario = scenario_from_dict(raw_scenario(weights, geometry={"preset": "llama-3.1-8b"},
                                               network={"transport": transport}))
    phase = modelled_phase(scenario, "virtual")
    # the study's own inputs and closed form, given the same origin, rates, delays and transport
    links = inputs.Links("ireland", 800.0 * inputs.MBIT, 300.0 * inputs.MBIT, 300.0 * inputs.MBIT, 0.5e-3)
    net = inputs.network(scenario, ["virginia", "ireland", "tokyo"], links, transport)
    expected = predict.predict(net, Strategy(strategy, streams), 64 * 2**20)
    assert phase.shard_bytes == tuple(nd.shard_bytes for nd in net.nodes)
    assert phase.ready_s == pytest.approx(expected.node_s, rel=1e-12)
    assert phase.ring_ready_s == pytest.approx(expected.ring_s, rel=1e-12)
    assert phase.predicted_s == phase.ready_s and phase.how == "modelled"
    if transport == "kernel" and streams == 1:  # one cold stream per node: far from the link's rate on this path
        assert phase.ready_s[2] > 1.5 * phase.shard_bytes[2] / (300.0 * inputs.MBIT)


def test_a_virtual_run_loads_its_weights_first_and_reports_them():
    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}))
    log = RunLog(scenario)
    summary = run(scenario, runlog=log)
    phase = WeightsPhase.from_dict(summary.extra["weights"])
    assert phase == log.weights and phase.backend == "virtual" and phase.streams == 8
    assert phase.shard_bytes[0] > phase.shard_bytes[1] > 0  # the entry's embeddings and head: the byte model's cut
    assert phase.ready_s == tuple(modelled_phase(scenario, "virtual").ready_s)
    assert abs(summary.error_pct) < EXACT * 100  # the decode that follows is the wall's, to the exact tier's 1e-6
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    for name, ready, predicted in zip(phase.stages, phase.ready_s, phase.predicted_s):
        labels = {"stage": name}
        assert registry.get_sample_value("testbed_weights_ready_seconds", labels | {"kind": "modelled"}) == ready
        assert registry.get_sample_value("testbed_weights_ready_seconds", labels | {"kind": "predicted"}) == predicted
    assert list(weights_metrics(None)) == []


@pytest.mark.parametrize("weights,key,why", [
    ({}, "weights.origin", "required"),
    ({"origin": "mars"}, "weights.origin", "unknown region 'mars'"),
    ({"origin": "virginia", "strategy": "swarm"}, "weights.strategy", "expected one of one, parallel"),
    ({"origin": "virginia", "strategy": "one", "streams": 4}, "weights.streams", "one stream per node"),
    ({"origin": "virginia", "streams": 0}, "weights.streams", "expected an integer in [1, 64]"),
    ({"origin": "virginia", "down_mbit": -5}, "weights.down_mbit", "expected a number"),
    ({"origin": "virginia", "chunk": 4}, "weights.chunk", "unknown key"),
    ("virginia", "weights", "expected a table"),
])
def test_bad_weights_input_is_refused_naming_the_key(weights, key, why):
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict(raw_scenario(weights), "w.toml")
    assert caught.value.key == key and why in str(caught.value)


def test_the_origins_delays_need_the_stages_regions():
    raw = {"stages": [{"name": "a"}, {"name": "b"}], "network": {"hops_ms": [5.0, 5.0]}, "weights": {"origin": "a"}}
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict(raw)
    assert caught.value.key == "weights.origin" and "[regions]" in str(caught.value)


def test_the_cli_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "w.toml"
    path.write_text('[[stages]]\nname = "a"\n[[stages]]\nname = "b"\n[weights]\norigin = "nowhere"\n')
    assert cli.main(["run", str(path), "--shaper", "virtual", "--no-dashboard"]) == 2
    out = capsys.readouterr().out
    assert "weights.origin" in out and "[regions]" in out
