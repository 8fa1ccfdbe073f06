"""A pipeline stage: a contiguous slice of the target's layers with its own KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agents.zoo.model import GPT, KVCache, tree_mask


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

    def __init__(self, model: GPT, plan: StagePlan, batch_size: int = 1, tree_slots: int = 0) -> None:
        self.model = model
        self.plan = plan
        self.batch_size = batch_size
        self.tree_slots = tree_slots  # tree speculation: cache slots beyond the positions, for a tree's nodes
        self.caches: dict[int, KVCache] = {}
        self.trees: dict[int, list[int]] = {}  # stream -> the parents of the tree its next block is
        self.last_tree: dict[int, tuple[list[int], list[int]]] = {}  # stream -> (parents, tokens) of its last tree
        if plan.last_layer > plan.first_layer:  # a separate head's agent (agents.process.head) runs no layers
            self.cache_for(0)

    def cache_for(self, stream: int) -> KVCache:
        cache = self.caches.get(stream)
        if cache is None:
            if not 0 <= stream < self.MAX_STREAMS:
                raise ValueError(f"stream id {stream} is outside 0..{self.MAX_STREAMS - 1}")
            cache = self.caches[stream] = self.model.new_cache(self.plan.last_layer - self.plan.first_layer,
                                                               self.batch_size, extra_slots=self.tree_slots)
        return cache

    def _rewind(self, pos: int, stream: int = 0) -> KVCache:
        cache = self.cache_for(stream)
        if pos > cache.length:
            raise ValueError(f"block starts at position {pos} but stage {self.plan.stage} has only "
                             f"{cache.length} cached for stream {stream}")
        cache.truncate(pos)
        return cache

    def set_tree(self, plan: np.ndarray, pos: int, stream: int = 0) -> None:
        """A TREE frame (tree speculation): keep the previous tree's accepted path, then treat the stream's next
        block (at slot pos) as a token tree. plan = int32 [a, a accepted slots, T parents, T tokens] for a block of
        T nodes; the accepted entries move to pos - a .. pos - 1 (right after the previous root, at pos - a - 1)."""
        a = int(plan[0]) if plan.ndim == 1 and plan.size else -1
        if not 0 <= a <= plan.size - 3 or (plan.size - 1 - a) % 2:
            raise ValueError(f"a tree plan is [a, a slots, T parents, T tokens], got {plan.size} values")
        t = (plan.size - 1 - a) // 2
        slots, parents, tokens = (plan[1:1 + a].tolist(), plan[1 + a:1 + a + t].tolist(), plan[1 + a + t:].tolist())
        if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError("a tree's first node is its root (parent -1) and every other node's parent comes before it")
        if a:
            self.cache_for(stream).compact(slots, pos - a)
        self.trees[stream] = parents
        self.last_tree[stream] = (parents, tokens)  # for a head on this stage (placement.head = "last")

    def _tree_mask(self, stream: int, pos: int, n_tok: int) -> tuple[torch.Tensor | None, list[int] | None]:
        """The attention mask and the positions (root + depth, where slots are not positions) of the stream's next
        block when it is a tree; (None, None) when it is a plain block."""
        parents = self.trees.pop(stream, None)
        if parents is None:
            return None, None
        if len(parents) != n_tok:
            raise ValueError(f"a tree of {len(parents)} nodes but a block of {n_tok} tokens")
        depths: list[int] = []
        for parent in parents:
            depths.append(depths[parent] + 1 if parent >= 0 else 0)
        return tree_mask(parents, pos), [pos + depth for depth in depths]

    def run(self, hidden: np.ndarray, pos: int, stream: int = 0) -> np.ndarray:
        """Middle/last stage: hidden [B, T, C] float32 at positions pos.. -> hidden [B, T, C]."""
        if self.plan.last_layer == self.plan.first_layer and not self.trees:  # layers = 0: it only forwards
            self._rewind_rows([pos], [stream], advance=hidden.shape[1])
            return hidden
        return self._run(hidden, pos, stream)

    @torch.inference_mode()
    def _run(self, hidden: np.ndarray, pos: int, stream: int) -> np.ndarray:
        cache = self._rewind(pos, stream)
        x = torch.from_numpy(hidden)  # [B, T, C]
        mask, positions = self._tree_mask(stream, pos, x.shape[1])
        x = self.model.run_layers(x, self.plan.first_layer, self.plan.last_layer, cache, mask, positions)
        return x.numpy()

    def _rewind_rows(self, positions: list[int], streams: list[int], advance: int = 0) -> list[KVCache]:
        """_rewind for each row of a batch (a tight loop: a 1,024-stream batch crosses every stage of the ring); with
        `advance`, each cache then holds that many positions more (a stage of no layers computes nothing to add)."""
        caches, get = [], self.caches.get
        for pos, stream in zip(positions, streams, strict=True):
            cache = get(stream) or self.cache_for(stream)
            if not 0 <= pos <= cache.length or pos + advance > cache.block_size:
                raise ValueError(f"a block of {advance or 'some'} at position {pos} does not fit stage "
                                 f"{self.plan.stage}: stream {stream} has {cache.length} cached of {cache.block_size}")
            cache.length = pos + advance  # KVCache.truncate, checked above (and the positions added)
            caches.append(cache)
        return caches

    def run_batch(self, hidden: np.ndarray, positions: list[int], streams: list[int]) -> np.ndarray:
        """Continuous batching: T new positions of each of several streams (hidden [B, T, C]) in one forward pass: one
        token of each (T = 1) attends as one batch; prompts (T > 1) run one stream at a time, as prompts do."""
        n_tok = hidden.shape[1]
        if self.plan.last_layer == self.plan.first_layer:  # layers = 0: it only forwards
            self._rewind_rows(positions, streams, advance=n_tok)
            return hidden
        if n_tok > 1:
            return np.concatenate([self.run(hidden[b:b + 1], pos, stream)
                                   for b, (pos, stream) in enumerate(zip(positions, streams, strict=True))])
        return self._run_batch(hidden, self._rewind_rows(positions, streams))

    @torch.inference_mode()
    def _run_batch(self, hidden: np.ndarray, caches: list[KVCache]) -> np.ndarray:
        x = self.model.run_layers_batched(torch.from_numpy(hidden), self.plan.first_layer, self.plan.last_layer, caches)
        return x.numpy()

    @torch.inference_mode()
    def embed_and_run(self, ids: list[int], pos: int, stream: int = 0, positions: list[int] | None = None) -> np.ndarray:
        """Entry stage, first half of a lap: token ids at slots pos.. -> hidden [1, T, C]. The positions are
        pos.., or `positions` (a tree's nodes: pos + depth), with the tree set by set_tree."""
        cache = self._rewind(pos, stream)
        if positions is None:
            x = self.model.embed(torch.tensor([ids], dtype=torch.long), pos)  # [1, T, C]
        else:
            x = self.model.embed_at(ids, positions).transpose(0, 1)  # [1, T, C]
        mask, tree_positions = self._tree_mask(stream, pos, len(ids))
        x = self.model.run_layers(x, self.plan.first_layer, self.plan.last_layer, cache, mask,
                                  positions if positions is not None else tree_positions)
        return x.numpy()

    @torch.inference_mode()
    def embed_and_run_batch(self, ids: list[int], positions: list[int], streams: list[int]) -> np.ndarray:
        """Entry stage, continuous batching: the next token of each of several streams in one pass -> [B, 1, C]."""
        caches = self._rewind_rows(positions, streams)
        x = self.model.embed_at(ids, positions)  # [B, 1, C]
        return self.model.run_layers_batched(x, self.plan.first_layer, self.plan.last_layer, caches).numpy()

    @torch.inference_mode()
    def logits(self, hidden: np.ndarray) -> torch.Tensor:
        """Entry stage, second half of a lap: final hidden [1, T, C] -> logits [T, V]."""
        return self.model.head(torch.from_numpy(hidden))[0]
