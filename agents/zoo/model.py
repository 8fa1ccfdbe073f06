"""A small byte-level GPT whose layers can be run in stages, each stage with its own explicit KV cache."""

from __future__ import annotations

import heapq
import math
import weakref

import torch
import torch.nn as nn
from torch.nn import functional as F

from agents.zoo.configs import BYTES, GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(
        self,
        x: torch.Tensor,
        k_cache: torch.Tensor | None = None,
        v_cache: torch.Tensor | None = None,
        start: int = 0,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x [B, T, C]
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        if k_cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, nh, T, hd]
        else:
            # Write into the preallocated slice so a decode step costs no reallocation of the past.
            k_cache[:, :, start : start + T] = k
            v_cache[:, :, start : start + T] = v
            k = k_cache[:, :, : start + T]  # [B, nh, start+T, hd]
            v = v_cache[:, :, : start + T]  # [B, nh, start+T, hd]
            # is_causal aligns its mask top-left (query 0 sees key 0 only), wrong once a past exists, so a
            # block appended after a past gets an explicit mask (from run_layers); one new token sees all keys.
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # [B, T, C]
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # as GPT-2; exact erf GELU costs ~12% of a one-token decode step
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))  # [B, T, C] -> [B, T, 4C] -> [B, T, C]


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        k_cache: torch.Tensor | None = None,
        v_cache: torch.Tensor | None = None,
        start: int = 0,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), k_cache, v_cache, start, mask)
        x = x + self.mlp(self.ln_2(x))
        return x


_EMPTY: dict = {}  # (shape, dtype) -> the empty tensor the caches of a stage of no layers share


class KVCache:
    """Keys/values for a contiguous range of layers, for batch B, preallocated to block_size positions."""

    def __init__(
        self,
        config: GPTConfig,
        n_layers: int,
        batch_size: int = 1,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        extra_slots: int = 0,
    ) -> None:
        # n_layers = 0: a stage that only forwards (layers = 0) keeps nothing but the positions it has seen
        if n_layers < 0 or batch_size < 1 or extra_slots < 0:
            raise ValueError(f"KVCache: expected n_layers >= 0, batch_size >= 1, extra_slots >= 0, got {n_layers}, "
                             f"{batch_size}, {extra_slots}")
        self.n_layers = n_layers
        self.batch_size = batch_size
        # slots, not positions: a speculation tree holds its n nodes in n slots at a few positions (tree depth)
        self.block_size = config.block_size + extra_slots
        shape = (n_layers, batch_size, config.kv_heads, self.block_size, config.head_dim)
        if n_layers == 0 and device is None:  # holds nothing: one empty tensor per shape does for every cache
            if (shape, dtype) not in _EMPTY:
                _EMPTY[shape, dtype] = torch.zeros(shape, dtype=dtype)
            self.k = self.v = _EMPTY[shape, dtype]
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, kv_heads, block_size, hd]
            self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, nh, block_size, hd]
        self.length = 0  # positions [0, length) hold valid keys/values in every layer
        self.arena: CacheArena | None = None  # where k and v lie once batched (run_layers_batched), and its slot
        self.slot = -1

    def truncate(self, length: int) -> None:
        """Forget positions >= length, e.g. the rejected tail of a speculative block."""
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.truncate: expected 0 <= length <= {self.length}, got {length}")
        # Stale values past `length` stay in memory; they are overwritten before they are ever read again.
        self.length = length

    def reset(self) -> None:
        self.length = 0

    def compact(self, slots: list[int], dst: int) -> None:
        """Keep a tree's accepted path: the entries at `slots` (ascending, all >= dst) move to dst, dst + 1, ..."""
        if any(s < dst or s >= self.length for s in slots) or sorted(set(slots)) != list(slots):
            raise ValueError(f"KVCache.compact: slots {slots} must ascend within {dst}..{self.length - 1}")
        if slots:
            src = torch.tensor(slots)
            self.k[:, :, :, dst:dst + len(slots)] = self.k[:, :, :, src]  # advanced indexing copies first
            self.v[:, :, :, dst:dst + len(slots)] = self.v[:, :, :, src]
        self.length = max(self.length, dst + len(slots))


ARENA_SLOTS = 64  # caches an arena holds side by side, at most
MIN_ARENA_SLOTS = 8  # and at least


class CacheArena:
    """The keys and values of MIN_ARENA_SLOTS to ARENA_SLOTS single-sequence caches of one shape side by side, [L,
    slots, kv_heads, block_size, hd], so that a continuous batch attends over its rows' pasts where they lie (no
    per-row copy a step).

    A cache moves in at its first batched step: its past is copied once, then its k and v are views of its slot
    (run_layers writes there too), until the cache is collected and the slot is free again. A cache joins an arena
    of the caches it is batched with (a stage's own streams; one stage's caches are never batched with another's)."""

    def __init__(self, like: KVCache, slots: int) -> None:
        n_layers, _, heads, block, hd = like.k.shape
        with torch.inference_mode(False):  # a plain tensor, as a cache's own: written in and out of inference mode
            self.k = torch.zeros(n_layers, slots, heads, block, hd, dtype=like.k.dtype)  # [L, S, kv_heads, block, hd]
            self.v = torch.zeros_like(self.k)  # zeros, then only values computed: a masked key's value is finite
        self.free = list(range(slots))  # a heap: the lowest free slot first
        self.shape = like.k.shape

    def fits(self, cache: KVCache) -> bool:
        return bool(self.free) and cache.k.shape == self.shape and cache.k.dtype == self.k.dtype

    def take(self, cache: KVCache) -> None:
        slot, n = heapq.heappop(self.free), cache.length
        self.k[:, slot:slot + 1, :, :n] = cache.k[:, :, :, :n]
        self.v[:, slot:slot + 1, :, :n] = cache.v[:, :, :, :n]
        cache.k, cache.v = self.k[:, slot:slot + 1], self.v[:, slot:slot + 1]  # [L, 1, kv_heads, block, hd] views
        cache.arena, cache.slot = self, slot
        weakref.finalize(cache, heapq.heappush, self.free, slot)

    @staticmethod
    def groups(caches: list[KVCache]) -> list[ArenaRows]:
        """The rows of a batch by the arena their caches lie in; a cache in none moves into one first."""
        by_arena: dict[int, tuple[CacheArena, list[int]]] = {}
        homeless = []
        for b, cache in enumerate(caches):
            if cache.arena is None:
                homeless.append(b)
            else:
                by_arena.setdefault(id(cache.arena), (cache.arena, []))[1].append(b)
        for b in homeless:
            arena = next((a for a, _ in by_arena.values() if a.fits(caches[b])), None)
            if arena is None:  # a first one sized to the batch (a few caches take a few slots), then whole ones
                slots = ARENA_SLOTS if by_arena else min(ARENA_SLOTS, 1 << (len(caches) - 1).bit_length())
                arena = CacheArena(caches[b], max(MIN_ARENA_SLOTS, slots))
                by_arena[id(arena)] = (arena, [])
            arena.take(caches[b])
            by_arena[id(arena)][1].append(b)
        return [ArenaRows(arena, rows, [caches[b].slot for b in rows], [caches[b].length for b in rows])
                for arena, rows in by_arena.values()]


class ArenaRows:
    """The rows of a continuous batch whose caches lie in one arena: where their new keys go and what they attend.

    Where the rows fill at least half the slots they span, the attention runs over that span of the arena in place
    (a slot not in the batch attends to its position 0, and is dropped); else over a copy of the rows' pasts. Either
    way every row reads the same number of positions, its own past and new token unmasked and the rest masked."""

    def __init__(self, arena: CacheArena, rows: list[int], slots: list[int], lengths: list[int]) -> None:
        self.arena = arena
        self.rows, self.slots = torch.tensor(rows), torch.tensor(slots)
        self.lengths = torch.tensor(lengths)  # each row's new token goes to this position
        self.keys = max(lengths) + 1  # positions read
        lo, hi = min(slots), max(slots) + 1
        self.span = (lo, hi) if 2 * len(rows) >= hi - lo else None
        if self.span is None:
            sees = self.lengths
        else:
            self.at = self.slots - lo  # each row's place in the span
            sees = torch.zeros(hi - lo, dtype=torch.long).index_put_((self.at,), self.lengths)
        self.mask = (torch.arange(self.keys) <= sees[:, None])[:, None, None, :]  # [n, 1, 1, keys], True = may see

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Layer i: write the rows' new keys and values (k, v [B, nh, 1, hd]), attend -> [rows, nh, 1, hd]."""
        keys, values = self.arena.k[i], self.arena.v[i]  # [S, kv_heads, block, hd]
        keys[self.slots, :, self.lengths] = k[self.rows, :, 0]  # [rows, nh, hd]
        values[self.slots, :, self.lengths] = v[self.rows, :, 0]
        if self.span is None:
            keys = keys[:, :, :self.keys].index_select(0, self.slots)  # [rows, nh, keys, hd]
            values = values[:, :, :self.keys].index_select(0, self.slots)
            return F.scaled_dot_product_attention(q[self.rows], keys, values, attn_mask=self.mask)
        lo, hi = self.span
        queries = q.new_zeros(hi - lo, *q.shape[1:]).index_put_((self.at,), q[self.rows])  # [span, nh, 1, hd]
        y = F.scaled_dot_product_attention(queries, keys[lo:hi, :, :self.keys], values[lo:hi, :, :self.keys],
                                           attn_mask=self.mask)
        return y[self.at]


class GPT(nn.Module):
    vocabulary = BYTES  # one token per UTF-8 byte (a checkpoint's HFModel has its tokenizer here)

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                # Residual projections scaled down so the residual stream does not grow with depth (GPT-2).
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied wte/lm_head counted once

    def new_cache(self, n_layers: int, batch_size: int = 1, extra_slots: int = 0) -> KVCache:
        """An empty KV cache for n_layers of this model (what a stage or a drafter keeps; agents.hf.model too)."""
        return KVCache(self.config, n_layers, batch_size, extra_slots=extra_slots)

    def embed(self, idx: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Token + position embedding of idx [B, T] placed at positions start_pos..start_pos+T-1 -> [B, T, C]."""
        T = idx.size(1)
        if start_pos < 0 or start_pos + T > self.config.block_size:
            raise ValueError(
                f"GPT.embed: positions {start_pos}..{start_pos + T - 1} are outside 0..{self.config.block_size - 1}"
            )
        tok_emb = self.transformer.wte(idx)  # [B, T, C]
        pos_emb = self.transformer.wpe.weight[start_pos : start_pos + T]  # [T, C], a view: no arange per step
        return tok_emb + pos_emb  # [B, T, C]

    def run_layers(self, x: torch.Tensor, first: int, last: int, cache: KVCache | None = None,
                   mask: torch.Tensor | None = None, positions: list[int] | None = None) -> torch.Tensor:
        """Run blocks[first:last] on x [B, T, C] -> [B, T, C]; with a cache, x is appended after its past.

        `mask` ([T, past + T] bool, True = may attend) replaces the causal one: a speculation tree's nodes see
        the past and their own ancestors only (tree_mask). `positions` (a tree's nodes: root + depth) are not
        needed here: learned positions are added at embed (a rotary checkpoint, agents.hf.model, rotates by them)."""
        if not 0 <= first <= last <= self.config.n_layer:
            raise ValueError(f"GPT.run_layers: expected 0 <= first <= last <= {self.config.n_layer}, got {first}, {last}")
        blocks = self.transformer.h[first:last]
        if cache is None:
            for block in blocks:
                x = block(x)
            return x
        B, T, _ = x.size()
        if cache.n_layers != last - first:
            raise ValueError(f"GPT.run_layers: cache holds {cache.n_layers} layers, layers {first}:{last} need {last - first}")
        if cache.batch_size != B:
            raise ValueError(f"GPT.run_layers: cache is for batch {cache.batch_size}, got batch {B}")
        start = cache.length
        if start + T > cache.block_size:
            raise ValueError(f"GPT.run_layers: {start} cached + {T} new positions exceed block_size {cache.block_size}")
        if mask is not None and tuple(mask.shape) != (T, start + T):
            raise ValueError(f"GPT.run_layers: mask {tuple(mask.shape)} does not fit {T} new after {start} cached")
        if mask is None and T > 1 and start > 0:
            # New token t sits at position start+t and may see keys 0..start+t.
            mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)  # [T, start+T]
        for i, block in enumerate(blocks):
            x = block(x, cache.k[i], cache.v[i], start, mask)
        cache.length = start + T  # only once every layer holds the new positions
        return x

    def embed_at(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token per sequence, each at its own position (a continuous batch) -> [B, 1, C]."""
        if any(p < 0 or p >= self.config.block_size for p in positions):
            raise ValueError(f"GPT.embed_at: positions {positions} are outside 0..{self.config.block_size - 1}")
        idx = torch.tensor(ids, dtype=torch.long)  # [B]
        return (self.transformer.wte(idx) + self.transformer.wpe.weight[positions]).unsqueeze(1)  # [B, 1, C]

    def run_layers_batched(self, x: torch.Tensor, first: int, last: int, caches: list[KVCache]) -> torch.Tensor:
        """Continuous batching: x [B, 1, C] holds one new token of B different sequences, sequence b with its
        own cache (and so its own position and past). Every matmul runs once on the stacked batch; the attention
        runs once per arena (CacheArena: the caches' pasts side by side), each row masked to its own past.
        """
        check_batch("GPT", x, first, last, caches, self.config.n_layer)
        B, T, C = x.size()
        groups = CacheArena.groups(caches) if last > first else []
        for i, block in enumerate(self.transformer.h[first:last]):
            attn = block.attn
            q, k, v = attn.c_attn(block.ln_1(x)).split(attn.n_embd, dim=2)  # 3 x [B, 1, C]
            q = q.view(B, 1, attn.n_head, attn.head_dim).transpose(1, 2)  # [B, nh, 1, hd]
            k = k.view(B, 1, attn.n_head, attn.head_dim).transpose(1, 2)
            v = v.view(B, 1, attn.n_head, attn.head_dim).transpose(1, 2)
            y = torch.empty_like(q)  # [B, nh, 1, hd]
            for group in groups:
                y[group.rows] = group.attend(i, q, k, v)
            y = y.transpose(1, 2).contiguous().view(B, 1, C)  # [B, 1, C]
            x = x + attn.c_proj(y)
            x = x + block.mlp(block.ln_2(x))
        for cache in caches:
            cache.length += 1
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.transformer.ln_f(x))  # [B, T, C] -> [B, T, V]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx, 0)  # [B, T, C]
        x = self.run_layers(x, 0, self.config.n_layer)  # [B, T, C]
        return self.head(x)  # [B, T, V]


def check_batch(who: str, x: torch.Tensor, first: int, last: int, caches: list[KVCache], n_layer: int) -> None:
    """run_layers_batched's input (GPT's, and a checkpoint's agents.hf.model): [B, 1, C] rows, each with its own
    single-sequence cache of layers first..last-1 and room for one more token."""
    if not 0 <= first <= last <= n_layer:
        raise ValueError(f"{who}.run_layers_batched: expected 0 <= first <= last <= {n_layer}, got {first}, {last}")
    B, T, _ = x.size()
    if T != 1 or len(caches) != B:
        raise ValueError(f"{who}.run_layers_batched: expected [B, 1, C] with one cache per row, got {tuple(x.shape)} "
                         f"and {len(caches)} caches")
    for cache in caches:
        if cache.n_layers != last - first or cache.batch_size != 1 or cache.length + 1 > cache.block_size:
            raise ValueError(f"{who}.run_layers_batched: a cache of {cache.n_layers} layers, batch {cache.batch_size}, "
                             f"{cache.length} cached does not fit layers {first}:{last} plus one token")


def tree_mask(parents: list[int], past: int) -> torch.Tensor:
    """[T, past + T] attention mask of a token tree appended after `past` cached entries: node i (parents[i] < i,
    the root's -1) sees the whole past, itself and its ancestors."""
    t = len(parents)
    tree = torch.eye(t, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            tree[i] |= tree[parent]
    return torch.cat([torch.ones(t, past, dtype=torch.bool), tree], dim=1)

