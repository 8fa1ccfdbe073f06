"""The null model ("null:NAME", agents.zoo.null): NAME's shapes without its weights or arithmetic, for long traces on
simulated time. Where no token's value decides what happens next its run is the model's run, every time to the
byte; where one does (a draft's acceptance, tensor parallelism's split matmuls) the scenario refuses it by name."""

from __future__ import annotations

import dataclasses

import pytest

from agents.modes.serve.requests import RequestRecord
from agents.zoo.configs import model_config
from testbed.core.errors import ConfigError
from testbed.scenario.config import scenario_from_dict
from tests.ringutil import run
from tests.test_serve_mode import served, serve_scenario

TIMING = [f.name for f in dataclasses.fields(RequestRecord) if f.name != "ids"]


def nulled(scenario):
    return dataclasses.replace(scenario, model=f"null:{scenario.model}")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_served_trace_has_the_models_timing_to_the_byte(temperature):
    """Requests queue and share the convoy (cap 3 of a Poisson burst, lengths drawn): every record's times equal
    the run with the model's own forward passes; only the tokens differ (zeros in, a constant or uniform draw out)."""
    scenario = serve_scenario(streams=3, arrival="poisson", rate=30.0, requests=12, prompt_tokens=12,
                              prompt="uniform", prompt_spread=6, output_tokens=8, output="uniform", output_spread=4,
                              seed=7)
    scenario = dataclasses.replace(scenario, decode=dataclasses.replace(scenario.decode, temperature=temperature))
    summary, records, _ = served(scenario)
    null_summary, null_records, _ = served(nulled(scenario))
    assert len(records) == len(null_records) == 12 and max(r.admitted - r.arrival for r in records) > 0  # a queue
    for model, null in zip(records, null_records):
        assert [getattr(model, f) for f in TIMING] == [getattr(null, f) for f in TIMING]
    assert any(m.ids != n.ids for m, n in zip(records, null_records))
    assert null_summary.serve.measured == summary.serve.measured


def test_plain_decode_keeps_its_lap_times():
    scenario = scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": 10.0} for i in range(3)],
                                   "network": {"hops_ms": [5.0, 7.0, 9.0]}, "decode": {"tokens": 6}}, "<test>")
    model, null = run(scenario), run(nulled(scenario))
    assert null.measured_tok_s == model.measured_tok_s and null.laps == model.laps and null.wall_s == model.wall_s
    assert [h.measured_ms_p50 for h in null.per_hop] == [h.measured_ms_p50 for h in model.per_hop]
    assert null.token_ids != model.token_ids


@pytest.mark.parametrize("decode, parallel, needle", [
    ({"mode": "speculative"}, "pp", "speculation"),
    ({"mode": "serve", "speculate": 2, "streams": 2}, "pp", "speculation"),
    ({}, "tp", "tensor parallelism"),
])
def test_where_tokens_decide_the_timing_the_null_model_is_refused(decode, parallel, needle):
    raw = {"model": "null:target", "parallel": parallel,
           "stages": [{"name": f"s{i}", "compute_ms": 10.0} for i in range(2)],
           "network": {"hops_ms": [5.0, 5.0]}, "decode": decode}
    with pytest.raises(ConfigError, match=needle) as caught:
        scenario_from_dict(raw, "<test>")
    assert caught.value.key == "model"


def test_a_null_model_of_an_unknown_model_names_the_key():
    with pytest.raises(ConfigError, match="null:NAME") as caught:
        scenario_from_dict({"model": "null:gpt-5", "stages": [{"name": "s0", "compute_ms": 1.0}],
                            "network": {"hops_ms": [1.0]}}, "<test>")
    assert caught.value.key == "model"
    assert model_config("null:target-deep") == model_config("target-deep")
