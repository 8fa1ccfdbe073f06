"""Tensor parallelism over shaped links (seed 000, "Why pipeline-, not tensor-, parallel over slow links").

parallel = "tp": every agent (rank) holds a Megatron-style slice of every layer of the target: its share of the
attention heads (their q, k and v rows of c_attn, the matching columns of c_proj, their KV cache) and of the MLP's
hidden units (rows of c_fc, columns of c_proj). A layer is two segments, attention and MLP; each ends in a partial
sum of the residual update, which an all-reduce over the testbed's own links adds up (tp.allreduce):

    ring        reduce-scatter then all-gather around the ring: 2 (N - 1) serial steps, each moving 1/N of the tensor
    all-to-all  every rank sends its whole partial to every other rank: one step, over a link between every pair

Every message is a REDUCE frame with its sender's stamp. Both algorithms leave the same bits on every rank (each
sum is added in one fixed order, and f32 crosses the wire exactly), so every rank samples the same token from the
same logits with the same seeded generator, and no token travels. Rank 0 reports the laps: one per token.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from agents.process import wire
from agents.zoo.model import GPT
from agents.modes.plain.runner import PlainMode
from agents.modes.tp.facts import TpToken
from agents.process.ring import RingClient
from testbed.core.decode import DecodeConfig
from testbed.core.errors import WireError
from testbed.core.records import LapRecord, Stamp


def shard_ranges(n_items: int, n: int, rank: int) -> tuple[int, int]:
    """[first, last) of rank's share of n_items split as evenly as can be (the first ranks take one more)."""
    base, extra = divmod(n_items, n)
    first = rank * base + min(rank, extra)
    return first, first + base + (1 if rank < extra else 0)


class TPShard:
    """One rank's slice of every layer, and the KV cache of its heads."""

    def __init__(self, model: GPT, rank: int, n: int) -> None:
        cfg = model.config
        if not 1 <= n <= cfg.n_head:
            raise ValueError(f"tensor parallelism over {n} ranks: the model has {cfg.n_head} heads, one rank needs one")
        self.model = model
        c, hd = cfg.n_embd, cfg.n_embd // cfg.n_head
        h0, h1 = shard_ranges(cfg.n_head, n, rank)
        m0, m1 = shard_ranges(4 * c, n, rank)
        self.heads, self.head_dim, self.width = h1 - h0, hd, (h1 - h0) * hd
        a, b = h0 * hd, h1 * hd
        rows = torch.cat([torch.arange(a, b) + i * c for i in range(3)])  # this rank's q, k and v rows
        self.layers = []
        for block in model.transformer.h:
            attn, mlp = block.attn, block.mlp
            self.layers.append(dict(
                ln_1=block.ln_1, ln_2=block.ln_2,
                qkv=attn.c_attn.weight[rows].contiguous(),  # [3 w, C]
                qkv_bias=None if attn.c_attn.bias is None else attn.c_attn.bias[rows],
                proj=attn.c_proj.weight[:, a:b].contiguous(),  # [C, w]: a partial sum of the full projection
                proj_bias=attn.c_proj.bias,  # added once, after the all-reduce
                fc=mlp.c_fc.weight[m0:m1].contiguous(), fc_bias=None if mlp.c_fc.bias is None else mlp.c_fc.bias[m0:m1],
                out=mlp.c_proj.weight[:, m0:m1].contiguous(), out_bias=mlp.c_proj.bias))
        shape = (cfg.n_layer, 1, self.heads, cfg.block_size, hd)
        self.k = torch.zeros(shape)  # [L, 1, heads, block_size, hd]
        self.v = torch.zeros(shape)
        self.length = 0

    def rewind(self, pos: int) -> None:
        if not 0 <= pos <= self.length:
            raise ValueError(f"block starts at position {pos} but the rank has {self.length} cached")
        self.length = pos

    def attention(self, i: int, x: torch.Tensor, pos: int) -> torch.Tensor:
        """This rank's heads of layer i on x [1, T, C] at positions pos.. -> its partial of the attention output."""
        layer = self.layers[i]
        _, t, _ = x.shape
        q, k, v = F.linear(layer["ln_1"](x), layer["qkv"], layer["qkv_bias"]).split(self.width, dim=2)
        q, k, v = (z.view(1, t, self.heads, self.head_dim).transpose(1, 2) for z in (q, k, v))  # [1, h, T, hd]
        self.k[i][:, :, pos:pos + t] = k
        self.v[i][:, :, pos:pos + t] = v
        mask = None
        if t > 1 and pos > 0:
            mask = torch.ones(t, pos + t, dtype=torch.bool).tril(diagonal=pos)  # as GPT.run_layers
        y = F.scaled_dot_product_attention(q, self.k[i][:, :, :pos + t], self.v[i][:, :, :pos + t], attn_mask=mask,
                                           is_causal=mask is None and t > 1)
        return F.linear(y.transpose(1, 2).reshape(1, t, self.width), layer["proj"])  # [1, T, C]

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        layer = self.layers[i]
        hidden = F.gelu(F.linear(layer["ln_2"](x), layer["fc"], layer["fc_bias"]), approximate="tanh")
        return F.linear(hidden, layer["out"])  # [1, T, C]

    def bias(self, segment: int) -> torch.Tensor | None:
        layer = self.layers[segment // 2]
        return layer["proj_bias"] if segment % 2 == 0 else layer["out_bias"]


class AllReduce:
    """Sum of every rank's partial over the ring client's links (tp.allreduce: "ring" or "all-to-all")."""

    def __init__(self, ring: RingClient, algorithm: str) -> None:
        self.ring, self.algorithm = ring, algorithm
        self.n, self.rank = ring.n_stages, ring.index
        self.seq = 0  # collectives so far: a frame's lap
        self.early: dict[tuple[int, int], np.ndarray] = {}  # all-to-all: (seq, sender) partials of the next collective
        self.sent_bytes = 0
        self.messages = 0

    async def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        seq, self.seq = self.seq, self.seq + 1
        flat = np.ascontiguousarray(partial.reshape(-1).numpy(), dtype=np.float32)
        total = await (self._ring(flat, seq) if self.algorithm == "ring" else self._all_to_all(flat, seq))
        return torch.from_numpy(total.reshape(tuple(partial.shape)))

    async def _send(self, dst: int, seq: int, step: int, chunk: int, tensor: np.ndarray) -> None:
        now = self.ring.clock.now()
        frame = self.ring.stamped(wire.Frame(wire.Kind.REDUCE, stream=chunk, lap=seq, pos=step), now, now, now, now,
                                  tensor)
        self.sent_bytes += await self.ring.send(frame, dst)
        self.messages += 1

    async def _receive(self) -> wire.Frame:
        frame, _ = await self.ring.receive()
        if frame.kind != wire.Kind.REDUCE or frame.tensor is None or frame.tensor.dtype != np.float32:
            raise WireError(f"rank {self.rank} expected an all-reduce message, got a {frame.kind.name} frame")
        return frame

    async def _ring(self, flat: np.ndarray, seq: int) -> np.ndarray:
        n, r = self.n, self.rank
        chunks = [c.copy() for c in np.array_split(flat, n)]
        nxt = (r + 1) % n
        for step in range(2 * (n - 1)):
            gather = step >= n - 1  # the second half: all-gather of the reduced chunks
            s = step - (n - 1) if gather else step
            send, receive = ((r + 1 - s) % n, (r - s) % n) if gather else ((r - s) % n, (r - s - 1) % n)
            await self._send(nxt, seq, step, send, chunks[send])
            frame = await self._receive()  # one sender (the previous rank), in order on its link
            if (frame.lap, frame.pos, frame.stream) != (seq, step, receive) or frame.tensor.shape != chunks[receive].shape:
                raise WireError(f"rank {r} expected collective {seq} step {step} chunk {receive}, got collective "
                                f"{frame.lap} step {frame.pos} chunk {frame.stream} of shape {frame.tensor.shape}")
            # reduce-scatter: the running sum so far plus this rank's own part (one order for everyone)
            chunks[receive] = frame.tensor if gather else frame.tensor + chunks[receive]
        return np.concatenate(chunks)

    async def _all_to_all(self, flat: np.ndarray, seq: int) -> np.ndarray:
        n, r = self.n, self.rank
        for dst in range(n):
            if dst != r:
                await self._send(dst, seq, 0, r, flat)  # stream = the sender's rank
        parts = {r: flat}
        parts.update({src: self.early.pop((seq, src)) for src in range(n) if (seq, src) in self.early})
        while len(parts) < n:
            frame = await self._receive()
            src = frame.stream
            if not (0 <= src < n and src != r and frame.tensor.shape == flat.shape and seq <= frame.lap <= seq + 1):
                raise WireError(f"rank {r} in collective {seq} got a message from rank {src} of collective "
                                f"{frame.lap}, shape {frame.tensor.shape}")
            if frame.lap == seq:
                parts[src] = frame.tensor
            else:  # a faster rank's partial of the next collective: it finished this one already
                self.early[(frame.lap, src)] = frame.tensor
        total = parts[0].copy()
        for src in range(1, n):  # rank order on every rank: the same bits everywhere
            total += parts[src]
        return total


class TPMode(PlainMode):
    """Plain decode where a token's forward pass is 2 L segments, each ending in an all-reduce (every rank runs it)."""

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        super().__init__(config, ring)
        self.model = ring.stage.model
        self.shard = TPShard(self.model, ring.index, ring.n_stages)
        self.allreduce = AllReduce(ring, ring.tp.allreduce)
        self.lap_no = 0

    def report(self, record: LapRecord) -> None:
        if self.ring.index == 0:
            self.ring.report(record)

    async def prefill(self, prompt: list[int]) -> tuple[int, LapRecord]:
        return await self.traverse(prompt, 0, "prefill")

    async def traverse(self, block: list[int], pos: int, kind: str) -> tuple[int, LapRecord]:
        """One token's (or the prompt's) forward pass on this rank. Each segment's compute is padded to this
        rank's compute per lap (StageConfig.cost_ms) over the 2 L segments; the head is unpadded."""
        ring, clock, shard = self.ring, self.ring.clock, self.shard
        lap_no, self.lap_no = self.lap_no, self.lap_no + 1
        segments = 2 * self.model.config.n_layer
        budget = ring.cost_s(len(block)) / segments
        sent, messages = self.allreduce.sent_bytes, self.allreduce.messages
        start = clock.now()
        compute = real = 0.0
        with torch.inference_mode():
            shard.rewind(pos)
            x = self.model.embed(torch.tensor([block], dtype=torch.long), pos)  # every rank: [1, T, C]
        for segment in range(segments):
            t0 = clock.now()
            with torch.inference_mode():
                i = segment // 2
                partial = shard.attention(i, x, pos) if segment % 2 == 0 else shard.mlp(i, x)
            t1 = clock.now()
            await clock.sleep_until(t0 + max(budget, ring.dilation * (t1 - t0)))
            compute += clock.now() - t0
            real += t1 - t0
            total = await self.allreduce(partial)
            bias = shard.bias(segment)
            x = x + total if bias is None else x + total + bias
        shard.length = pos + len(block)
        t0 = clock.now()
        with torch.inference_mode():
            token = self.sample(self.model.head(x)[0])
        end = clock.now()
        head = end - t0
        stamp = Stamp(ring.index, start, start, start + real + head, start + compute + head, start + compute + head,
                      self.allreduce.sent_bytes - sent)
        facts = TpToken(compute / segments, head, end - start - compute - head, segments,
                        self.allreduce.messages - messages, ring.n_stages)
        return token, LapRecord(lap_no, kind, ring.mode, len(block), 0, start, end, (stamp,), end, facts=facts)


Runner = TPMode  # what an agent of this mode runs (ModeInfo.runner_path)
