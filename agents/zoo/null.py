"""The null model: a byte model's shapes without its weights or its arithmetic ("null:NAME" in a scenario).

A stage's compute is the scenario's stated figure on every backend (emulated: padded on real time, charged on
simulated time), and a frame's bytes are the hidden state's shape, not its values; so where no token's value changes
what happens next, a run's timing does not depend on the tokens. That holds for plain decode and serving with fixed
output lengths (EOS ignored, as the serve mode always does): there the null model gives the same records, every
arrival, admission and token time to the byte, and skips the tiny model's forward passes, which dominate a long trace
on simulated time (tests/test_null_model.py holds a served trace's records equal). It does not hold where tokens
decide the timing (a draft's acceptance: the speculating modes refuse it, testbed.scenario.model) nor for the text.

Its hidden states are zeros, its logits are zeros (greedy decodes token 0; a temperature samples uniformly), and its
caches keep positions only (agents.zoo.model.KVCache with no layers).
"""

from __future__ import annotations

import torch

from agents.zoo.configs import BYTES, NULL_PREFIX, GPTConfig, is_null
from agents.zoo.model import KVCache

class NullModel:
    """What a stage and the entry call of a model (agents.zoo.model.GPT), at its shapes, computing nothing."""

    vocabulary = BYTES

    def __init__(self, config: GPTConfig, name: str) -> None:
        self.config, self.name = config, name

    def new_cache(self, n_layers: int, batch_size: int = 1, extra_slots: int = 0) -> KVCache:
        return KVCache(self.config, 0, batch_size, extra_slots=extra_slots)  # positions only: no keys, no values

    def embed(self, idx: torch.Tensor, start_pos: int) -> torch.Tensor:
        if start_pos < 0 or start_pos + idx.size(1) > self.config.block_size:
            raise ValueError(f"NullModel.embed: positions {start_pos}..{start_pos + idx.size(1) - 1} are outside "
                             f"0..{self.config.block_size - 1}")
        return torch.zeros(idx.size(0), idx.size(1), self.config.n_embd)

    def embed_at(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        if any(p < 0 or p >= self.config.block_size for p in positions):
            raise ValueError(f"NullModel.embed_at: positions {positions} are outside 0..{self.config.block_size - 1}")
        return torch.zeros(len(ids), 1, self.config.n_embd)

    def run_layers(self, x: torch.Tensor, first: int, last: int, cache: KVCache | None = None,
                   mask: torch.Tensor | None = None, positions: list[int] | None = None) -> torch.Tensor:
        if cache is not None:
            if cache.length + x.size(1) > cache.block_size:
                raise ValueError(f"NullModel.run_layers: {cache.length} cached + {x.size(1)} new positions exceed "
                                 f"block_size {cache.block_size}")
            cache.length += x.size(1)
        return x

    def run_layers_batched(self, x: torch.Tensor, first: int, last: int, caches: list[KVCache]) -> torch.Tensor:
        for cache in caches:
            cache.length += 1
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.size(0), x.size(1), self.config.vocab_size)


__all__ = ["NULL_PREFIX", "NullModel", "is_null"]
