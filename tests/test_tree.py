"""Tree speculation (seed 001): tree attention, KV compaction, lossless acceptance, and the rate on real rings."""

import itertools

import pytest
import torch

from agents.zoo.model import KVCache, tree_mask
from agents.modes.tree.runner import Tree, grow, verify
from agents.modes.tree.settings import TreeSettings
from testbed import api
from testbed.core.decode import DecodeConfig
from testbed.core.errors import ConfigError
from tests.ringutil import rate_tolerance, ring_scenario, run
from tests.test_spec import chi2, chi2_critical, random_dist

GREEDY_PROMPT = "    def __repr__(self):\n        return "


def test_a_node_sees_the_past_itself_and_its_ancestors():
    mask = tree_mask([-1, 0, 0, 1], past=2)
    assert mask.tolist() == [[True, True, True, False, False, False],
                             [True, True, True, True, False, False],
                             [True, True, True, False, True, False],
                             [True, True, True, True, False, True]]


def test_compaction_moves_the_accepted_path_next_to_its_root():
    from agents.zoo.train import MODEL_CONFIGS

    cache = KVCache(MODEL_CONFIGS["draft"], 1, extra_slots=8)
    cache.k[0, 0, 0, :10, 0] = torch.arange(10.0)
    cache.length = 10
    cache.compact([6, 9], dst=5)  # the root sat at slot 4; nodes at slots 6 and 9 were accepted
    assert cache.k[0, 0, 0, :7, 0].tolist() == [0, 1, 2, 3, 4, 6, 9]
    with pytest.raises(ValueError):
        cache.compact([9, 6], dst=5)


@torch.inference_mode()
def test_one_tree_pass_gives_every_path_its_sequential_logits():
    from agents.zoo.train import load_model

    model = load_model("target")
    prefix = list(b"def add(a, b):\n    ret")
    tree = Tree([prefix[-1]])
    for parent, token in ((0, ord("u")), (0, ord("a")), (1, ord("r")), (3, ord("n")), (2, ord("b"))):
        tree.add(parent, token, 0.0)
    cache = KVCache(model.config, model.config.n_layer, extra_slots=len(tree.tokens))
    past = len(prefix) - 1
    model.run_layers(model.embed(torch.tensor([prefix[:-1]]), 0), 0, model.config.n_layer, cache)
    x = model.embed_at(tree.tokens, [past + d for d in tree.depths]).transpose(0, 1)
    logits = model.head(model.run_layers(x, 0, model.config.n_layer, cache, tree_mask(tree.parents, past)))[0]
    for node in range(len(tree.tokens)):
        path, i = [], node
        while i >= 0:
            path.append(tree.tokens[i])
            i = tree.parents[i]
        alone = model(torch.tensor([prefix[:-1] + path[::-1]]))[0, -1]
        assert torch.allclose(logits[node], alone, atol=1e-4), node


def markov(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return {prev: random_dist(g, vocab, 1.5) for prev in range(vocab)}


@pytest.mark.parametrize("policy", ["topk", "best-first"])
def test_sampled_tree_output_matches_the_target(policy):
    """A toy Markov target and draft: the first two tokens a tree round produces vs the target's exact joint."""
    vocab, n = 3, 6000
    target, draft = markov(3, vocab), markov(4, vocab)
    config = DecodeConfig(mode="tree", temperature=1.0).with_settings(TreeSettings, tree_n=5, tree_k=2, tree_depth=3,
                                                                  tree_policy=policy)
    g = torch.Generator().manual_seed(11)

    def forward(tree, nodes):  # the draft's logits at each node: log q(. | the node's token)
        return torch.stack([torch.log(draft[tree.tokens[i]]) for i in nodes])

    expected = {(a, b): float(target[0][a] * target[a][b]) for a in range(vocab) for b in range(vocab)}
    counts = {}
    for _ in range(n):
        seq = [0]
        while len(seq) < 3:
            tree = grow(Tree([seq[-1]]), config, forward, g)
            p = [target[token] for token in tree.tokens]
            path, token = verify(tree, p, policy, greedy=False, generator=g)
            seq += [tree.tokens[i] for i in path] + [token]
        key = tuple(seq[1:3])
        counts[key] = counts.get(key, 0) + 1
    stat, df = chi2(counts, expected, n)
    assert stat < chi2_critical(df), (stat, df)


def test_greedy_verification_takes_the_longest_matching_path():
    tree = Tree([0])
    a, b = tree.add(0, 1, 0.0), tree.add(0, 2, 0.0)
    c = tree.add(b, 3, 0.0)
    one_hot = lambda t: torch.nn.functional.one_hot(torch.tensor(t), 5).double()  # noqa: E731
    p = [one_hot(2), one_hot(4), one_hot(3), one_hot(4)]  # argmax: root -> 2 (node b) -> 3 (node c) -> 4
    assert verify(tree, p, "best-first", greedy=True, generator=torch.Generator()) == ([b, c], 4)
    assert a == 1


def test_the_last_stage_verifies_trees_greedily_only():
    with pytest.raises(ConfigError, match="greedily") as info:
        api.scenario("geo-ring", overrides=["decode.mode=tree", "placement.head=last"])  # geo-ring samples at 0.7
    assert info.value.key == "placement.head"


@pytest.mark.parametrize("key, value", [("tree_n", 0), ("tree_n", 257), ("tree_policy", "beam"), ("tree_k", 0)])
def test_bad_tree_settings_name_the_key(key, value):
    with pytest.raises(ConfigError) as info:
        api.scenario("geo-ring", overrides=["decode.mode=tree", f"decode.{key}={value!r}".replace("'", '"')])
    assert info.value.key == f"decode.{key}"


@pytest.mark.parametrize("policy", ["best-first", "topk"])
def test_greedy_tree_decoding_is_token_for_token_plain_greedy(policy):
    plain = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=48, prompt=GREEDY_PROMPT))
    tree = run(ring_scenario([0.0, 0.0, 0.0], compute_ms=1.0, tokens=48, mode="tree", tree_n=16,
                             tree_policy=policy, prompt=GREEDY_PROMPT))
    ids = plain.token_ids
    assert len(set(ids)) >= 10 and max(len(list(r)) for _, r in itertools.groupby(ids)) <= 16, ids
    assert tree.token_ids[:48] == ids
    assert tree.tree.rounds > 5 and tree.tree.tokens_per_round > 1.5  # the tree accepts more than the bonus


def rate_limited_tree(head: str):
    from testbed.scenario.config import scenario_from_dict

    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": 5.0} for i in range(3)],
                               "network": {"hops_ms": [20.0, 20.0, 20.0], "rate_mbit": 10.0},
                               "decode": {"mode": "tree", "tree_n": 64, "tokens": 40, "temperature": 0.0,
                                          "prompt": GREEDY_PROMPT}, "placement": {"head": head}}, "<test>")


def test_the_tree_rate_and_the_return_path_on_a_rate_limited_ring():
    """20 ms hops at 10 Mbit/s, n = 64: the 65 nodes' hidden states (33 kB a hop) add ~80 ms of serialization a
    lap; measured tok/s against L / (T_ring + serialization + compute + draft). With the head on the last stage
    the return hop carries the accepted path's ids instead (seed 001's T_return): ~27 ms less a lap."""
    dilation = 2.0
    entry, last = run(rate_limited_tree("entry"), dilation=dilation), run(rate_limited_tree("last"), dilation=dilation)
    assert last.token_ids == entry.token_ids
    for summary in (entry, last):
        t = summary.tree
        assert t.n == 64 and t.serialization_ms == pytest.approx(3 * t.bytes_per_hop * 8 / 10e6 * 1e3)
        lap_s = 1 / t.predicted_tok_s * t.tokens_per_round
        assert t.measured_tok_s == pytest.approx(t.predicted_tok_s, rel=rate_tolerance(3, lap_s, dilation))
    assert entry.tree.serialization_ms > 60
    assert entry.per_hop[-1].bytes_per_lap > 30_000 > 1_000 > last.per_hop[-1].bytes_per_lap
    saved_ms = entry.tree.serialization_ms - last.tree.serialization_ms
    byte_ms = 8 / 10e3  # (bytes_per_lap is a whole number of bytes, the mean's floor: within a byte each)
    assert saved_ms == pytest.approx((entry.per_hop[-1].bytes_per_lap - last.per_hop[-1].bytes_per_lap) * byte_ms,
                                     abs=2 * byte_ms)
    assert entry.tree.ring_ms - last.tree.ring_ms == pytest.approx(saved_ms, rel=1e-6)


def test_the_sweep_fits_l_of_n_and_finds_w_star():
    import math

    from testbed.studies.tree.measure import TreeRow, fit

    t_ring, rate = 0.060, 10e6 / 8  # three 20 ms hops at 10 Mbit/s
    rows = []
    for n in (1, 4, 16, 64, 256):
        bytes_per_hop = 512 * (n + 1)
        serialization = 3 * bytes_per_hop / rate
        rows.append(TreeRow("f32", 10.0, n, 10, 2 + 0.5 * math.log(n), 0.0, 0.0, 0.0, (t_ring + serialization) * 1e3,
                            serialization * 1e3, bytes_per_hop, 1.0 + n / 1000, 1.0 + n / 2000, 0.0))
    f = fit(rows, t_ring, [rate] * 3)
    assert (f.a, f.b) == pytest.approx((2.0, 0.5))
    assert f.best_n_measured == f.best_n_predicted == 256
    assert f.w_star_predicted == pytest.approx(t_ring / (3 * 512 / rate))  # 48.8 nodes: serialization = latency
    assert 16 < f.w_star_measured < 64 and f.w_star_measured == pytest.approx(f.w_star_predicted, rel=0.05)


def test_a_bad_tree_grid_exits_2():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "testbed", "sweep", "geo-ring", "--tree-n", "1,400"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--tree-n" in result.stdout
