"""Build a local checkpoint with transformers' own classes: random weights, a tokenizer trained on shipped text.

    python -m agents.hf.build OUT [--family llama] [--layers 8] [--hidden 768] [--intermediate 3072] [--vocab 16384]

What the tests split and compare against transformers, and what a user tries the ring with before pointing it at
a real checkpoint: nothing is downloaded. The tokenizer is a byte-level BPE (as GPT-2's and Llama-3's are) trained
on the project's own model source, so a prompt of Python code tokenizes into real merges; rows of the embedding
past the tokenizer's size are never produced by it (a real checkpoint pads its vocabulary the same way).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers here reads and writes local directories only: no hub

FAMILY_CONFIGS = ("gpt2", "llama", "qwen2", "mistral")
TOKENIZER_TEXT = pathlib.Path(__file__).resolve().parents[1] / "zoo" / "model.py"  # shipped: the same merges everywhere
MAX_TOKENIZER_VOCAB = 2048  # merges the shipped text supports before they are single-use


def train_tokenizer(vocab_size: int):
    """A byte-level BPE of at most vocab_size tokens (fewer: the text runs out of merges), on the shipped text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, MAX_TOKENIZER_VOCAB), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|end|>"])
    tokenizer.train_from_iterator([TOKENIZER_TEXT.read_text()], trainer)
    return tokenizer


def family_config(family: str, *, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                  vocab: int, context: int):
    """transformers' config of `family` at this shape (the family's own defaults for everything else)."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    if family == "gpt2":
        return GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=context, vocab_size=vocab,
                          n_inner=intermediate, bos_token_id=0, eos_token_id=0)
    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
    if family not in classes:
        raise ValueError(f"family {family!r}: expected one of {', '.join(FAMILY_CONFIGS)}")
    return classes[family](num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
                           max_position_embeddings=context, tie_word_embeddings=False, bos_token_id=0,
                           eos_token_id=0)


def build_checkpoint(out: pathlib.Path, family: str = "llama", *, layers: int = 4, hidden: int = 64, heads: int = 4,
                     kv_heads: int | None = None, intermediate: int | None = None, vocab: int = 512,
                     context: int = 512, seed: int = 0, dtype: str = "float32", init_std: float = 0.02,
                     **config_overrides) -> pathlib.Path:
    """Write a checkpoint directory (config.json, model.safetensors, tokenizer.json) to `out`; returns it.
    `config_overrides` set further fields of the family's config (e.g. Llama's attention_bias=True)."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    config = family_config(family, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads or heads,
                           intermediate=intermediate or 4 * hidden, vocab=vocab, context=context)
    config.initializer_range = init_std
    for key, value in config_overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    tokenizer = train_tokenizer(vocab)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>").save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.hf.build", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--family", choices=FAMILY_CONFIGS, default="llama")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_checkpoint(args.out, args.family, layers=args.layers, hidden=args.hidden, heads=args.heads,
                            kv_heads=args.kv_heads, intermediate=args.intermediate, vocab=args.vocab,
                            context=args.context, seed=args.seed, dtype=args.dtype)
    from agents.hf.checkpoint import Checkpoint

    checkpoint = Checkpoint.open(path)
    print(f"{path}: {checkpoint.model_type}, {checkpoint.shape.n_layer} layers, hidden {checkpoint.shape.n_embd}, "
          f"vocab {checkpoint.shape.vocab_size} (tokenizer {checkpoint.vocabulary().size}); use model = \"hf:{path}\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
