"""What a trained model is like: draft acceptance against a target, sampled text, decode cost per token."""

from __future__ import annotations

import statistics
import time

import torch

from agents.zoo.checkpoint import _threads
from agents.zoo.corpus import KINDS
from agents.zoo.configs import decode, encode
from agents.zoo.model import GPT

DECODE_PREFILL = 128  # decode timing starts mid-context, as the ring does
DECODE_STEPS = 64
ALPHA_WINDOWS = 64  # held-out windows for the draft's acceptance rate
LEVIATHAN_ALPHA_RANGE = (0.62, 0.88)  # Leviathan et al. 2023, Table 3: alpha of their reference draft/target pairs


def bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)  # bytearray: frombuffer wants a writable buffer


def unigram_loss(data: bytes) -> float:
    """Entropy of the byte frequencies of data, in nats/byte: the loss of a model that ignores context."""
    counts = torch.bincount(bytes_tensor(data).long(), minlength=256).double()
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * probs.log()).sum())


@torch.no_grad()
def acceptance(target: GPT, draft: GPT, windows: torch.Tensor, temperature: float) -> float:
    """alpha-hat: mean over positions of sum_x min(p(x), q(x)), both at `temperature` (0: argmax agreement)."""
    total, count = 0.0, 0
    for chunk in windows.split(16):
        p_logits, q_logits = target(chunk[:, :-1]), draft(chunk[:, :-1])  # [n, T, V] each
        if temperature == 0:
            agree = p_logits.argmax(-1) == q_logits.argmax(-1)  # [n, T]
            total += agree.sum().item()
        else:
            p = torch.softmax(p_logits / temperature, dim=-1)  # [n, T, V]
            q = torch.softmax(q_logits / temperature, dim=-1)  # [n, T, V]
            total += torch.minimum(p, q).sum(-1).sum().item()
        count += p_logits.shape[0] * p_logits.shape[1]
    return total / count


@torch.inference_mode()
def generate(model: GPT, prompt: str, n_tokens: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
    """n_tokens bytes after prompt, with a KV cache; greedy at temperature 0."""
    cache = model.new_cache(model.config.n_layer)
    generator = torch.Generator().manual_seed(seed)
    idx = torch.tensor([encode(prompt)])  # [1, T]
    out: list[int] = []
    for _ in range(n_tokens):
        x = model.embed(idx, cache.length)  # [1, T, C]
        logits = model.head(model.run_layers(x, 0, model.config.n_layer, cache))[0, -1]  # [V]
        if temperature == 0:
            token = int(logits.argmax())
        else:
            token = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator))
        out.append(token)
        idx = torch.tensor([[token]])
    return out


@torch.inference_mode()
def decode_ms(model: GPT, threads: int = 1) -> float:
    """Median wall time of one full-model decode step (one token, KV cache, all layers, head) at `threads`."""
    with _threads(threads):
        cache = model.new_cache(model.config.n_layer)
        model.run_layers(model.embed(torch.zeros(1, DECODE_PREFILL, dtype=torch.long), 0), 0, model.config.n_layer, cache)
        token = torch.zeros(1, 1, dtype=torch.long)
        times = []
        for _ in range(DECODE_STEPS):
            started = time.perf_counter()
            model.head(model.run_layers(model.embed(token, cache.length), 0, model.config.n_layer, cache))
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


DEFAULT_PROMPT = "def add(a, b):\n    return "  # the geo ring's prompt


def report(meta: dict, models: dict[str, GPT]) -> str:
    """The table `python -m agents.zoo.train` prints: corpus mix, losses, acceptance, decode cost, samples."""
    lines = []
    corpus = meta["corpus"]
    mix = ", ".join(f"{kind} {s['train_bytes'] + s['val_bytes']:,} B" for kind, s in corpus["kinds"].items())
    lines.append(f"corpus {corpus['sha256'][:16]}: {mix} (10% of each held out)")
    lines.append(f"{'model':<12} {'params':>9} {'layers':>6} {'steps':>6} {'train s':>8} {'val nats/byte':>13} {'fp16':>7}  "
                 + "  ".join(f"{kind:>10}" for kind in KINDS) + f" {'decode ms':>10}")
    decode_cost = {name: decode_ms(model) for name, model in models.items()}
    for name, stats in meta["models"].items():
        kinds = "  ".join(f"{stats['val_loss_by_kind'][kind]:>10.3f}" for kind in KINDS)
        fp16 = f"{stats['val_loss_fp16']:>7.3f}" if "val_loss_fp16" in stats else f"{'':>7}"
        lines.append(f"{name:<12} {stats['params']:>9,} {stats['config']['n_layer']:>6} {stats['train']['steps']:>6} "
                     f"{stats['train_seconds']:>8.0f} {stats['val_loss']:>13.3f} {fp16}  {kinds} {decode_cost[name]:>10.2f}")
    if (prev := meta.get("previous_recipe")) is not None:
        kinds = "  ".join(f"{prev['val_loss_by_kind'][kind]:>10.3f}" for kind in KINDS)
        lines.append(f"{'previous':<12} {prev['params']:>9,} {prev['config']['n_layer']:>6} {prev['train']['steps']:>6} "
                     f"{prev['train_seconds']:>8.0f} {prev['val_loss']:>13.3f} {'':>7}  {kinds}   (the {prev['model']} as shipped before)")
    lines.append(f"{'unigram':<12} {'':>9} {'':>6} {'':>6} {'':>8} {meta['unigram_val_loss']:>13.3f}")
    lines.append(f"decode ms: one token through all layers with a KV cache, 1 thread, on this machine; "
                 f"target/draft {decode_cost['target'] / decode_cost['draft']:.1f}x")
    if (alpha := meta.get("alpha_hat")) is not None:
        low, high = LEVIATHAN_ALPHA_RANGE
        for target, by_t in alpha.items():
            cells = ", ".join(f"T={float(t):g}: {value:.3f}" for t, value in by_t.items() if float(t) > 0)
            lines.append(f"alpha-hat draft vs {target} ({ALPHA_WINDOWS} held-out windows): {cells}; "
                         f"greedy argmax agreement {by_t['0.0']:.3f}  (Leviathan et al. reference pairs: {low}-{high})")
    if "retrain_seconds" in meta:
        lines.append(f"training: {meta['train_seconds'] / 60:.1f} min "
                     f"({meta['retrain_seconds'] / 60:.1f} min for the whole --retrain, evaluation included)")
    for temperature in (0.0, 0.7):
        text = decode(generate(models["target"], DEFAULT_PROMPT, 120, temperature))
        lines.append(f"target, T={temperature:g}, from {DEFAULT_PROMPT!r}:\n{DEFAULT_PROMPT}{text}")
    return "\n".join(lines)

