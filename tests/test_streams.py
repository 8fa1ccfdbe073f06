"""Many streams in flight, prefill and TTFT (seed 000, "Regimes").

Fast checks: the config keys, the closed forms, the batched forward pass against the per-sequence one, and
the wire's burst flags. Real rings (slow): per-stream rate at the wall while the aggregate grows with M
until the bottleneck, then flat at 1 / c_max; a convoy under continuous batching; every stream's greedy
output equal to the model's own greedy decode of its prompt; TTFT on a rate-limited link against
C_prefill(P) + T_ring + serialization.
"""

import numpy as np
import pytest
import torch

from agents.process import wire
from agents.zoo.prompts import synthetic
from agents.zoo.train import load_model
from testbed.scenario.config import scenario_from_dict
from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.core.records import Stamp
from tests.ringutil import HOP_OVERHEAD_BUDGET_MS, LAP_RESIDUAL_BUDGET_MS, rate_tolerance, ring_scenario, run

HOPS_MS = [5.0, 5.0, 5.0]
STAGE_MS = 10.0  # C + T_ring = 45 ms: the pipe holds 4.5 frames before the 10 ms stages saturate
DILATION = 2.0  # each rate tolerance below is the overhead budget over D x the lap: its margin is the same at any D
TOKENS = 12
PROMPT_TOKENS = 24


def scenario(**decode):
    return ring_scenario(HOPS_MS, compute_ms=STAGE_MS, tokens=TOKENS, prompt_tokens=PROMPT_TOKENS, **decode)


# --- fast --------------------------------------------------------------------------------------------

def test_several_streams_of_plain_decode_run_the_streams_mode():
    assert scenario(streams=4).decode.mode == "streams"
    assert scenario().decode.mode == "plain"


@pytest.mark.parametrize("decode, key", [
    ({"streams": 2, "mode": "speculative"}, "decode.streams"),
    ({"streams": 0}, "decode.streams"),
    ({"batching": "greedy"}, "decode.batching"),
    ({"prompt_tokens": 256}, "decode.prompt_tokens"),
    ({"mode": "streams"}, "decode.mode"),  # one stage below: no ring
])
def test_bad_stream_settings_name_the_key(decode, key):
    with pytest.raises(ConfigError) as info:
        stages = [{"name": "a"}] if decode.get("mode") == "streams" else [{"name": "a"}, {"name": "b"}]
        scenario_from_dict({"stages": stages, "network": {"hops_ms": [1, 1]} if len(stages) == 2 else {},
                            "decode": decode}, "<test>")
    assert info.value.key == key


def test_streams_rates_closed_forms():
    # without batching: M / (C + T_ring) until the slowest stage (12 ms) is busy all the time
    per, agg, util = physics.streams_rates(2, [0.010, 0.012, 0.010], 0.015, "none")
    assert agg == pytest.approx(2 / 0.047) and per == pytest.approx(1 / 0.047)
    assert util[1] == pytest.approx(0.012 * 2 / 0.047)
    per, agg, util = physics.streams_rates(16, [0.010, 0.012, 0.010], 0.015, "none")
    assert agg == pytest.approx(1 / 0.012) and per == pytest.approx(1 / 0.012 / 16) and util[1] == pytest.approx(1.0)
    # continuous batching, one convoy: each stage pays c + p (M - 1) once per lap
    per, agg, util = physics.streams_rates(8, [0.010, 0.010], 0.020, "continuous", [0.001, 0.002])
    lap = 0.010 + 0.007 + 0.010 + 0.014 + 0.020
    assert per == pytest.approx(1 / lap) and agg == pytest.approx(8 / lap)
    assert physics.batching_ceiling(8, [0.010, 0.010], [0.001, 0.002]) == pytest.approx(8 / 0.024)


def test_batched_forward_equals_each_sequence_alone():
    model = load_model("target")
    from agents.zoo.model import KVCache

    prompts = [synthetic(20 + 7 * s, s) for s in range(3)]
    alone, batched = [], [KVCache(model.config, 3) for _ in prompts]
    with torch.inference_mode():
        for ids, cache in zip(prompts, batched):
            model.run_layers(model.embed(torch.tensor([ids[:-1]]), 0), 0, 3, cache)
        for ids in prompts:
            cache = KVCache(model.config, 3)
            x = model.run_layers(model.embed(torch.tensor([ids]), 0), 0, 3, cache)
            alone.append(x[0, -1])
        x = model.embed_at([ids[-1] for ids in prompts], [len(ids) - 1 for ids in prompts])
        out = model.run_layers_batched(x, 0, 3, batched)
    for b, expected in enumerate(alone):
        assert torch.allclose(out[b, 0], expected, atol=1e-5)
    assert [cache.length for cache in batched] == [len(ids) for ids in prompts]


def test_a_burst_carries_how_many_frames_follow_and_each_stamp_its_batch():
    stamp = Stamp(1, 1.0, 1.0, 1.5, 2.0, 2.0, 600, batch=5)
    frames = [wire.Frame(wire.Kind.HIDDEN, stream=s, tensor=np.zeros((1, 1, 4), np.float32), flags=2 - s,
                         stamps=(stamp,)) for s in range(3)]
    decoded = [wire.decode(wire.encode(f)) for f in frames]
    assert [wire.burst_left(f) for f in decoded] == [2, 1, 0]
    assert decoded[0].stamps[0].batch == 5


def greedy_reference(prompt: list[int], tokens: int) -> list[int]:
    """The target's own greedy continuation of a prompt, on one process, without a ring or a batch."""
    model = load_model("target")
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(tokens):
            ids.append(int(torch.argmax(model(torch.tensor([ids]))[0, -1])))
    return ids[len(prompt):]


# --- real rings --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stream_runs():
    runs = {}
    for m, batching in ((1, "none"), (2, "none"), (8, "none"), (4, "continuous")):
        runs[m, batching] = run(scenario(mode="streams", streams=m, batching=batching), dilation=DILATION)
    return runs


def test_per_stream_rate_stays_at_the_wall_while_the_aggregate_grows(stream_runs):
    lap_s = (3 * STAGE_MS + sum(HOPS_MS)) / 1e3
    tolerance = rate_tolerance(3, lap_s, DILATION)
    one, two = stream_runs[1, "none"].streams, stream_runs[2, "none"].streams
    for st in (one, two):
        assert st.aggregate_tok_s == pytest.approx(st.aggregate_predicted_tok_s, rel=tolerance)
        assert st.per_stream_min_tok_s == pytest.approx(physics.wall_rate(lap_s - sum(HOPS_MS) / 1e3,
                                                                          sum(HOPS_MS) / 1e3), rel=2 * tolerance)
    assert two.aggregate_tok_s / one.aggregate_tok_s == pytest.approx(2.0, rel=2 * tolerance)


def test_past_the_bottleneck_the_aggregate_flattens_at_its_ceiling(stream_runs):
    st = stream_runs[8, "none"].streams
    # past (C + T_ring) / c_max = 4.5 frames the slowest stage is busy all the time: 1 / c_max
    ceiling = 1.0 / (STAGE_MS / 1e3)
    tolerance = (HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS / 8) / (STAGE_MS * DILATION)
    assert st.aggregate_predicted_tok_s == pytest.approx(st.ceiling_tok_s, rel=1e-9)
    assert st.aggregate_tok_s == pytest.approx(st.aggregate_predicted_tok_s, rel=tolerance)
    assert st.aggregate_tok_s == pytest.approx(ceiling, rel=tolerance)
    # each stream's own rate is over its whole run, whose last laps run faster as the train thins (streams that
    # end leave the bottleneck to the rest): measured on simulated time, +3.8% over the steady ceiling / 8
    assert ceiling / 8 < st.per_stream_p50_tok_s < 1.05 * ceiling / 8
    assert max(st.stage_busy) > 0.9
    assert max(st.stage_queue_ms_mean) > STAGE_MS  # frames queue: the train is longer than the ring


def test_continuous_batching_moves_the_streams_as_one_convoy(stream_runs):
    st = stream_runs[4, "continuous"].streams
    assert st.stage_batch_mean == (4.0, 4.0, 4.0)
    lap_s = (3 * STAGE_MS + sum(HOPS_MS)) / 1e3
    tolerance = rate_tolerance(3, lap_s, DILATION)
    assert st.aggregate_tok_s == pytest.approx(st.aggregate_predicted_tok_s, rel=tolerance)
    assert st.aggregate_tok_s == pytest.approx(4 / lap_s, rel=2 * tolerance)


def test_the_convoy_crosses_every_hop_as_one_batch_frame(stream_runs):
    """Each hop carries one BATCH frame a lap under continuous batching: its header, the stamps so far, a row a stream
    and the four hidden states (not four frames); without batching a frame a stream."""
    summary, n_embd = stream_runs[4, "continuous"], load_model("target").config.n_embd
    batch = 4 * wire.ROW.itemsize + 4 * n_embd * 4
    assert [hop.bytes_per_lap for hop in summary.per_hop] == [wire.HEADER.size + (i + 1) * wire.STAMP.size + batch
                                                           for i in range(3)]
    alone = stream_runs[2, "none"]
    assert [hop.bytes_per_lap for hop in alone.per_hop] == [wire.HEADER.size + (i + 1) * wire.STAMP.size + n_embd * 4
                                                         for i in range(3)]


def test_under_continuous_batching_the_prompts_go_as_one_batch(stream_runs):
    """The M prompts (one length) leave the entry as one BATCH frame, one forward pass a stage: the first token comes
    one lap of that batch after the start, as its closed form says; without batching a frame a prompt."""
    n_embd = load_model("target").config.n_embd
    batched, alone = stream_runs[4, "continuous"].ttft, stream_runs[2, "none"].ttft
    prompts = 4 * wire.ROW.itemsize + 4 * PROMPT_TOKENS * n_embd * 4
    assert batched.bytes_per_hop == wire.HEADER.size + 2 * wire.STAMP.size + prompts  # stamps: 1, 2, 3 over the hops
    assert alone.bytes_per_hop == wire.HEADER.size + 2 * wire.STAMP.size + PROMPT_TOKENS * n_embd * 4
    assert batched.measured_s == pytest.approx(batched.predicted_s, rel=1e-9)


def test_a_stage_batches_frames_and_batch_frames_of_other_streams():
    from agents.process.batching import batches, rows_of

    def one(stream):
        return wire.Frame(wire.Kind.HIDDEN, stream=stream, pos=3, tensor=np.full((1, 1, 4), stream, np.float32)), 0.0

    def many(*streams):
        rows = wire.batch_rows(streams, [0] * len(streams), [5] * len(streams))
        tensor = np.array(streams, np.float32)[:, None, None].repeat(4, 2)
        return wire.Frame(wire.Kind.BATCH, tensor=tensor, rows=rows), 0.0

    groups = batches([many(0, 1), one(2), many(3), many(1, 4), one(5)])
    assert [len(g) for g in groups] == [3, 2]  # stream 1 again: a new batch
    x, positions, streams = rows_of(groups[0])
    assert streams == [0, 1, 2, 3] and positions == [5, 5, 3, 5] and x[:, 0, 0].tolist() == [0, 1, 2, 3]


def test_every_stream_decodes_what_the_model_alone_decodes(stream_runs):
    for key in ((8, "none"), (4, "continuous")):
        st = stream_runs[key].streams
        for s, text in enumerate(st.texts):
            expected = greedy_reference(synthetic(PROMPT_TOKENS, s), TOKENS)
            assert text == bytes(expected).decode("utf-8", errors="replace"), (key, s)


def test_pipelined_completion_of_a_tandem_line():
    # one job: the sum of its services; n equal jobs: the sum plus (n - 1) times the slowest server
    assert physics.pipelined_completion([[1.0, 3.0, 2.0]]) == pytest.approx(6.0)
    assert physics.pipelined_completion([[1.0, 3.0, 2.0]] * 4) == pytest.approx(6.0 + 3 * 3.0)
    assert physics.ttft_pipelined([[0.01, 0.02]], 0.1, 0.001) == pytest.approx(0.131)


def prefill_scenario(prompt_tokens: int, chunk: int = 0):
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": STAGE_MS, "prefill_ms_per_token": 0.05}
                                          for i in range(3)],
                               "network": {"hops_ms": HOPS_MS, "rate_mbit": 10.0},
                               "decode": {"tokens": 2, "prompt_tokens": prompt_tokens, "prefill_chunk": chunk}},
                              "<test>")


@pytest.fixture(scope="module")
def prefills():
    runs = {(p, chunk): run(prefill_scenario(p, chunk), dilation=2.0).ttft for p, chunk in ((16, 0), (128, 0))}
    # A TTFT is one sample: a scheduling stall of the relay (20-30 ms, seen in one CI run of five) moves it by 10%.
    # The chunked prompt, whose test holds it tightest, is the median of three runs.
    chunked = sorted((run(prefill_scenario(128, 32), dilation=2.0).ttft for _ in range(3)),
                     key=lambda t: t.measured_s / t.predicted_s)
    return {**runs, (128, 32): chunked[1]}


def test_ttft_grows_with_the_prompt_over_a_rate_limited_link(prefills):
    for (p, chunk), t in prefills.items():
        if chunk:
            continue
        # P x d_model x 4 bytes (plus framing) at 10 Mbit/s per hop, and the emulated prefill cost
        assert t.bytes_per_hop >= physics.b_hop(p, 128, 4)
        assert t.serialization_s == pytest.approx(3 * t.bytes_per_hop * 8 / 10e6, rel=1e-6)
        tolerance = (3 * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / (t.predicted_s * 1e3 * 2.0)
        assert t.measured_s == pytest.approx(t.predicted_s, rel=tolerance)
    grown = prefills[128, 0].measured_s - prefills[16, 0].measured_s
    assert grown == pytest.approx(prefills[128, 0].predicted_s - prefills[16, 0].predicted_s, rel=1e-6)


def test_chunked_prefill_pipelines_over_the_stages(prefills):
    chunked, whole = prefills[128, 32], prefills[128, 0]
    assert chunked.chunks == 4 and chunked.prompt_tokens == 128
    tolerance = (3 * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / (chunked.predicted_s * 1e3 * 2.0)
    assert chunked.measured_s == pytest.approx(chunked.predicted_s, rel=tolerance)
    # the chunks overlap on the stages and links: the first token comes sooner than after the whole prompt
    assert chunked.measured_s < 0.8 * whole.measured_s
