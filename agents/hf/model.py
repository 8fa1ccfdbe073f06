"""A local Hugging Face checkpoint as a stage model: transformers' own decoder layers, run one stage at a time.

HFModel offers what agents.model.GPT offers the ring (embed, embed_at, run_layers, run_layers_batched, head,
new_cache), so a PipelineStage, the drafters and the decode modes run a checkpoint as they run the byte models.

Which way was taken, and why: the layers are transformers' own module classes (LlamaDecoderLayer, GPT2Block, ...),
built on the meta device from the checkpoint's config, so no memory is spent on a layer a stage does not run; a
stage then loads only its own tensors from the safetensors files (safe_open reads one tensor at a time, mapped,
never the whole file) and assigns them. Each layer runs with the stage's own KV cache (agents.model.KVCache, a
preallocated tensor) behind the one method transformers' attention calls, `update(key, value, layer_idx)`:
rewinding it (speculation's rejected tail) and compacting it (a tree's accepted path) stay what they are for the
byte models. The attention mask is always explicit (a causal block after its past, a tree's ancestors, a
continuous batch's own lengths), so no family's mask builder or cache class is involved. The rotary position
embedding (Llama, Qwen2, Mistral) is computed per call from the tokens' positions, which are not the cache slots
in a tree; GPT-2's learned positions are added at the embedding, as the byte models do.

The stages compute in float32 whatever the checkpoint's dtype (this is a CPU box; bf16 matmuls on it are slow and
not what a GPU computes either); the hidden states cross the links as float32, or in the scenario's [wire] codec.
"""

from __future__ import annotations

import mmap
import os

import torch

from agents.hf.checkpoint import Checkpoint
from agents.model import KVCache, check_batch
from testbed.core.errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory only: nothing may download at run time


class _StageCache:
    """The cache object transformers' attention calls (`update`), over a KVCache of layers first.. at `start`."""

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
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # an agent's stderr is the run's log: no bars in it

        self.checkpoint = checkpoint
        self.name = checkpoint.name
        self.config = checkpoint.shape
        self.vocabulary = checkpoint.vocabulary()
        hf_config = AutoConfig.from_pretrained(checkpoint.path, local_files_only=True)
        hf_config._attn_implementation = "sdpa"
        with torch.device("meta"):  # shapes only: the tensors a stage runs are assigned by load()
            self.module = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        self.module.eval().requires_grad_(False)
        family = checkpoint.family
        self.decoder = getattr(self.module, family.base)
        self.layers = getattr(self.decoder, family.layers)
        self.rope = family.base == "model"  # Llama, Qwen2, Mistral rotate q and k by position; GPT-2 learns positions
        if self.rope:
            self.rotary = type(self.decoder.rotary_emb)(config=hf_config)  # its inv_freq is computed, not stored
        self.loaded: set[str] = set()  # canonical tensor names assigned so far

    def load(self, first: int, last: int, entry: bool) -> "HFModel":
        """Assign the tensors of layers first..last-1 (and the entry's embeddings, norm and head), read from the
        safetensors files one tensor at a time; what is loaded already stays."""
        from safetensors import safe_open

        wanted = {name: where for name, where in self.checkpoint.stage_tensors(first, last, entry).items()
                  if name not in self.loaded}
        state = {}
        for name, (file, stored) in wanted.items():
            # one tensor per opening, mapped: a float32 tensor stays backed by the file's clean pages, which come in as
            # the stage first computes with them (its RSS grows by its share, rows of the embedding it never looks up
            # not even that); another dtype is converted one tensor at a time, so the peak is the share plus one tensor
            with safe_open(str(file), framework="pt") as f:
                state[name] = f.get_tensor(stored).to(torch.float32)
        expected = dict(self.module.named_parameters(remove_duplicate=False))
        for name, tensor in state.items():
            if name in expected and tuple(expected[name].shape) != tuple(tensor.shape):
                raise ConfigError(f"tensor {name!r} is {tuple(tensor.shape)}, config.json makes it "
                                  f"{tuple(expected[name].shape)}", source=str(wanted[name][0]), key=name)
        self.module.load_state_dict(state, strict=False, assign=True)
        self.loaded |= set(state)
        if entry and self.checkpoint.tied:
            self.module.lm_head.weight = self.decoder.get_input_embeddings().weight
        parts = [self.layers[i] for i in range(first, last)]
        if entry:
            parts += [getattr(self.decoder, m) for m in (*self.checkpoint.family.embeddings,
                                                          self.checkpoint.family.final_norm)] + [self.module.lm_head]
        for part in parts:
            for name, tensor in [*part.named_parameters(), *part.named_buffers()]:
                if tensor.is_meta:
                    raise ConfigError(f"the weights hold no {name!r} for {type(part).__name__}",
                                      source=str(self.checkpoint.index_file), key=name)
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

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
        x = self.decoder.get_input_embeddings()(idx)  # [B, T, C]
        return x if self.rope else x + self.decoder.wpe.weight[start_pos:start_pos + T]

    def embed_at(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token per row, each at its own position -> [B, 1, C]."""
        self._check_positions(positions, "embed_at")
        x = self.decoder.get_input_embeddings()(torch.tensor(ids, dtype=torch.long))  # [B, C]
        return (x if self.rope else x + self.decoder.wpe.weight[positions]).unsqueeze(1)  # [B, 1, C]

    def _layer_kwargs(self, x: torch.Tensor, positions: torch.Tensor) -> dict:
        """What every layer of the family takes besides the hidden state: the rotary cos/sin at `positions` [B, T]."""
        if not self.rope:
            return {}
        return {"position_ids": positions, "position_embeddings": self.rotary(x, positions)}

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
        kwargs = self._layer_kwargs(x, pos.expand(B, T))
        view = _StageCache(cache, first, start) if cache is not None else None
        attention = None if mask is None else mask[None, None]  # [1, 1, T, start+T]
        for layer in self.layers[first:last]:
            x = layer(x, attention_mask=attention, cache=view, **kwargs)
        if cache is not None:
            cache.length = start + T
        return x

    def run_layers_batched(self, x: torch.Tensor, first: int, last: int, caches: list[KVCache]) -> torch.Tensor:
        """Continuous batching: x [B, 1, C], one new token of each of B sequences, each with its own cache."""
        check_batch("HFModel", x, first, last, caches, self.config.n_layer)
        view = _BatchCache(caches, first)
        kwargs = self._layer_kwargs(x, torch.tensor(view.lengths)[:, None])  # [B, 1]
        attention = view.mask()
        for layer in self.layers[first:last]:
            x = layer(x, attention_mask=attention, cache=view, **kwargs)
        for cache in caches:
            cache.length += 1
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        final_norm = getattr(self.decoder, self.checkpoint.family.final_norm)
        return self.module.lm_head(final_norm(x))  # [B, T, C] -> [B, T, V]

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
