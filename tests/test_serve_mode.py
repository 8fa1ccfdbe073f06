"""The serve mode on the virtual backend (exact): requests arrive, queue, are admitted up to the cap, and each
request's record holds what the closed forms say.

At a very low rate every request is alone on the ring: its TPOT is the wall C + T_ring and its TTFT Eq. 5. Under
load the cap holds (never more than cap admitted, the rest wait FIFO), slots are reused by later requests (each
slot's KV reset by the prefill at position 0), and every request's greedy tokens equal a solo greedy decode of its
prompt. The same seed gives byte-identical records. [workload] is its own table; its errors name its keys.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from agents.modes.serve.facts import ServeLap
from agents.modes.serve.settings import ServeSettings
from agents.zoo.prompts import synthetic
from testbed.core.errors import ConfigError
from testbed.launch.collector import RunCollector
from testbed.launch.runlog import RunLog
from testbed.scenario.config import load_scenario, scenario_from_dict
from tests.ringutil import EXACT, run
from tests.test_streams import greedy_reference

HOPS_MS = [5.0, 5.0, 5.0]
STAGE_MS = 10.0
LAP_S = (3 * STAGE_MS + sum(HOPS_MS)) / 1e3  # C + T_ring = 45 ms


def serve_scenario(streams: int = 2, hops_ms=tuple(HOPS_MS), **workload):
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS} for i in range(3)],
                               "network": {"hops_ms": list(hops_ms)},
                               "decode": {"mode": "serve", "streams": streams},
                               "workload": workload}, "<test>")


def served(scenario):
    """The run's summary and the request records its laps carried (each once)."""
    log = RunLog(scenario)
    summary = run(scenario, runlog=log)
    records = [r for lap in log.laps if isinstance(lap.facts, ServeLap) for r in lap.facts.ended]
    return summary, sorted(records, key=lambda r: r.index), log


@pytest.fixture(scope="module")
def light():
    return served(serve_scenario(arrival="constant", rate=0.01, requests=3, prompt_tokens=16, output_tokens=5))


@pytest.fixture(scope="module")
def loaded():
    """Six requests at 40 req/s on a cap of 2: they queue, and slots 0 and 1 serve three requests each."""
    return served(serve_scenario(arrival="poisson", rate=40.0, requests=6, prompt_tokens=12, prompt="uniform",
                                 prompt_spread=4, output_tokens=6, output="uniform", output_spread=3, seed=3))


# --- settings ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workload, key", [
    ({"rate": -1}, "workload.rate"),
    ({"rate": 0}, "workload.rate"),
    ({"arrival": "zipf"}, "workload.arrival"),
    ({"goodput": "ttft:fast"}, "workload.goodput"),
    ({"duration_s": 10.0}, "workload.requests"),  # both a count and a duration
    ({"arrival": "trace"}, "workload.trace"),
    ({"rates": 2}, "workload.rates"),
])
def test_a_bad_workload_names_its_key(workload, key):
    with pytest.raises(ConfigError) as info:
        serve_scenario(**workload)
    assert info.value.key == key and info.value.source == "<test>"


def test_the_workload_is_its_own_table_and_the_convoy_needs_continuous_batching():
    with pytest.raises(ConfigError, match="decode.rate: unknown key"):
        scenario_from_dict({"stages": [{"name": "a"}, {"name": "b"}], "network": {"hops_ms": [1, 1]},
                            "decode": {"mode": "serve", "rate": 2.0}}, "<test>")
    assert serve_scenario().decode.batching == "continuous"
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({"stages": [{"name": "a"}, {"name": "b"}], "network": {"hops_ms": [1, 1]},
                            "decode": {"mode": "serve", "batching": "none"}}, "<test>")
    assert info.value.key == "decode.batching"
    sc = load_scenario("geo-ring", ["decode.mode=serve", "workload.rate=2.5", "workload.goodput=ttft:500 tpot:80"])
    assert sc.decode.settings(ServeSettings).rate == 2.5
    # a scenario of another mode holds no [workload] keys in its [decode] section (to_section round trips)
    assert "rate" not in load_scenario("geo-ring").decode.to_section()


def test_time_dilation_stretches_the_arrivals_with_everything_else():
    settings = serve_scenario(rate=4.0, requests=0, duration_s=10.0).decode.settings(ServeSettings)
    dilated = settings.time_scaled(8.0)
    assert (dilated.rate, dilated.duration_s, dilated.trace_scale) == (0.5, 80.0, 8.0)
    plain, slow = settings.workload(), dilated.workload()
    from agents.modes.serve.workload import generate

    fast = generate(plain, max_prompt=255, max_output=128)
    stretched = generate(slow, max_prompt=255, max_output=128)
    assert len(fast) == len(stretched)
    assert [8.0 * r.arrival_s for r in fast] == pytest.approx([r.arrival_s for r in stretched], rel=1e-12)
    sc = serve_scenario(rate=4.0)
    assert sc.dilated(3.0).decode.settings(ServeSettings).rate == pytest.approx(4.0 / 3.0)


# --- rings -------------------------------------------------------------------------------------------------

def test_alone_on_the_ring_a_request_decodes_at_the_wall_and_its_first_token_takes_eq5(light):
    summary, records, _ = light
    assert [r.index for r in records] == [0, 1, 2] and all(r.completed for r in records)
    for r in records:
        assert r.admitted == pytest.approx(r.arrival, abs=EXACT)  # nothing waits
        assert r.first_token - r.arrival == pytest.approx(LAP_S, abs=EXACT)  # Eq. 5: C_prefill(16) + T_ring
        for before, after in zip(r.token_times, r.token_times[1:]):
            assert after - before == pytest.approx(LAP_S, abs=EXACT)
        assert r.output_tokens == 5 and len(r.ids) == 5
    part = summary.serve
    assert part.wall_tpot_ms == pytest.approx(LAP_S * 1e3) and part.light_ttft_ms == pytest.approx(LAP_S * 1e3)
    assert part.measured.median_tpot_ms == pytest.approx(part.wall_tpot_ms, abs=EXACT * 1e3)
    assert part.measured.median_ttft_ms == pytest.approx(part.light_ttft_ms, abs=EXACT * 1e3)
    assert part.predicted.median_ttft_ms == pytest.approx(part.measured.median_ttft_ms, abs=EXACT * 1e3)
    assert summary.measured_tok_s == part.measured.output_throughput


def test_the_cap_holds_and_the_queue_is_fifo(loaded):
    _, records, log = loaded
    assert [r.index for r in records] == list(range(6)) and all(r.completed for r in records)
    admitted = sorted(records, key=lambda r: r.admitted)
    assert [r.index for r in admitted] == list(range(6))  # first come, first admitted
    for r in records:  # at any admission, fewer than the cap (2) others are admitted and not finished
        others = [o for o in records if o is not r and o.admitted <= r.admitted < o.finished]
        assert len(others) < 2
    assert max(r.admitted - r.arrival for r in records) > LAP_S  # some waited for a slot
    facts = [lap.facts for lap in log.laps if isinstance(lap.facts, ServeLap)]
    assert max(f.running for f in facts) == 2 and max(f.waiting for f in facts) >= 1


def test_slots_are_reused_and_every_request_decodes_what_the_model_alone_decodes(loaded):
    _, records, log = loaded
    slots = {lap.stream for lap in log.laps if lap.mode == "serve"}
    assert slots == {0, 1}  # six requests through two KV caches a stage
    for r in records:
        prompt = synthetic(r.prompt_tokens, r.index)
        assert list(r.ids) == greedy_reference(prompt, r.output_tokens), r.index


def test_the_same_seed_gives_byte_identical_records(loaded):
    again = served(serve_scenario(arrival="poisson", rate=40.0, requests=6, prompt_tokens=12, prompt="uniform",
                                  prompt_spread=4, output_tokens=6, output="uniform", output_spread=3, seed=3))[1]
    assert [r.to_json() for r in again] == [r.to_json() for r in loaded[1]]
    other = served(serve_scenario(arrival="poisson", rate=40.0, requests=6, prompt_tokens=12, prompt="uniform",
                                  prompt_spread=4, output_tokens=6, output="uniform", output_spread=3, seed=4))[1]
    assert [r.arrival for r in other] != [r.arrival for r in again]


def test_the_records_reach_prometheus_under_vllms_names(loaded):
    summary, records, log = loaded
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    labels = {"model_name": log.scenario.model}
    assert registry.get_sample_value("vllm:request_success_total", labels | {"finished_reason": "length"}) == 6
    assert registry.get_sample_value("vllm:generation_tokens_total", labels) == sum(r.output_tokens for r in records)
    assert registry.get_sample_value("vllm:time_to_first_token_seconds_count", labels) == 6
    ttft_sum = sum(r.first_token - r.arrival for r in records)
    assert registry.get_sample_value("vllm:time_to_first_token_seconds_sum", labels) == pytest.approx(ttft_sum)
    assert registry.get_sample_value("vllm:num_requests_running", labels) == 0
    assert summary.serve.measured.completed == 6


# --- the predictions: the streams ceiling at saturation, the queueing model below the knee ----------------------

def test_at_saturation_a_full_convoy_laps_at_the_streams_ceiling():
    """Twelve requests at once on a cap of 4 with per-token batch cost: every lap of a full convoy (4 running, the
    queue not empty) takes sum_i [c_i + p_i (cap - 1)] + T_ring, so the ring makes cap tokens a lap: the streams
    ceiling (physics.batching_ceiling with the hops), within 1e-6."""
    scenario = scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS, "per_token_ms": 1.5}
                                              for i in range(3)],
                                   "network": {"hops_ms": HOPS_MS},
                                   "decode": {"mode": "serve", "streams": 4},
                                   "workload": {"arrival": "constant", "rate": 1e4, "requests": 12,
                                                "prompt_tokens": 8, "output_tokens": 8}}, "<test>")
    summary, records, log = served(scenario)
    lap_s = 3 * (STAGE_MS + 1.5 * 3) / 1e3 + sum(HOPS_MS) / 1e3
    assert summary.serve.ceiling_tok_s == pytest.approx(4 / lap_s, rel=1e-12)
    full = {(lap.start, lap.end) for lap in log.laps if lap.kind == "decode" and lap.stamps[0].batch == 4}
    assert len(full) >= 12, full  # most of the run: three waves of 7 laps, less the joins
    for start, end in full:
        assert 4 / (end - start) == pytest.approx(summary.serve.ceiling_tok_s, rel=1e-6)
    assert len(records) == 12 and all(r.output_tokens == 8 for r in records)


GEO_HOPS_MS = (130.0, 40.0, 110.0)  # geo-ring's: the network, not the stages, sets the lap (C = 30 ms, T_ring = 280)


@pytest.mark.parametrize("share", [0.3, 0.6, 0.9, 0.99])
def test_the_queueing_model_is_within_5_percent_of_the_virtual_run_below_the_knee(share):
    """Poisson arrivals at 30% to 99% of the model's knee on a geo ring: its p50 TTFT and TPOT against the
    run's (the model is given the run's own arrivals and lengths: summary.py). The model leaves out the entry's own
    queue (arrivals wait for the step it is in): on a ring whose lap is mostly network that is a few ms a request."""
    from agents.modes.serve.queueing import knee_rate
    from agents.modes.serve.summary import ring_model

    workload = {"prompt_tokens": 16, "output_tokens": 12, "requests": 60, "seed": 5}
    knee = knee_rate(ring_model(serve_scenario(streams=16, hops_ms=GEO_HOPS_MS, **workload)), 16, 12)
    summary, _, _ = served(serve_scenario(streams=16, hops_ms=GEO_HOPS_MS, rate=share * knee, **workload))
    measured, predicted = summary.serve.measured, summary.serve.predicted
    assert measured.completed == 60 and (share > 0.6 or predicted.regime == "below the knee")  # 60 draws: +-13%
    for name in ("median_ttft_ms", "median_tpot_ms"):
        assert getattr(predicted, name) == pytest.approx(getattr(measured, name), rel=0.05), name


def test_on_memory_bound_stages_the_prompts_passes_lengthen_the_convoys_laps():
    """Two RTX 4090s holding Llama-3.1-8B (roofline stages, no hops): a stage's pass over a 32-token prompt reads its
    weights as a decode pass does (~9-10 ms), so at 20 req/s the convoy meets a prompt's pass every other lap. The
    model charges each prompt sum_s f_s^2 / (2 tau) of laps (queueing.py): p50 TPOT within 1% of the run (measured
    +0.3%); without that term it is 7.4% short. The null model: the same run's timing without the tiny model."""
    import dataclasses

    from agents.modes.serve.queueing import predict
    from agents.modes.serve.summary import ring_model

    scenario = scenario_from_dict({
        "model": "null:target", "geometry": {"preset": "llama-3.1-8b"},
        "stages": [{"name": f"s{i}", "hardware": "rtx-4090"} for i in range(2)], "network": {"hops_ms": [0.0, 0.0]},
        "decode": {"mode": "serve", "streams": 64},
        "workload": {"arrival": "poisson", "rate": 20.0, "prompt_tokens": 32, "output_tokens": 64, "requests": 200,
                     "seed": 1}}, "<test>")
    summary, records, _ = served(scenario)
    measured, predicted = summary.serve.measured, summary.serve.predicted
    assert predicted.median_tpot_ms == pytest.approx(measured.median_tpot_ms, rel=0.01)
    free = predict(dataclasses.replace(ring_model(scenario), prompt_passes_s=None), records_as_specs(records))
    assert free.median_tpot_ms < measured.median_tpot_ms * 0.95


def records_as_specs(records):
    from agents.modes.serve.requests import RequestSpec

    return [RequestSpec(r.index, r.arrival, r.prompt_tokens, r.output_tokens) for r in records]


def test_an_idle_ring_between_requests_is_not_a_dead_one():
    """Requests 5 s apart with a lap timeout of 1 s: the middle stages wait for work as long as it takes (the entry
    times the laps in flight, and none is), so the run serves them all."""
    scenario = scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS} for i in range(3)],
                                   "network": {"hops_ms": HOPS_MS, "lap_timeout_s": 1.0},
                                   "decode": {"mode": "serve", "streams": 2},
                                   "workload": {"arrival": "constant", "rate": 0.2, "requests": 3,
                                                "prompt_tokens": 8, "output_tokens": 3}}, "<test>")
    summary, records, _ = served(scenario)
    assert [r.output_tokens for r in records] == [3, 3, 3] and summary.serve.measured.completed == 3


def test_auto_dilation_budgets_the_workloads_arrivals_not_decode_tokens():
    """A serving run lasts its arrivals' span and the last request's prompt and laps, whatever decode.tokens says:
    auto dilation's forecast (testbed.launch.dilation) is the mode's own (summary.run_forecast)."""
    from testbed.launch.dilation import forecast

    sc = serve_scenario(streams=4, arrival="constant", rate=2.0, requests=40, prompt_tokens=8, output_tokens=10)
    run = forecast(sc, 3 * STAGE_MS / 1e3)  # a lap's compute beyond T_ring, as calibration measures it
    assert run.prefill_s == pytest.approx(LAP_S) and run.laps == 9
    assert run.total_s == pytest.approx(40 / 2.0 + LAP_S + 9 * LAP_S)


def kv_scenario(kv_requests: float, **workload):
    """Llama-3.1-8B's geometry on three stages of a custom device whose memory leaves room for the KV of
    `kv_requests` requests of 20 positions (16 prompt, 4 output) on the tightest stage; compute pinned at STAGE_MS."""
    def raw(memory_gb: float) -> dict:
        hardware = {"source": "test", "memory_gb": memory_gb, "memory_bw_gbs": 3350, "tflops_bf16": 989.4,
                    "tflops_fp8": 1978.9, "mem_efficiency": 0.8, "flop_efficiency": 0.5, "efficiency_source": "test"}
        return {"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS, "hardware": "dev"} for i in range(3)],
                "network": {"hops_ms": HOPS_MS}, "geometry": {"preset": "llama-3.1-8b"}, "hardware": {"dev": hardware},
                "decode": {"mode": "serve", "streams": 8},
                "workload": {"prompt_tokens": 16, "output_tokens": 4, **workload}}

    big = scenario_from_dict(raw(80.0), "<test>")
    need_gb = max(80.0 - st.kv_room_bytes / 1e9 for st in big.stages)  # the weights on the fullest stage
    per_position = max(st.kv_position_bytes for st in big.stages)
    return scenario_from_dict(raw(need_gb + kv_requests * 20 * per_position / 1e9), "<test>")


def test_the_kv_budget_caps_the_requests_in_the_ring_and_refuses_one_that_never_fits():
    """[geometry] and the hardware's memory: a request holds its prompt's and output's KV to its end, so the ring
    admits as many as the memory beside the weights holds (3 of 20 positions here, under decode.streams 8); the
    queueing model's cap is the same; a request longer than the whole budget is refused as it comes up."""
    sc = kv_scenario(3.5, arrival="poisson", rate=100.0, requests=8, seed=1)
    assert sc.kv_positions // 20 == 3
    summary, records, log = served(sc)
    assert summary.serve.cap == 3 and summary.serve.kv_positions == sc.kv_positions
    assert max(lap.facts.running for lap in log.laps if isinstance(lap.facts, ServeLap)) == 3
    assert len(records) == 8 and not any(r.aborted for r in records)
    admitted = sorted(r.admitted for r in records)
    assert admitted[3] > min(r.finished for r in records) - 1e-12  # the fourth waits for one to end
    summary, records, _ = served(kv_scenario(0.5, arrival="constant", rate=1.0, requests=2))
    assert all(r.aborted and not r.output_tokens for r in records)  # 20 positions > the ~10 the memory holds


def test_chunked_prompts_are_pipelined_over_the_ring_and_change_no_token():
    """decode.prefill_chunk: a request's prompt goes in chunks back to back; alone on the ring its TTFT is the
    pipelined form (physics.ttft_pipelined), below the whole prompt's Eq. 5, and its tokens are the same."""
    def scenario(chunk: int):
        return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS, "prefill_ms_per_token": 1.0}
                                              for i in range(3)],
                                   "network": {"hops_ms": HOPS_MS},
                                   "decode": {"mode": "serve", "streams": 2, "prefill_chunk": chunk},
                                   "workload": {"arrival": "constant", "rate": 0.01, "requests": 2, "prompt_tokens": 40,
                                                "output_tokens": 4}}, "<test>")

    whole, whole_records, _ = served(scenario(0))
    chunked, records, log = served(scenario(8))
    assert [r.ids for r in records] == [r.ids for r in whole_records] and all(r.completed for r in records)
    ttft = [r.first_token - r.admitted for r in records]
    assert ttft == pytest.approx([chunked.serve.light_ttft_ms / 1e3] * 2, rel=EXACT)
    assert [r.first_token - r.admitted for r in whole_records] == pytest.approx([whole.serve.light_ttft_ms / 1e3] * 2,
                                                                                 rel=EXACT)
    assert chunked.serve.light_ttft_ms < whole.serve.light_ttft_ms  # 5 chunks overlap on 3 stages: 134 vs 162 ms
    chunks = [lap for lap in log.laps if lap.kind == "prefill" and lap.facts is not None and lap.n_tok == 8]
    assert len(chunks) >= 2 * 4  # each prompt's four chunks before its last came back as laps of their own


def spec_serving(speculate: int, rate: float, requests: int = 8):
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS} for i in range(3)],
                               "network": {"hops_ms": HOPS_MS},
                               "decode": {"mode": "serve", "streams": 4, "speculate": speculate, "draft_ms": 2.0},
                               "workload": {"arrival": "poisson", "rate": rate, "requests": requests,
                                            "prompt_tokens": 24, "output_tokens": 20, "seed": 2}}, "<test>")


def test_speculation_while_serving_keeps_every_token_and_laps_at_its_closed_form():
    """decode.speculate = K: each running request drafts K tokens a lap (the trained draft), the convoy carries
    [last, K drafts] a row and the rule keeps what the target agrees with. Greedy tokens are plain serving's under
    load; alone on the ring a request's decode is its laps x (K c_d + C(K + 1) + T_ring) exactly, Gamma tokens a lap."""
    plain, plain_records, _ = served(spec_serving(0, rate=40.0))
    spec, records, _ = served(spec_serving(4, rate=40.0))
    assert [r.ids for r in records] == [r.ids for r in plain_records] and all(r.completed for r in records)
    assert spec.serve.tokens_per_lap > 1.5 and spec.serve.measured.median_tpot_ms < plain.serve.measured.median_tpot_ms
    light, records, _ = served(spec_serving(4, rate=0.01, requests=2))
    lap_s = (3 * STAGE_MS + 4 * 2.0 + sum(HOPS_MS)) / 1e3  # stages' compute_ms is per pass, whatever its length
    for r in records:
        assert r.finished - r.first_token == pytest.approx(len(set(r.token_times[1:])) * lap_s, rel=EXACT)
    assert light.serve.wall_tpot_ms == pytest.approx(lap_s / light.serve.tokens_per_lap * 1e3, rel=EXACT)
    with pytest.raises(ConfigError, match="decode.speculate"):
        spec_serving(-1, rate=1.0)


def spec_geo_scenario(**workload):
    """The geo ring's stages (1 ms per extra request) speculating at K 3 with a calibrated draft of alpha 0.7: every
    request's acceptance draws are keyed by its index and position, so its laps are the same at every load."""
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS, "per_token_ms": 1.0}
                                          for i in range(3)],
                               "network": {"hops_ms": list(GEO_HOPS_MS)},
                               "decode": {"mode": "serve", "streams": 16, "speculate": 3, "draft": "calibrated",
                                          "alpha": 0.7, "draft_ms": 2.0},
                               "workload": {"prompt_tokens": 16, "output_tokens": 24, "requests": 12, "seed": 5,
                                            **workload}}, "<test>")


@pytest.mark.parametrize("share", [0.3, 0.6])
def test_the_queueing_model_predicts_a_speculating_run_within_5_percent_below_the_knee(share):
    """decode.speculate = 3 on the geo ring at 30% and 60% of the model's knee (Gamma from the stated alpha,
    queueing.lap_law): the summary's prediction (each request's own laps at the lap K c_d + C(K + 1) + T_ring +
    P (b - 1), its TPOT its laps' time over its tokens) against the run's p50 TTFT and TPOT."""
    from agents.modes.serve.queueing import knee_rate
    from agents.modes.serve.summary import ring_model

    model = ring_model(spec_geo_scenario(rate=1.0))
    assert 2.2 < model.tokens_per_lap < 2.6  # 23 tokens at Gamma(0.7, 3) = 2.53 a lap, the last lap's surplus dropped
    summary, _, _ = served(spec_geo_scenario(rate=share * knee_rate(model, 16, 24)))
    measured, predicted = summary.serve.measured, summary.serve.predicted
    assert measured.completed == 12 and (share > 0.5 or predicted.regime == "below the knee")  # 12 draws
    assert predicted.median_tpot_ms < (model.lap_s(1) * 1e3) * 0.6  # a lap over Gamma: well under the plain wall
    for name in ("median_ttft_ms", "median_tpot_ms"):
        assert getattr(predicted, name) == pytest.approx(getattr(measured, name), rel=0.05), name
