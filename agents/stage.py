"""A pipeline stage: a contiguous slice of the target's layers with its own KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agents.model import GPT, KVCache


@dataclass(frozen=True)
class StagePlan:
    """What one agent runs: its layers of the target, and whether it is the entry node."""

    stage: int
    n_stages: int
    first_layer: int
    last_layer: int  # exclusive

    @property
    def is_entry(self) -> bool:
        return self.stage == 0


class PipelineStage:
    """Runs this stage's layers on hidden states; the entry stage also embeds and owns the LM head.

    Every call names the sequence position `pos` of the block's first token: the cache is rolled back
    to `pos` first, which is how speculation discards rejected drafts and how a new sequence starts.
    Each of the sequences in flight (`stream`, the frame's stream id) has its own KV cache, made on first use.
    """

    MAX_STREAMS = 1024  # KV caches one stage keeps (a frame's stream id is checked against it)

    def __init__(self, model: GPT, plan: StagePlan, batch_size: int = 1) -> None:
        self.model = model
        self.plan = plan
        self.batch_size = batch_size
        self.caches: dict[int, KVCache] = {}
        if plan.last_layer > plan.first_layer:  # a separate head's agent (agents.head) runs no layers
            self.cache_for(0)

    def cache_for(self, stream: int) -> KVCache:
        cache = self.caches.get(stream)
        if cache is None:
            if not 0 <= stream < self.MAX_STREAMS:
                raise ValueError(f"stream id {stream} is outside 0..{self.MAX_STREAMS - 1}")
            cache = self.caches[stream] = KVCache(self.model.config, self.plan.last_layer - self.plan.first_layer,
                                                  self.batch_size)
        return cache

    def _rewind(self, pos: int, stream: int = 0) -> KVCache:
        cache = self.cache_for(stream)
        if pos > cache.length:
            raise ValueError(f"block starts at position {pos} but stage {self.plan.stage} has only "
                             f"{cache.length} cached for stream {stream}")
        cache.truncate(pos)
        return cache

    @torch.inference_mode()
    def run(self, hidden: np.ndarray, pos: int, stream: int = 0) -> np.ndarray:
        """Middle/last stage: hidden [B, T, C] float32 at positions pos.. -> hidden [B, T, C]."""
        cache = self._rewind(pos, stream)
        x = torch.from_numpy(hidden)  # [B, T, C]
        x = self.model.run_layers(x, self.plan.first_layer, self.plan.last_layer, cache)
        return x.numpy()

    @torch.inference_mode()
    def run_batch(self, hiddens: list[np.ndarray], positions: list[int], streams: list[int]) -> list[np.ndarray]:
        """Continuous batching: one new token of each of several streams ([1, 1, C] each) in one forward pass."""
        caches = [self._rewind(pos, stream) for pos, stream in zip(positions, streams, strict=True)]
        x = torch.from_numpy(np.concatenate(hiddens))  # [B, 1, C]
        x = self.model.run_layers_batched(x, self.plan.first_layer, self.plan.last_layer, caches)
        return [row[None] for row in x.numpy()]

    @torch.inference_mode()
    def embed_and_run(self, ids: list[int], pos: int, stream: int = 0) -> np.ndarray:
        """Entry stage, first half of a lap: token ids at positions pos.. -> hidden [1, T, C]."""
        cache = self._rewind(pos, stream)
        idx = torch.tensor([ids], dtype=torch.long)  # [1, T]
        x = self.model.embed(idx, pos)  # [1, T, C]
        x = self.model.run_layers(x, self.plan.first_layer, self.plan.last_layer, cache)
        return x.numpy()

    @torch.inference_mode()
    def embed_and_run_batch(self, ids: list[int], positions: list[int], streams: list[int]) -> list[np.ndarray]:
        """Entry stage, continuous batching: the next token of each of several streams in one forward pass."""
        caches = [self._rewind(pos, stream) for pos, stream in zip(positions, streams, strict=True)]
        x = self.model.embed_at(ids, positions)  # [B, 1, C]
        x = self.model.run_layers_batched(x, self.plan.first_layer, self.plan.last_layer, caches)
        return [row[None] for row in x.numpy()]

    @torch.inference_mode()
    def logits(self, hidden: np.ndarray) -> torch.Tensor:
        """Entry stage, second half of a lap: final hidden [1, T, C] -> logits [T, V]."""
        return self.model.head(torch.from_numpy(hidden))[0]
