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
    """

    def __init__(self, model: GPT, plan: StagePlan, batch_size: int = 1) -> None:
        self.model = model
        self.plan = plan
        self.cache = KVCache(model.config, plan.last_layer - plan.first_layer, batch_size)

    def _rewind(self, pos: int) -> None:
        if pos > self.cache.length:
            raise ValueError(f"block starts at position {pos} but stage {self.plan.stage} has only "
                             f"{self.cache.length} cached")
        self.cache.truncate(pos)

    @torch.inference_mode()
    def run(self, hidden: np.ndarray, pos: int) -> np.ndarray:
        """Middle/last stage: hidden [B, T, C] float32 at positions pos.. -> hidden [B, T, C]."""
        self._rewind(pos)
        x = torch.from_numpy(hidden)  # [B, T, C]
        x = self.model.run_layers(x, self.plan.first_layer, self.plan.last_layer, self.cache)
        return x.numpy()

    @torch.inference_mode()
    def embed_and_run(self, ids: list[int], pos: int) -> np.ndarray:
        """Entry stage, first half of a lap: token ids at positions pos.. -> hidden [1, T, C]."""
        self._rewind(pos)
        idx = torch.tensor([ids], dtype=torch.long)  # [1, T]
        x = self.model.embed(idx, pos)  # [1, T, C]
        x = self.model.run_layers(x, self.plan.first_layer, self.plan.last_layer, self.cache)
        return x.numpy()

    @torch.inference_mode()
    def logits(self, hidden: np.ndarray) -> torch.Tensor:
        """Entry stage, second half of a lap: final hidden [1, T, C] -> logits [T, V]."""
        return self.model.head(torch.from_numpy(hidden))[0]
