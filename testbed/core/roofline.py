"""A forward pass's emulated cost: the roofline of one stage's share of a model on its hardware, or a measured
profile of it (issue 28)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from testbed.core.records import JsonRecord


@dataclass(frozen=True)
class MeasuredProfile(JsonRecord):
    """A stage's forward pass as measured: ms at each (T positions, b streams) of a grid, between and beyond its points
    piecewise linear in T and in b (bilinear inside, the end segments extended outside; one point on an axis: flat
    along it). The context a pass attends to is the one it was measured at: no KV term is added."""

    source: str  # where the numbers come from (a file, a system, a date)
    tokens: tuple[float, ...]  # T, ascending
    batch: tuple[float, ...]  # b, ascending
    ms: tuple[tuple[float, ...], ...]  # a row per T, a column per b

    def seconds(self, n_tok: int = 1, batch: int = 1) -> float:
        rows = [_along(self.batch, row, batch) for row in self.ms]
        return max(0.0, _along(self.tokens, rows, n_tok)) / 1e3

    def scaled(self, factor: float) -> "MeasuredProfile":
        return replace(self, ms=tuple(tuple(v * factor for v in row) for row in self.ms))


def _along(xs: tuple[float, ...], ys: list[float] | tuple[float, ...], x: float) -> float:
    """ys at x, piecewise linear over ascending xs, the first and last segments extended."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)  # the segment [xs[i-1], xs[i]] that holds or is nearest x
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


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

    weight_bytes: float = 0.0
    flops_per_token: float = 0.0
    kv_bytes_per_position: float = 0.0
    memory_bw_bytes_s: float = 0.0
    flop_s: float = 0.0
    total_weight_bytes: float = 0.0  # a mixture of experts' every expert on the stage; 0: dense (= weight_bytes)
    profile: MeasuredProfile | None = None  # measured ([[stages]] profile): replaces the arithmetic above

    def seconds(self, n_tok: int = 1, batch: int = 1, context: float = 0) -> float:
        if self.profile is not None:
            return self.profile.seconds(n_tok, batch)
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
                        self.memory_bw_bytes_s / factor, self.flop_s / factor, self.total_weight_bytes,
                        self.profile.scaled(factor) if self.profile is not None else None)

    @property
    def ridge_tokens(self) -> float:
        """Tokens a pass (T x b) takes before it is compute-bound rather than memory-bound."""
        return self.weight_bytes * self.flop_s / (self.flops_per_token * self.memory_bw_bytes_s)
