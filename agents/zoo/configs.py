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

    @property
    def kv_heads(self) -> int:  # heads of the KV cache (a checkpoint's grouped-query attention has fewer)
        return self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


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


class ByteVocabulary:
    """The byte models' tokenizer: one token per UTF-8 byte (a checkpoint's is agents.hf.checkpoint's)."""

    size = 256

    @staticmethod
    def encode(text: str) -> list[int]:
        return encode(text)

    @staticmethod
    def decode(ids: list[int]) -> str:
        return decode(ids)


BYTES = ByteVocabulary()


NULL_PREFIX = "null:"  # "null:NAME": NAME's shapes without its weights or arithmetic (agents.zoo.null)


def is_null(name: object) -> bool:
    return isinstance(name, str) and name.startswith(NULL_PREFIX)


def model_config(name: str):
    """The shape of model `name`: one of MODEL_CONFIGS, a local checkpoint "hf:PATH" (read, not loaded), or the
    null model of a byte model "null:NAME" (NAME's shape)."""
    from agents.hf.checkpoint import Checkpoint, is_hf

    if is_hf(name):
        return Checkpoint.open(name).shape
    if is_null(name):
        name = name[len(NULL_PREFIX):]
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}: expected one of {sorted(MODEL_CONFIGS)} or hf:PATH")
    return MODEL_CONFIGS[name]


def vocabulary(name: str):
    """How model `name` turns text into token ids and back (encode, decode)."""
    from agents.hf.checkpoint import Checkpoint, is_hf

    return Checkpoint.open(name).vocabulary() if is_hf(name) else BYTES  # a null model's tokens are bytes too
