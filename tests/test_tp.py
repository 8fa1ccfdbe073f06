"""Tensor vs pipeline parallelism over slow links (seed 000, "Why pipeline-, not tensor-, parallel", Eq. 8).

agents.modes.tp splits every layer Megatron-style over the agents and all-reduces twice per layer over the shaped
links; physics.tp_token_s predicts a token's latency for the all-reduce used (a max-plus recursion over the
configured links). The real-ring tests hold the measured per-token latency to it, and TP/PP above 4L/N.
"""

import pytest
import torch

from agents.modes.tp.runner import TPShard, shard_ranges
from testbed import api
from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.studies.tp.measure import scaled_links
from tests.ringutil import HOP_OVERHEAD_BUDGET_MS, LAP_RESIDUAL_BUDGET_MS, run


def test_shards_cover_every_head_and_unit_once():
    for n_items, n in ((4, 3), (512, 3), (4, 4), (7, 2)):
        ranges = [shard_ranges(n_items, n, r) for r in range(n)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n_items
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


@pytest.mark.parametrize("n", [2, 3, 4])
@torch.inference_mode()
def test_the_shards_add_up_to_the_monolithic_model(n):
    from agents.zoo.train import load_model

    model = load_model("target")
    ids = list(b"def add(a, b):\n    return a + b")
    full = model(torch.tensor([ids]))[0]  # [T, V]
    shards = [TPShard(model, rank, n) for rank in range(n)]

    def forward(block, pos):
        x = model.embed(torch.tensor([block]), pos)
        for segment in range(2 * model.config.n_layer):
            i = segment // 2
            parts = [s.attention(i, x, pos) if segment % 2 == 0 else s.mlp(i, x) for s in shards]
            x = x + sum(parts[1:], parts[0].clone())  # what the all-reduce delivers
        for s in shards:
            s.length = pos + len(block)
        return model.head(x)[0]

    prompt = len(ids) - 4
    logits = [forward(ids[:prompt], 0)] + [forward([ids[p]], p) for p in range(prompt, len(ids))]
    assert torch.allclose(torch.cat(logits), full, atol=1e-4, rtol=0)


def test_more_ranks_than_heads_is_refused():
    from agents.zoo.train import load_model

    with pytest.raises(ValueError, match="heads"):
        TPShard(load_model("target"), 0, 5)


def test_tp_token_time_on_a_uniform_ring():
    l, n, layers, seg, head = 0.010, 3, 6, 0.001, 0.0005
    links = {(i, (i + 1) % n): l for i in range(n)}
    ring = physics.tp_token_s(links, n, layers, seg, head, "ring")
    assert ring == pytest.approx(2 * layers * (seg + 2 * (n - 1) * l) + head)
    links.update({((i + 1) % n, i): l for i in range(n)})
    a2a = physics.tp_token_s(links, n, layers, seg, head, "all-to-all")
    assert a2a == pytest.approx(2 * layers * (seg + l) + head)
    # against PP's N l on the same ring (no compute): 4 L (N - 1) / N for the ring, above Eq. 8's 4 L / N
    assert physics.tp_token_s(links, n, layers, 0.0, 0.0, "ring") / (n * l) == pytest.approx(4 * layers * (n - 1) / n)
    assert physics.tp_token_s(links, n, layers, 0.0, 0.0, "ring") / (n * l) > physics.tp_pp_latency_ratio(layers, n)


def test_a_heterogeneous_ring_runs_at_its_mean_link():
    links = {(0, 1): 0.030, (1, 2): 0.010, (2, 0): 0.020}  # a step of the ring all-reduce moves one link along
    assert physics.tp_token_s(links, 3, 1, 0.0, 0.0, "ring") == pytest.approx(2 * 4 * 0.020)


@pytest.mark.parametrize("overrides, key, words", [
    (["parallel=tp", "tp.allreduce=all-to-all"], "tp.allreduce", "missing 0->2"),
    (["parallel=tp", "wire.codec=f16"], "wire.codec", "f32"),
    (["parallel=tp", "decode.mode=speculative"], "parallel", "plain decode"),
    (["parallel=tp", "decode.prefill_chunk=8"], "decode.prefill_chunk", "one pass"),
    (["parallel=mesh"], "parallel", "pp"),
    (["parallel=tp", "tp.allreduce=tree"], "tp.allreduce", "ring"),
])
def test_bad_tp_settings_name_the_key(overrides, key, words):
    with pytest.raises(ConfigError) as info:
        api.scenario("geo-ring", overrides=overrides)
    assert info.value.key == key and words in str(info.value)


def test_all_to_all_takes_its_links_from_the_regions():
    sc = api.scenario("world-8", overrides=["parallel=tp", "tp.allreduce=all-to-all"])
    n = sc.n_stages
    pairs = {(link.src, link.dst): link.delay_ms for link in sc.links}
    assert len(pairs) == n * (n - 1)
    assert pairs[(0, 2)] == sc.regions.latency(sc.stages[0].region, sc.stages[2].region)


DILATION = 2.0


def tolerance(summary) -> float:
    """The overhead budget of every all-reduce message a token waits on, over the token's latency."""
    t = summary.tp
    steps = t.layers * 2 * (2 * (t.ranks - 1) if t.allreduce == "ring" else 1)
    return (steps * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / t.predicted_token_ms


def test_tp_on_the_geo_ring_pays_its_all_reduces():
    """The geo ring with its links at half their delay (65, 20, 55 ms), at D = 2: PP, then TP with the ring
    all-reduce. Predicted TP/PP 13.0, Eq. 8's bound 4 L / N = 8."""
    base = ["decode.tokens=3", "decode.temperature=0"]
    pp = run(scaled_links(api.scenario("geo-ring", overrides=base), 0.5), dilation=DILATION)
    tp = run(scaled_links(api.scenario("geo-ring", overrides=base + ["parallel=tp"]), 0.5), dilation=DILATION)
    t = tp.tp
    assert (t.ranks, t.layers, t.allreduce, t.tokens) == (3, 6, "ring", 2)
    assert t.messages_per_token == 2 * 6 * 2 * (3 - 1)
    assert tp.token_ids == pp.token_ids  # TP's numerics decode what the pipeline decodes
    # the overhead budget of its 48 messages a token (1e-6 ms each on the virtual clock)
    assert t.token_ms == pytest.approx(t.predicted_token_ms, rel=tolerance(tp) / DILATION)
    ratio = t.token_ms / (1e3 / pp.measured_tok_s)
    exact = t.predicted_token_ms / (1e3 / pp.predicted_tok_s)
    assert ratio == pytest.approx(exact, rel=1e-6)
    assert ratio > t.ratio_bound == 8.0


def test_all_to_all_is_one_exchange_per_all_reduce():
    """Two ranks, links 20 and 30 ms: all-to-all over the ring's two links, 12 exchanges a token."""
    raw = {"stages": [{"name": "a", "compute_ms": 6.0}, {"name": "b", "compute_ms": 6.0}],
           "network": {"hops_ms": [20.0, 30.0]}, "decode": {"tokens": 6, "temperature": 0.0}}
    from testbed.scenario.config import scenario_from_dict

    pp = run(scenario_from_dict(raw, "<test>"), dilation=DILATION)
    tp = run(scenario_from_dict({**raw, "parallel": "tp", "tp": {"allreduce": "all-to-all"}}, "<test>"),
             dilation=DILATION)
    t = tp.tp
    assert tp.token_ids == pp.token_ids
    assert t.messages_per_token == 12
    # each exchange waits for the slower direction's partner: the pair's mean link, 25 ms, per all-reduce
    assert t.predicted_token_ms == pytest.approx(12 * (25.0 + t.segment_ms) + t.head_ms, rel=1e-6)
    assert t.token_ms == pytest.approx(t.predicted_token_ms, rel=tolerance(tp) / DILATION)


def test_a_bad_hop_scale_exits_2():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "testbed", "tp", "geo-ring", "--hop-scale", "0,1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--hop-scale" in result.stdout


def test_the_tp_command_writes_pp_and_tp_side_by_side(tmp_path):
    import subprocess
    import sys

    from testbed.studies.tp.measure import TpResult

    out = tmp_path / "tp.json"
    result = subprocess.run([sys.executable, "-m", "testbed", "tp", "geo-ring", "--set", "scale=0.1", "--tokens", "3",
                             "--hop-scale", "1", "--shaper", "virtual", "--json", str(out)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    row, = TpResult.from_json(out.read_text()).tp_rows
    assert row.same_tokens and row.mean_link_ms == pytest.approx(28.0 / 3)
    assert row.ratio_measured > row.ratio_bound and "TP/PP" in result.stdout
