"""Staged, cached and speculative runs of the GPT must give the logits of one plain forward pass."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import shutil
import threading

import pytest
import torch

import agents.zoo.train as train
from safetensors.torch import load_file
from agents.zoo.corpus import KINDS, build_corpus
from agents.zoo.configs import GPTConfig, decode, encode
from agents.zoo.model import GPT, KVCache
from agents.zoo.measure import generate
from testbed.core.decode import DecodeConfig

TINY = GPTConfig(vocab_size=64, block_size=32, n_layer=6, n_head=2, n_embd=16)
STAGES = [(0, 2), (2, 4), (4, 6)]


def make_model(config: GPTConfig = TINY, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(config).eval()
    # GPT-2 init gives near-uniform attention, which would hide masking bugs below float tolerance;
    # larger weights make attention peaked and every position's output distinct.
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model


def stage_caches(model: GPT, batch_size: int = 1) -> list[KVCache]:
    return [KVCache(model.config, last - first, batch_size) for first, last in STAGES]


def staged_step(model: GPT, idx: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
    """Run idx [B, T] through the three stages after the positions already cached -> logits [B, T, V]."""
    x = model.embed(idx, caches[0].length)
    for (first, last), cache in zip(STAGES, caches):
        x = model.run_layers(x, first, last, cache)
    return model.head(x)


def random_tokens(batch_size: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (batch_size, length), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_stage_partitioned_forward_matches_monolithic():
    model = make_model()
    idx = random_tokens(2, 20)
    x = model.embed(idx, 0)
    for first, last in STAGES:
        x = model.run_layers(x, first, last)
    torch.testing.assert_close(model.head(x), model(idx))


@torch.inference_mode()
def test_forward_is_causal():
    model = make_model()
    idx = random_tokens(1, 12)
    changed = idx.clone()
    changed[0, -1] = (changed[0, -1] + 1) % TINY.vocab_size
    logits, logits_changed = model(idx), model(changed)
    torch.testing.assert_close(logits[:, :-1], logits_changed[:, :-1])
    assert not torch.allclose(logits[:, -1], logits_changed[:, -1])


@torch.inference_mode()
def test_cached_greedy_decode_matches_uncached():
    model = make_model()
    prompt = random_tokens(2, 5)
    caches = stage_caches(model, batch_size=2)
    cached_logits = [staged_step(model, prompt, caches)]
    seq = prompt
    for _ in range(12):
        next_token = cached_logits[-1][:, -1].argmax(dim=-1, keepdim=True)  # [B, 1]
        seq = torch.cat([seq, next_token], dim=1)
        cached_logits.append(staged_step(model, next_token, caches))
    assert [cache.length for cache in caches] == [seq.size(1)] * 3

    full = model(seq)  # [B, T, V]
    torch.testing.assert_close(torch.cat(cached_logits, dim=1), full)
    # Uncached greedy decoding from the same prompt picks the same tokens.
    uncached = prompt
    for _ in range(12):
        uncached = torch.cat([uncached, model(uncached)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(uncached, seq)


@torch.inference_mode()
def test_block_append_matches_one_by_one_and_truncate_rolls_back():
    model = make_model()
    prompt, draft, correction = random_tokens(1, 6, seed=2), random_tokens(1, 4, seed=3), random_tokens(1, 3, seed=4)

    block_caches = stage_caches(model)
    staged_step(model, prompt, block_caches)
    block_logits = staged_step(model, draft, block_caches)  # speculative verify: 4 tokens in one pass

    single_caches = stage_caches(model)
    staged_step(model, prompt, single_caches)
    single_logits = torch.cat([staged_step(model, draft[:, i : i + 1], single_caches) for i in range(4)], dim=1)
    torch.testing.assert_close(block_logits, single_logits)

    # Accept two draft tokens, roll back the other two, continue with different tokens.
    for cache in block_caches:
        cache.truncate(prompt.size(1) + 2)
    rolled_back_logits = staged_step(model, correction, block_caches)

    fresh_caches = stage_caches(model)
    staged_step(model, torch.cat([prompt, draft[:, :2]], dim=1), fresh_caches)
    fresh_logits = staged_step(model, correction, fresh_caches)
    torch.testing.assert_close(rolled_back_logits, fresh_logits)
    torch.testing.assert_close(rolled_back_logits, model(torch.cat([prompt, draft[:, :2], correction], dim=1))[:, -3:])
    assert block_caches[0].length == prompt.size(1) + 2 + correction.size(1)


def test_truncate_rejects_bad_lengths_and_reset_empties():
    cache = KVCache(TINY, n_layers=2)
    model = make_model()
    with torch.inference_mode():
        model.run_layers(model.embed(random_tokens(1, 4), 0), 0, 2, cache)
    assert cache.length == 4
    for bad in (-1, 5):
        with pytest.raises(ValueError):
            cache.truncate(bad)
    assert cache.length == 4
    cache.truncate(4)
    cache.truncate(0)
    assert cache.length == 0
    cache.length = 3
    cache.reset()
    assert cache.length == 0


def test_positions_past_block_size_raise():
    model = make_model()
    with pytest.raises(ValueError):
        model.embed(random_tokens(1, TINY.block_size + 1), 0)
    with pytest.raises(ValueError):
        model.embed(random_tokens(1, 2), TINY.block_size - 1)
    model.embed(random_tokens(1, 2), TINY.block_size - 2)  # the very last positions are fine
    cache = KVCache(TINY, n_layers=2)
    cache.length = TINY.block_size - 1
    with pytest.raises(ValueError):
        model.run_layers(torch.zeros(1, 2, TINY.n_embd), 0, 2, cache)


def test_run_layers_rejects_mismatched_cache():
    model = make_model()
    x = torch.zeros(1, 3, TINY.n_embd)
    with pytest.raises(ValueError):
        model.run_layers(x, 0, 2, KVCache(TINY, n_layers=3))
    with pytest.raises(ValueError):
        model.run_layers(x, 0, 2, KVCache(TINY, n_layers=2, batch_size=2))
    with pytest.raises(ValueError):
        model.run_layers(x, 4, 7)


def test_encode_decode_round_trip():
    text = "def f(x):\n    return x  # ünïcode ✓"
    ids = encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) > len(text)
    assert decode(ids) == text
    assert decode(ids[:-1]).endswith("\ufffd")  # a cut multi-byte character is replaced, not an error


@pytest.fixture(scope="module")
def corpus():
    """One build of the corpus for the tests that read it (~8 s of compiling the sources it quotes, each build)."""
    return build_corpus()


def test_corpus_is_deterministic_and_mixes_code_docstrings_and_prose(corpus):
    first, second = corpus, build_corpus()
    assert first.train == second.train and first.val == second.val and first.sha256 == second.sha256
    assert len(first.train) > 1_000_000 and len(first.val) > 100_000
    kinds = {s.kind: s for s in first.kinds}
    assert list(kinds) == list(KINDS)
    total = sum(s.train_bytes + s.val_bytes for s in first.kinds)
    for stats in first.kinds:
        assert 0.1 < (stats.train_bytes + stats.val_bytes) / total < 0.8, stats  # a mix, not one kind
        assert 0.05 < stats.val_bytes / (stats.train_bytes + stats.val_bytes) < 0.2, stats  # ~10% held out
    val = dict(first.val_by_kind)
    assert b"def " in val["code"] and b"import " in val["code"]
    assert b"def " not in val["docstrings"][:10_000] and b"the " in val["docstrings"]
    for kind, held_out in first.val_by_kind:
        assert held_out[1000:1200] not in first.train, kind  # held-out documents are not in training


def test_load_model_rejects_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="draft"):
        train.load_model("nope", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # rejected before any training


@pytest.fixture
def tiny_recipe(monkeypatch, corpus):
    """Swap the real recipe for one that trains in well under a second, and count the trainings. Every training reads
    the module's one corpus (that two builds agree is the corpus test's, above)."""
    tiny_train = train.TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1)
    byte_level = dataclasses.replace(TINY, vocab_size=256)  # the corpus holds every byte value
    models = {"target": dataclasses.replace(byte_level, n_layer=2), "draft": dataclasses.replace(byte_level, n_layer=1)}
    monkeypatch.setattr(train, "MODEL_CONFIGS", models)
    monkeypatch.setattr(train, "TRAIN_CONFIGS", {"target": tiny_train, "draft": tiny_train})
    monkeypatch.setattr(train, "EVAL_WINDOWS_PER_KIND", 2)
    monkeypatch.setattr(train, "build_corpus", lambda: corpus)
    calls = []
    real_train_model = train.train_model

    def counting_train_model(name, corpus):
        calls.append(name)
        return real_train_model(name, corpus)

    monkeypatch.setattr(train, "train_model", counting_train_model)
    return calls


def test_a_changed_recipe_trains_into_the_cache_once_shared_and_keyed(tmp_path, monkeypatch, tiny_recipe):
    assert train.needs_training(tmp_path)  # the shipped weights are for the real recipe, not this one
    results = []
    workers = [threading.Thread(target=lambda: results.append(train.ensure_trained(tmp_path))) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert tiny_recipe == ["target", "draft"]  # the lock let exactly one caller train
    assert len({result["key"] for result in results}) == 1
    meta = results[0]
    assert meta["source"] == "cache" and set(meta["models"]) == {"target", "draft"}
    assert meta["models"]["target"]["params"] == train.load_model("target", tmp_path).num_params()
    assert not train.needs_training(tmp_path)

    draft = train.load_model("draft", tmp_path)
    assert not draft.training and next(draft.parameters()).dtype == torch.float32
    assert tiny_recipe == ["target", "draft"]  # loading reads the cache

    monkeypatch.setattr(train, "TRAIN_CONFIGS", {name: dataclasses.replace(cfg, steps=4) for name, cfg in train.TRAIN_CONFIGS.items()})
    train.ensure_trained(tmp_path)
    assert tiny_recipe == ["target", "draft"] * 2  # a changed recipe invalidates the cache
    assert len(list(tmp_path.glob("*.safetensors"))) == 2  # stale weights are cleaned up


def test_training_is_deterministic(tmp_path, tiny_recipe):
    first = train.ensure_trained(tmp_path / "a")
    second = train.ensure_trained(tmp_path / "b")
    assert first["models"]["target"]["val_loss"] == second["models"]["target"]["val_loss"]
    for name in ("target", "draft"):
        a, b = train.load_model(name, tmp_path / "a"), train.load_model(name, tmp_path / "b")
        for (key, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(pa, pb), key


# ---- the shipped weights (agents/zoo/weights/) ----


def test_shipped_weights_match_the_recipe_and_load():
    meta = train.read_shipped()
    assert meta is not None, f"{train.WEIGHTS_DIR}: missing, or not for recipe {train.recipe_hash()[:16]}; see the log"
    assert meta["key"] == train.recipe_hash() and meta["source"] == "shipped"
    assert not train.needs_training()
    for name, config in train.MODEL_CONFIGS.items():
        path = train.WEIGHTS_DIR / meta["models"][name]["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["models"][name]["sha256"]
        assert path.suffix == ".safetensors" and all(v.dtype == torch.float16 for v in load_file(path).values())
        model = train.load_model(name)
        assert model.config == config and model.num_params() == meta["models"][name]["params"]
        assert not model.training and next(model.parameters()).dtype == torch.float32


def test_shipped_weights_are_found_again_by_a_changed_file(tmp_path, monkeypatch):
    for path in train.WEIGHTS_DIR.iterdir():
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(train, "WEIGHTS_DIR", tmp_path)
    assert train.read_shipped() is not None
    draft = tmp_path / train.read_shipped()["models"]["draft"]["file"]
    data = bytearray(draft.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the tensor data
    draft.write_bytes(bytes(data))
    assert train.read_shipped() is None  # a corrupt (or Git LFS pointer) file is not loaded


@torch.inference_mode()
def test_shipped_fp16_weights_give_the_recorded_loss(corpus):
    meta = train.read_shipped()
    if corpus.sha256 != meta["corpus"]["sha256"]:
        pytest.skip(f"this machine builds corpus {corpus.sha256[:16]}, the weights were trained on {meta['corpus']['sha256'][:16]}")
    for name in train.MODEL_CONFIGS:
        loss = train.evaluate(train.load_model(name), corpus, train.QUICK_EVAL_WINDOWS_PER_KIND)["val_loss"]
        assert loss == pytest.approx(meta["models"][name]["quick_val_loss_fp16"], abs=1e-3), name
        recorded = meta["models"][name]
        assert abs(recorded["val_loss_fp16"] - recorded["val_loss"]) < train.FP16_TOLERANCE_NATS


def test_shipped_models_beat_the_baselines():
    meta = train.read_shipped()
    models = meta["models"]
    assert models["target"]["val_loss"] < min(models["draft"]["val_loss"], meta["previous_recipe"]["val_loss"])
    assert all(stats["val_loss"] < meta["unigram_val_loss"] - 0.5 for stats in models.values())


def longest_run(ids: list[int]) -> int:
    return max(sum(1 for _ in group) for _, group in itertools.groupby(ids))


# Greedy from here writes code (`self.__class__(self, default)` ...); right after a bare indentation, e.g.
# "def main():\n    ", these tiny byte models still emit a run of spaces (see README, The models). It is the
# default prompt of a scenario that names none: this test holds the default to it.
CODE_PROMPT = DecodeConfig().prompt


@pytest.mark.parametrize("name", ["target", "target-deep"])
def test_greedy_decoding_from_a_code_prompt_is_not_degenerate(name):
    ids = generate(train.load_model(name), CODE_PROMPT, 80)
    assert len(set(ids)) >= 10 and longest_run(ids) <= 16, repr(decode(ids))


@torch.inference_mode()
def test_trained_target_decodes_staged_and_cached_as_one_forward():
    model = train.load_model("target")
    prompt = torch.tensor([encode("import os\n\ndef main(")])
    caches = [KVCache(model.config, n, 1) for n in (2, 2, 2)]
    x = model.embed(prompt, 0)
    for (first, last), cache in zip(STAGES, caches):
        x = model.run_layers(x, first, last, cache)
    seq, logits = prompt, model.head(x)[:, -1]
    for _ in range(16):
        token = logits.argmax(dim=-1, keepdim=True)
        torch.testing.assert_close(logits, model(seq)[:, -1], atol=1e-4, rtol=1e-4)
        seq = torch.cat([seq, token], dim=1)
        x = model.embed(token, caches[0].length)
        for (first, last), cache in zip(STAGES, caches):
            x = model.run_layers(x, first, last, cache)
        logits = model.head(x)[:, -1]
