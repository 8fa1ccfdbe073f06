"""Continuous batching over cache arenas (agents.zoo.model.CacheArena; issue 54: the serve mode at scale).

GPT.run_layers_batched attends over the pasts of a batch's rows where they lie, side by side in an arena, each row
masked to its own past: no per-row copy of every request's KV a token. What it must keep: every sequence's greedy
tokens are those it decodes alone, whatever else is in the batch, and a cache stays a cache (reset, reused, written
in and out of inference mode).
"""

from __future__ import annotations

import torch

import agents.zoo.train as train
from agents.zoo.model import GPT, KVCache
from tests.test_model import TINY, make_model


def solo_greedy(model: GPT, prompt: list[int], tokens: int) -> list[int]:
    """Greedy tokens of one sequence decoded alone with its own cache, a token at a time."""
    cache, n_layer = KVCache(model.config, model.config.n_layer), model.config.n_layer
    x = model.run_layers(model.embed(torch.tensor([prompt]), 0), 0, n_layer, cache)
    out = []
    for _ in range(tokens):
        out.append(int(model.head(x)[0, -1].argmax()))
        x = model.run_layers(model.embed(torch.tensor([out[-1:]]), cache.length), 0, n_layer, cache)
    return out


@torch.inference_mode()
def test_batched_decode_through_arenas_gives_each_sequence_its_solo_tokens():
    """run_layers_batched attends over CacheArena slots in place. Sequences of different lengths step in changing
    batches (all of them; every third one, which leaves most of the slots it spans out; more than one arena holds),
    one restarts from position 0 in its cache, one cache is dropped and its slot taken by a new one, and every
    sequence's greedy tokens are those it decodes alone."""
    from agents.zoo.model import ARENA_SLOTS
    from agents.zoo.prompts import synthetic

    model = train.load_model("target")
    n_layer = model.config.n_layer
    n = ARENA_SLOTS + 6
    prompts = {s: synthetic(5 + (s * 7) % 40, s) for s in range(n)}
    caches = {s: KVCache(model.config, n_layer) for s in range(n)}
    got: dict[int, list[int]] = {s: [] for s in range(n)}
    last: dict[int, torch.Tensor] = {}
    for s, ids in prompts.items():
        last[s] = model.run_layers(model.embed(torch.tensor([ids]), 0), 0, n_layer, caches[s])[0, -1]
    for step, (start, stride) in enumerate([(0, 1), (0, 3), (0, 1), (1, 3), (0, 1)]):
        if step == 2:  # sequence 4 restarts in its cache; sequence 5's cache goes, a new sequence takes its slot
            prompts[4], got[4] = synthetic(9, 1000), []
            caches[4].truncate(0)
            last[4] = model.run_layers(model.embed(torch.tensor([prompts[4]]), 0), 0, n_layer, caches[4])[0, -1]
            freed = caches.pop(5).slot
            del prompts[5], got[5], last[5]
            prompts[n], caches[n], got[n] = synthetic(12, n), KVCache(model.config, n_layer), []
            last[n] = model.run_layers(model.embed(torch.tensor([prompts[n]]), 0), 0, n_layer, caches[n])[0, -1]
        rows = sorted(caches)[start::stride]
        tokens = [int(model.head(last[r][None, None])[0, -1].argmax()) for r in rows]
        x = model.embed_at(tokens, [caches[r].length for r in rows])
        out = model.run_layers_batched(x, 0, n_layer, [caches[r] for r in rows])
        for b, (r, token) in enumerate(zip(rows, tokens)):
            got[r].append(token)
            last[r] = out[b, 0]
        if step == 2:
            assert caches[n].slot == freed and caches[n].arena is not None
    assert len({id(c.arena) for c in caches.values()}) == 2
    for s, tokens in got.items():
        assert tokens == solo_greedy(model, prompts[s], len(tokens)), s


@torch.inference_mode()
def test_batched_attention_reads_only_each_rows_own_past():
    """On peaked random weights (masking errors show above float noise), a batch whose rows' pasts differ in length,
    with stale keys past a row's length and slots of other caches between its rows, gives each row the hidden state
    it gets alone."""
    model = make_model()
    prompts = [[(7 * s + i) % 64 for i in range(3 + 4 * s)] for s in range(6)]
    batched, alone = [KVCache(TINY, 6) for _ in prompts], []
    for ids, cache in zip(prompts, batched):
        model.run_layers(model.embed(torch.tensor([ids + [1, 2, 3]]), 0), 0, 6, cache)  # stale keys past the prompt
        cache.truncate(len(ids) - 1)
        solo = KVCache(TINY, 6)
        alone.append(model.run_layers(model.embed(torch.tensor([ids]), 0), 0, 6, solo)[0, -1])
    first = model.embed_at([ids[-1] for ids in prompts], [len(ids) - 1 for ids in prompts])
    model.run_layers_batched(first[[0, 1, 2, 3, 4, 5]], 0, 6, batched)  # all six move into one arena
    for cache, ids in zip(batched, prompts):
        cache.truncate(len(ids) - 1)
    rows = [0, 3, 5]  # slots 1, 2 and 4 between them hold other caches
    out = model.run_layers_batched(first[rows], 0, 6, [batched[r] for r in rows])
    for b, r in enumerate(rows):
        torch.testing.assert_close(out[b, 0], alone[r], atol=1e-5, rtol=1e-5)


def test_a_cache_batched_in_inference_mode_is_written_again_outside_it():
    """A cache's arena is a plain tensor (as its own was), so a batched step in inference mode (a stage's) leaves it
    writable by a later pass under no_grad."""
    model = make_model()
    caches = [KVCache(TINY, 6) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            model.run_layers(model.embed(torch.tensor([[1, 2, 3]]), 0), 0, 6, cache)
    with torch.inference_mode():
        model.run_layers_batched(model.embed_at([4, 5], [3, 3]), 0, 6, caches)
    with torch.no_grad():
        model.run_layers(model.embed(torch.tensor([[6]]), 4), 0, 6, caches[0])
        model.run_layers_batched(model.embed_at([7, 8], [5, 4]), 0, 6, caches)
    assert [cache.length for cache in caches] == [6, 5]
