"""A forward pass's emulated cost from hardware: the roofline of one stage's share of a model (issue 28)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.records import JsonRecord


@dataclass(frozen=True)
class Roofline(JsonRecord):
    """One stage's share of a model on its devices, as the roofline sees it.

    A forward pass over a block of T positions of each of b streams, each stream attending to `context` positions:

        seconds = max(W(T b) / BW, F_tok x T x b / FLOPS) + b x context x KV / BW

    W: the stage's weight bytes a token reads, read once a pass (decode is memory-bound while T x b is below the
    ridge FLOPS W / (F_tok BW)); a mixture of experts' token reads its active experts only, so a pass of n tokens
    reads W(n) = min(W_total, n W) (as if each token chose experts no other token did: an upper bound); F_tok:
    FLOPs a token costs on the stage (2 x its active parameters, plus the head's on the entry); KV: the bytes of K and V one position of context holds on the stage's layers, read once per stream
    (attention's FLOPs and the activations' traffic are left out: below 1% of a decode step at the contexts the
    testbed runs). BW and FLOPS are effective: the datasheet's figures times the preset's efficiency times the
    stage's devices (tensor parallelism inside the stage, its own all-reduces assumed free at NVLink speed).
    """

    weight_bytes: float
    flops_per_token: float
    kv_bytes_per_position: float
    memory_bw_bytes_s: float
    flop_s: float
    total_weight_bytes: float = 0.0  # a mixture of experts' every expert on the stage; 0: dense (= weight_bytes)

    def seconds(self, n_tok: int = 1, batch: int = 1, context: float = 0) -> float:
        read = self.weight_bytes
        if self.total_weight_bytes > self.weight_bytes:
            read = min(self.total_weight_bytes, self.weight_bytes * n_tok * batch)
        weights_s = read / self.memory_bw_bytes_s
        math_s = self.flops_per_token * n_tok * batch / self.flop_s
        return max(weights_s, math_s) + batch * context * self.kv_bytes_per_position / self.memory_bw_bytes_s

    def scaled(self, factor: float) -> "Roofline":
        """The same stage on hardware `factor` times slower: every pass takes `factor` times as long (a scenario's
        `scale`, time dilation)."""
        return Roofline(self.weight_bytes, self.flops_per_token, self.kv_bytes_per_position,
                        self.memory_bw_bytes_s / factor, self.flop_s / factor, self.total_weight_bytes)

    @property
    def ridge_tokens(self) -> float:
        """Tokens a pass (T x b) takes before it is compute-bound rather than memory-bound."""
        return self.weight_bytes * self.flop_s / (self.flops_per_token * self.memory_bw_bytes_s)
