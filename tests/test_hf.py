"""Local Hugging Face checkpoints (agents.hf): split across stages, checked against transformers itself.

Every checkpoint is built here with transformers' own classes (random weights, a tokenizer trained on shipped
text, agents.hf.build): nothing is downloaded."""

from __future__ import annotations

import json

import pytest
import torch

from agents.hf.build import build_checkpoint
from agents.hf.model import load_hf
from agents.process.stage import PipelineStage, StagePlan
from testbed.scenario.config import scenario_from_dict
from testbed.scenario.stages import split_layers
from testbed.core.errors import ConfigError
from tests.ringutil import run

transformers = pytest.importorskip("transformers")
FAMILIES = ("gpt2", "llama", "qwen2", "mistral")
PROMPT = "def forward(self, x):"
TOKENS = 10


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    built = {family: build_checkpoint(root / family, family, layers=3, hidden=64, heads=4,
                                      kv_heads=None if family == "gpt2" else 2, vocab=512, context=256)
             for family in FAMILIES}
    built["llama-draft"] = build_checkpoint(root / "llama-draft", "llama", layers=1, hidden=32, heads=2, vocab=512,
                                            context=256, seed=1)
    built["llama-wide-vocab"] = build_checkpoint(root / "llama-wide", "llama", layers=1, hidden=32, heads=2,
                                                 vocab=640, context=256, seed=2)
    built["llama3-rope"] = _with_config(built["llama"], root / "llama3-rope", rope_parameters=LLAMA3_ROPE)
    built["llama-bias"] = build_checkpoint(root / "llama-bias", "llama", layers=3, hidden=64, heads=4, kv_heads=2,
                                           vocab=512, context=256, seed=4, attention_bias=True, mlp_bias=True)
    for name in ("qwen2", "llama-bias"):
        _random_biases(built[name])
    return built


def _random_biases(path):
    """transformers starts biases at zero, where a layer that dropped one would still pass: draw them instead."""
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(5)
    weights |= {k: torch.randn(v.shape, generator=generator) * 0.1 for k, v in weights.items() if k.endswith(".bias")}
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


# Llama 3.1's rotary scaling at a small original context, so that all three of its bands (kept, blended, divided)
# hold frequencies of a 16-wide head
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _with_config(source, directory, **changes):
    """A copy of checkpoint `source` whose config.json has `changes`."""
    directory.mkdir()
    for file in source.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    config = json.loads((source / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    return directory


def reference(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    model.generation_config.eos_token_id = None  # decode exactly TOKENS, as the ring does
    return model


@pytest.mark.parametrize("family", FAMILIES + ("llama3-rope", "llama-bias"))
@pytest.mark.parametrize("n_stages", [2, 3])
def test_a_split_checkpoint_gives_the_unsplit_models_logits_at_every_position(checkpoints, family, n_stages):
    """Each stage its own HFModel holding only its tensors; a 12-token prefill then 8 cached decode steps through
    the stages; every position's logits within 1e-4 of transformers' forward of the whole sequence."""
    path = checkpoints[family]
    ids = torch.randint(0, 400, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference(path)(ids).logits[0]  # [T, V]
    stages = []
    for i, (first, last) in enumerate(split_layers(3, tuple(_stages(n_stages)))):
        model = load_hf(f"hf:{path}").load(first, last, entry=i == 0)
        layer_names = {name.split(".")[2] for name in model.loaded if ".layers." in name or ".h." in name}
        assert layer_names == {str(layer) for layer in range(first, last)}  # its share only
        stages.append(PipelineStage(model, StagePlan(i, n_stages, first, last)))

    def through(block: list[int], pos: int) -> torch.Tensor:
        x = stages[0].embed_and_run(block, pos)
        for stage in stages[1:]:
            x = stage.run(x, pos)
        return stages[0].logits(x)

    got = [through(ids[0, :12].tolist(), 0)] + [through([int(ids[0, t])], t) for t in range(12, 20)]
    assert torch.cat(got).sub(want).abs().max().item() < 1e-4


def _stages(n: int):
    return scenario_from_dict({"stages": [{"name": f"s{i}"} for i in range(n)], "network": {"hops_ms": [1.0] * n}},
                              "<test>").stages


def ring(path, n_stages=3, **decode):
    raw = {"name": "hf", "model": f"hf:{path}",
           "stages": [{"name": f"s{i}", "compute_ms": 4.0} for i in range(n_stages)],
           "network": {"hops_ms": [3.0, 5.0, 7.0][:n_stages]},
           "decode": {"tokens": TOKENS, "temperature": 0.0, "prompt": PROMPT, **decode}}
    return scenario_from_dict(raw, "<test>")


def generated(path) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([tokenizer(PROMPT).input_ids])
    return reference(path).generate(ids, max_new_tokens=TOKENS, do_sample=False)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_greedy_decoding_on_a_ring_equals_generate_token_for_token(checkpoints, family):
    """Three stages on the virtual backend: the ids are generate(do_sample=False)'s, the text the tokenizer's
    decoding of them, and the rate is the wall's."""
    path = checkpoints[family]
    summary = run(ring(path))
    want = generated(path)
    assert list(summary.token_ids) == want
    assert summary.text == transformers.AutoTokenizer.from_pretrained(path).decode(want)
    assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=1e-6)


@pytest.mark.parametrize("mode", ["speculative", "tree"])
def test_a_checkpoint_draft_speculates_losslessly(checkpoints, mode):
    """A 1-layer draft checkpoint with the same tokenizer: greedy speculative and tree decoding give the target's
    generate() tokens exactly."""
    path = checkpoints["llama"]
    extra = {"k": 3} if mode == "speculative" else {"tree_n": 6, "tree_depth": 3}
    summary = run(ring(path, mode=mode, draft=f"hf:{checkpoints['llama-draft']}", **extra))
    assert list(summary.token_ids)[:TOKENS] == generated(path)


def bad(raw_update, checkpoints, tmp_path):
    raw = {"model": f"hf:{checkpoints['llama']}", "stages": [{"name": "a"}, {"name": "b"}],
           "network": {"hops_ms": [1.0, 1.0]}}
    raw.update(raw_update)
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(raw, "bad.toml")
    return str(info.value)


def test_bad_checkpoints_are_refused_by_file_and_cause(checkpoints, tmp_path):
    assert "no such checkpoint directory" in bad({"model": f"hf:{tmp_path / 'nope'}"}, checkpoints, tmp_path)
    (tmp_path / "empty").mkdir()
    assert "no config.json" in bad({"model": f"hf:{tmp_path / 'empty'}"}, checkpoints, tmp_path)
    config = json.loads((checkpoints["llama"] / "config.json").read_text())
    for name, change, words in (("bert", {"model_type": "bert"}, "model_type 'bert' is not supported"),
                                ("noweights", {}, "no model.safetensors")):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({**config, **change}))
        message = bad({"model": f"hf:{directory}"}, checkpoints, tmp_path)
        assert words in message and "bad.toml: model:" in message and str(directory) in message
    many = {"stages": [{"name": f"s{i}"} for i in range(4)], "network": {"hops_ms": [1.0] * 4}}
    assert "4 stages but the model has only 3 layers" in bad(many, checkpoints, tmp_path)
    wide = {"decode": {"mode": "speculative", "draft": f"hf:{checkpoints['llama-wide-vocab']}"}}
    assert "speculation needs the same tokenizer" in bad(wide, checkpoints, tmp_path)
    trained = {"decode": {"mode": "speculative"}}
    assert "does not share a checkpoint's tokenizer" in bad(trained, checkpoints, tmp_path)


def test_a_rope_type_or_an_activation_the_layers_do_not_run_is_refused_by_name(checkpoints, tmp_path):
    yarn = _with_config(checkpoints["llama"], tmp_path / "yarn", rope_parameters={"rope_type": "yarn", "factor": 4.0})
    assert "rope type 'yarn' is not supported" in bad({"model": f"hf:{yarn}"}, checkpoints, tmp_path)
    odd = _with_config(checkpoints["gpt2"], tmp_path / "odd", activation_function="quick_gelu")
    message = bad({"model": f"hf:{odd}"}, checkpoints, tmp_path)
    assert "activation 'quick_gelu' is not supported" in message and "config.json" in message


def test_an_agent_computes_a_checkpoint_without_importing_transformers(checkpoints):
    """The stages run agents.hf.layers, not transformers' classes, whose imports alone cost an agent ~100 MiB of
    RSS (torch._dynamo, torch.distributed.tensor and sympy come in with them)."""
    import subprocess
    import sys

    code = ("import sys; from agents.hf.model import load_hf; import torch; "
            f"m = load_hf('hf:{checkpoints['llama']}').load(0, 3, entry=True); m(torch.tensor([[1, 2, 3]])); "
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'transformers', 'sympy'}), "
            "'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "False"]


def test_a_missing_tensor_and_an_unrunnable_dtype_are_named(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoints["llama"] / "model.safetensors")
    for name, tensors, words in (
            ("missing", {k: v for k, v in weights.items() if not k.startswith("model.layers.1.")},
             "no tensor named model.layers.1.*"),
            ("int8", {**weights, "model.norm.weight": weights["model.norm.weight"].to(torch.int8)},
             "'model.norm.weight' is I8, which this machine cannot run"),
            ("one-missing", {k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"},
             "no tensor named 'model.layers.1.mlp.up_proj.weight'"),
            ("misshapen", {**weights, "model.layers.2.self_attn.k_proj.weight": torch.zeros(64, 64)},
             "tensor 'model.layers.2.self_attn.k_proj.weight' is (64, 64), config.json makes it (32, 64)")):
        directory = tmp_path / name
        directory.mkdir()
        for file in ("config.json", "tokenizer.json"):
            (directory / file).write_bytes((checkpoints["llama"] / file).read_bytes())
        save_file(tensors, directory / "model.safetensors")
        message = bad({"model": f"hf:{directory}"}, checkpoints, tmp_path)
        assert words in message and "model.safetensors" in message, message


def test_the_cli_says_one_line_and_exits_2(checkpoints, tmp_path, capsys):
    from testbed.cli import main

    assert main(["plan", "geo-ring", "--set", f"model=\"hf:{tmp_path / 'nope'}\""]) == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "checkpoint" in line]
    assert [line.lower() for line in lines] == [f"error: <built-in geo-ring>: model: {tmp_path / 'nope'}: no such checkpoint directory"]


@pytest.mark.fidelity
def test_a_checkpoint_on_the_relay_decodes_generates_tokens_and_reports_real_compute(checkpoints):
    """Real agents (forked by the fork server, each loading its share) on the userspace relay: the same tokens as
    generate(), and every stage's real forward time in the summary beside its emulated cost."""
    path = checkpoints["llama"]
    summary = run(ring(path), shaper="userspace")
    assert list(summary.token_ids) == generated(path)
    assert all(stage.real_ms_mean > 0 and stage.emulated_ms == 4.0 for stage in summary.per_stage)
    assert len(summary.agents) == 3 and all(agent.max_rss_mb > 0 for agent in summary.agents)


def test_no_weights_are_unpickled_anywhere():
    """Every weights file is safetensors: no torch.load, pickle or .pt loading in the project's code."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for package in ("agents", "testbed", "netem", "dashboards"):
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "load" and getattr(node.value, "id", "") == "torch":
                    raise AssertionError(f"{path}: torch.load")
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                    assert not any(n.split(".")[0] in ("pickle", "dill") for n in names), f"{path}: imports pickle"
    assert not list((root / "agents" / "weights").glob("*.pt"))


def test_the_quality_table_prints_a_checkpoint_pairs_alpha_hat(checkpoints, capsys):
    """agents.zoo.train --model/--draft: a checkpoint against itself agrees everywhere (alpha-hat 1 at every T), a
    different draft somewhere below; a draft with another vocabulary is exit 2 in one line."""
    from agents.hf.quality import checkpoint_acceptance, checkpoint_report

    target, draft = f"hf:{checkpoints['llama']}", f"hf:{checkpoints['llama-draft']}"
    assert checkpoint_acceptance(target, target, n_windows=4) == pytest.approx({0.0: 1.0, 0.7: 1.0, 1.0: 1.0})
    alpha = checkpoint_acceptance(target, draft, n_windows=4)
    assert 0.0 <= alpha[0.0] < 1.0 and all(0.0 < alpha[t] < 1.0 for t in (0.7, 1.0))  # random weights: argmax rarely agrees
    assert checkpoint_report(target, draft) == 0
    assert "alpha-hat at T = 0.7" in capsys.readouterr().out
    assert checkpoint_report(target, f"hf:{checkpoints['llama-wide-vocab']}") == 2
    assert "tokenizer is not the target's" in capsys.readouterr().out


def test_continuous_batching_of_a_checkpoint_gives_each_stream_generates_text(checkpoints):
    """Two streams batched into one forward pass per stage (each row at its own position, with its own cache and
    rotary angles): each stream's text is what generate() writes from its prompt."""
    path = checkpoints["llama"]
    summary = run(ring(path, mode="streams", streams=2, batching="continuous"))
    want = transformers.AutoTokenizer.from_pretrained(path).decode(generated(path))
    assert summary.streams.texts == (want, want)


def _rss_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Rss:"))


def test_a_checkpoints_kv_cache_takes_memory_only_where_it_is_written(checkpoints):
    """A stage's cache has CONTEXT_CAP slots, but a page of it is resident only once written: a 48-token decode does
    not hold, and count in its RSS, 2,048 positions of every layer (issue 31: peak RSS within the share + 300 MB)."""
    import dataclasses

    model = load_hf(f"hf:{checkpoints['llama']}")
    model.config = dataclasses.replace(model.config, kv_heads=16, head_dim=128, block_size=2048)  # this instance only
    before = _rss_kib()
    cache = model.new_cache(4)  # 64 MiB of keys and as many of values
    assert tuple(cache.k.shape) == tuple(cache.v.shape) == (4, 1, 16, 2048, 128) and cache.k.dtype == torch.float32
    cache.k[:, :, :, :48] = 1.0
    cache.v[:, :, :, :48] = 1.0
    assert _rss_kib() - before < 16 * 1024  # 48 slots of 4 x 16 rows: ~2 x 1.5 MiB, not 128
    assert not cache.k[:, :, :, 48:].any() and not cache.v[:, :, :, 48:].any()  # the rest reads as zeros


def test_the_activations_checked_at_load_are_the_ones_the_layers_run():
    from agents.hf.checkpoint import ACTIVATION_NAMES
    from agents.hf.layers import ACTIVATIONS

    assert set(ACTIVATION_NAMES) == set(ACTIVATIONS)
