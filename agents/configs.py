"""The models' shapes and their byte vocabulary: what the launcher, the summaries and the CLI need of the models,
without importing torch (a real-time run's launcher never computes; its agents, forked from the fork server, do).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # one token per UTF-8 byte
    block_size: int = 256  # max positions (learned position embedding)
    n_layer: int = 6
    n_head: int = 4
    n_embd: int = 128
    bias: bool = False  # biases in Linear and LayerNorm; without them the model is a little smaller and as good

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name}: expected a positive int, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd: expected a multiple of n_head={self.n_head}, got {self.n_embd}")



TARGET_CONFIG = GPTConfig(vocab_size=256, block_size=256, n_layer=6, n_head=4, n_embd=128)
# Two layers: a decode step costs what the embedding, head and per-op overheads cost, so width 96 is as cheap as 64.
DRAFT_CONFIG = GPTConfig(vocab_size=256, block_size=256, n_layer=2, n_head=4, n_embd=96)
# For rings of up to 16 stages, one layer each; narrow, so that 16 layers cost about what the target costs.
TARGET_DEEP_CONFIG = GPTConfig(vocab_size=256, block_size=256, n_layer=16, n_head=4, n_embd=64)
MODEL_CONFIGS = {"target": TARGET_CONFIG, "draft": DRAFT_CONFIG, "target-deep": TARGET_DEEP_CONFIG}


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    # A byte-level model can stop mid-character; replace rather than fail on a partial sequence.
    return bytes(ids).decode("utf-8", errors="replace")
