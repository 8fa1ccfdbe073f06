"""A local Hugging Face checkpoint as a stage model: its decoder layers (agents.hf.layers), one stage at a time.

HFModel offers what agents.zoo.model.GPT offers the ring (embed, embed_at, run_layers, run_layers_batched, head,
new_cache), so a PipelineStage, the drafters and the decode modes run a checkpoint as they run the byte models.

A stage reads only its own tensors from the safetensors files (safe_open reads one tensor at a time, mapped, never
the whole file), each checked by name and shape when the checkpoint was opened, and runs them through the family's layer
(agents.hf.layers: plain torch, checked against transformers' forward in tests/test_hf.py; why not transformers'
own classes is said there). Each layer runs with the stage's own KV cache (agents.zoo.model.KVCache, a preallocated
tensor) behind one method, `update(key, value, layer_idx)`: rewinding it (speculation's rejected tail) and
compacting it (a tree's accepted path) stay what they are for the byte models. The attention mask is always
explicit (a causal block after its past, a tree's ancestors, a continuous batch's own lengths). The rotary position
embedding (Llama, Qwen2, Mistral) is computed per call from the tokens' positions, which are not the cache slots
in a tree; GPT-2's learned positions are added at the embedding, as the byte models do.

The stages compute in float32 whatever the checkpoint's dtype (this is a CPU box; bf16 matmuls on it are slow and
not what a GPU computes either); the hidden states cross the links as float32, or in the scenario's [wire] codec.
"""

from __future__ import annotations

import math
import mmap

import torch
import torch.nn.functional as F

from agents.hf import layers
from agents.hf.checkpoint import Checkpoint, entry_shapes, layer_shapes
from agents.zoo.model import KVCache, check_batch


class _StageCache:
    """The cache a layer's attention calls (`update`), over a KVCache of layers first.. at `start`."""

    def __init__(self, cache: KVCache, first: int, start: int) -> None:
        self.cache, self.first, self.start = cache, first, start

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, **_) -> tuple[torch.Tensor, torch.Tensor]:
        i, end = layer_idx - self.first, self.start + key.shape[2]
        self.cache.k[i][:, :, self.start:end] = key  # key: [B, kv_heads, T, hd]
        self.cache.v[i][:, :, self.start:end] = value
        return self.cache.k[i][:, :, :end], self.cache.v[i][:, :, :end]  # [B, kv_heads, start+T, hd]


class _BatchCache:
    """Continuous batching: row b of a [B, 1, C] batch appends to its own cache at its own length; every row reads
    the same number of slots (the longest past + 1) and the mask hides what is past its own."""

    def __init__(self, caches: list[KVCache], first: int) -> None:
        self.caches, self.first = caches, first
        self.lengths = [cache.length for cache in caches]
        self.slots = max(self.lengths) + 1

    def mask(self) -> torch.Tensor:
        seen = torch.arange(self.slots)[None, :] <= torch.tensor(self.lengths)[:, None]  # [B, slots]
        return seen[:, None, None, :]  # [B, 1, 1, slots]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, **_) -> tuple[torch.Tensor, torch.Tensor]:
        i = layer_idx - self.first
        keys, values = [], []
        for b, (cache, length) in enumerate(zip(self.caches, self.lengths)):
            cache.k[i][:, :, length:length + 1] = key[b:b + 1]  # [1, kv_heads, 1, hd]
            cache.v[i][:, :, length:length + 1] = value[b:b + 1]
            keys.append(cache.k[i][:, :, :self.slots])
            values.append(cache.v[i][:, :, :self.slots])
        return torch.cat(keys), torch.cat(values)  # [B, kv_heads, slots, hd]


class HFModel:
    """A checkpoint's decoder, its parts loaded on demand (load): a stage holds its layers only."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.name = checkpoint.name
        self.config = checkpoint.shape
        self.vocabulary = checkpoint.vocabulary()
        self.rope = checkpoint.family.base == "model"  # Llama, Qwen2, Mistral rotate q and k; GPT-2 learns positions
        self.rotary = layers.Rotary(checkpoint) if self.rope else None
        self.layers: dict[int, layers.LlamaLayer | layers.GPT2Layer] = {}  # the loaded ones, by index
        self.entry: dict[str, torch.Tensor] = {}  # the embeddings, the final norm and the head, once loaded
        base, embedding = checkpoint.family.base, f"{checkpoint.family.base}.{checkpoint.family.embeddings[0]}.weight"
        norm = f"{base}.{checkpoint.family.final_norm}"
        self._entry_names = {"embedding": embedding, "positions": f"{base}.wpe.weight", "norm": f"{norm}.weight",
                             "norm_bias": f"{norm}.bias", "head": embedding if checkpoint.tied else "lm_head.weight"}
        self.loaded: set[str] = set()  # canonical tensor names assigned so far

    def load(self, first: int, last: int, entry: bool) -> "HFModel":
        """Read the tensors of layers first..last-1 (and the entry's embeddings, norm and head) from the
        safetensors files, one tensor at a time (each was checked, by name and shape, when the checkpoint was
        opened: agents.hf.checkpoint); what is loaded already stays."""
        checkpoint = self.checkpoint
        checkpoint.stage_tensors(first, last, entry)  # the range and every part's presence, named if not
        wanted = [(i, layer_shapes(checkpoint, i)) for i in range(first, last) if i not in self.layers]
        if entry and not self.entry:
            wanted.append((None, entry_shapes(checkpoint)))
        for index, shapes in wanted:
            tensors = {name: self._read(name) for name in shapes}
            self.loaded |= set(tensors)
            if index is None:
                self.entry = tensors
            else:
                prefix = checkpoint.layer_prefix(index)
                self.layers[index] = layers.build_layer(
                    checkpoint, index, {name[len(prefix):]: tensor for name, tensor in tensors.items()})
        return self

    def _read(self, name: str) -> torch.Tensor:
        """One tensor, mapped: a float32 tensor stays backed by the file's clean pages, which come in as the stage
        first computes with them (its RSS grows by its share; rows of the embedding it never looks up not even
        that); another dtype is converted alone, so the peak is the share plus one tensor."""
        from safetensors import safe_open

        file, stored = self.checkpoint.tensors[name]
        with safe_open(str(file), framework="pt") as f:
            return f.get_tensor(stored).to(torch.float32)

    def _entry(self, part: str) -> torch.Tensor:
        if not self.entry:
            raise ValueError(f"HFModel: the entry's tensors are not loaded (load(..., entry=True)) for {part}")
        return self.entry[self._entry_names[part]]

    def num_params(self) -> int:
        """Every parameter of the checkpoint (loaded or not), as config.json shapes them."""
        shapes = [entry_shapes(self.checkpoint)] + [layer_shapes(self.checkpoint, i)
                                                            for i in range(self.config.n_layer)]
        return sum(math.prod(shape) for group in shapes for shape in group.values())

    def new_cache(self, n_layers: int, batch_size: int = 1, extra_slots: int = 0) -> KVCache:
        """A KVCache of CONTEXT_CAP (+ extra) slots whose memory is taken as it is written: its keys and values lie
        in anonymous mappings, zero until touched, so a stage holds the positions it decoded, not 2,048 of them
        (36 MB a stage of three 768-wide layers would otherwise hold, and count in its RSS, from the start)."""
        cache = KVCache(self.config, n_layers, batch_size, extra_slots=extra_slots, device="meta")  # shapes only
        cache.k, cache.v = _zero_pages(cache.k.shape), _zero_pages(cache.v.shape)
        return cache

    def _check_positions(self, positions: list[int], where: str) -> None:
        if any(p < 0 or p >= self.config.block_size for p in positions):
            raise ValueError(f"HFModel.{where}: positions {min(positions)}..{max(positions)} are outside "
                             f"0..{self.config.block_size - 1}")

    def embed(self, idx: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Token (and GPT-2's position) embedding of idx [B, T] at positions start_pos.. -> [B, T, C]."""
        T = idx.size(1)
        self._check_positions([start_pos, start_pos + T - 1], "embed")
        x = F.embedding(idx, self._entry("embedding"))  # [B, T, C]
        return x if self.rope else x + self._entry("positions")[start_pos:start_pos + T]

    def embed_at(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token per row, each at its own position -> [B, 1, C]."""
        self._check_positions(positions, "embed_at")
        x = F.embedding(torch.tensor(ids, dtype=torch.long), self._entry("embedding"))  # [B, C]
        return (x if self.rope else x + self._entry("positions")[positions]).unsqueeze(1)  # [B, 1, C]

    def _layers(self, first: int, last: int) -> list:
        missing = [i for i in range(first, last) if i not in self.layers]
        if missing:
            raise ValueError(f"HFModel: layers {missing} are not loaded (load({first}, {last}, ...))")
        return [self.layers[i] for i in range(first, last)]

    def run_layers(self, x: torch.Tensor, first: int, last: int, cache: KVCache | None = None,
                   mask: torch.Tensor | None = None, positions: list[int] | None = None) -> torch.Tensor:
        """Layers first..last-1 on x [B, T, C] -> [B, T, C], appended after the cache's past. `mask` ([T, past+T]
        bool, True = may attend) replaces the causal one; `positions` (a tree's nodes: root + depth) replace
        past.. where they are not the slots."""
        if not 0 <= first <= last <= self.config.n_layer:
            raise ValueError(f"HFModel.run_layers: expected 0 <= first <= last <= {self.config.n_layer}, "
                             f"got {first}, {last}")
        B, T, _ = x.size()
        start = cache.length if cache is not None else 0
        if cache is not None:
            if cache.n_layers != last - first or cache.batch_size != B:
                raise ValueError(f"HFModel.run_layers: a cache of {cache.n_layers} layers, batch {cache.batch_size} "
                                 f"does not fit layers {first}:{last}, batch {B}")
            if start + T > cache.block_size:
                raise ValueError(f"HFModel.run_layers: {start} cached + {T} new exceed {cache.block_size} slots")
        if mask is None and T > 1:
            mask = torch.ones(T, start + T, dtype=torch.bool).tril(diagonal=start)  # [T, start+T]
        if mask is not None and tuple(mask.shape) != (T, start + T):
            raise ValueError(f"HFModel.run_layers: mask {tuple(mask.shape)} does not fit {T} new after {start}")
        pos = torch.tensor([positions] if positions is not None else [list(range(start, start + T))])  # [1, T]
        rope = self.rotary(pos.expand(B, T)) if self.rotary else None
        view = _StageCache(cache, first, start) if cache is not None else None
        attention = None if mask is None else mask[None, None]  # [1, 1, T, start+T]
        for layer in self._layers(first, last):
            x = layer(x, attention, view, rope)
        if cache is not None:
            cache.length = start + T
        return x

    def run_layers_batched(self, x: torch.Tensor, first: int, last: int, caches: list[KVCache]) -> torch.Tensor:
        """Continuous batching: x [B, 1, C], one new token of each of B sequences, each with its own cache."""
        check_batch("HFModel", x, first, last, caches, self.config.n_layer)
        view = _BatchCache(caches, first)
        rope = self.rotary(torch.tensor(view.lengths)[:, None]) if self.rotary else None  # at [B, 1]
        attention = view.mask()
        for layer in self._layers(first, last):
            x = layer(x, attention, view, rope)
        for cache in caches:
            cache.length += 1
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        if self.rope:
            x = layers.rms_norm(x, self._entry("norm"), float(self.checkpoint.config.get("rms_norm_eps", 1e-6)))
        else:
            x = F.layer_norm(x, x.shape[-1:], self._entry("norm"), self._entry("norm_bias"),
                             float(self.checkpoint.config.get("layer_norm_epsilon", 1e-5)))
        return F.linear(x, self._entry("head"))  # [B, T, C] -> [B, T, V]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """The unsplit forward of idx [B, T] -> logits [B, T, V] (every part must be loaded)."""
        return self.head(self.run_layers(self.embed(idx, 0), 0, self.config.n_layer))

    __call__ = forward


def _zero_pages(shape: torch.Size) -> torch.Tensor:
    """A float32 tensor of zeros over an anonymous mapping: a page is the kernel's shared zero page until written
    (read past the written slots, a batch's shorter rows read zeros and cost no memory), unlike torch.zeros, which
    writes, and so holds, every page at once."""
    n = shape.numel()
    if n == 0:
        return torch.zeros(shape)
    pages = mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: a read maps the zero page
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # with transparent huge pages "always", one write would take 2 MB
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(pages, dtype=torch.float32).view(shape)  # the tensor keeps the mapping alive


def load_hf(name: str) -> HFModel:
    """The checkpoint `name` ("hf:PATH") with nothing loaded yet: HFModel.load assigns a stage's share."""
    return HFModel(Checkpoint.open(name))
