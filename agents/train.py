"""Deterministic offline training of the target and draft models, cached on disk and shared between processes."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import pathlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from torch.nn import functional as F

from agents.corpus import Corpus, build_corpus
from agents.model import GPT, GPTConfig

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when model.py computes something different, or the checkpoint or metadata layout changes
TARGET_CONFIG = GPTConfig(vocab_size=256, block_size=256, n_layer=6, n_head=4, n_embd=128)
DRAFT_CONFIG = GPTConfig(vocab_size=256, block_size=256, n_layer=2, n_head=4, n_embd=64)
MODEL_CONFIGS = {"target": TARGET_CONFIG, "draft": DRAFT_CONFIG}
DEFAULT_CACHE_DIR = pathlib.Path(__file__).resolve().parents[1] / ".cache" / "models"
CACHE_DIR_ENV = "GEO_RING_CACHE"
CORPUS_MAX_BYTES = 4 * 1024 * 1024
TRAIN_THREADS = 2
META_FILE = "meta.json"
LOCK_FILE = "train.lock"


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 8  # at this budget more, smaller steps beat fewer big ones
    seq_len: int = 256  # the full block, so every position embedding the decoders will use gets trained
    lr_max: float = 3e-3
    lr_min: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta2: float = 0.99  # nanoGPT's choice for small models and short runs
    grad_clip: float = 1.0
    seed: int = 1337
    eval_windows: int = 128  # fixed, evenly spaced windows of the validation split


# Step counts fixed (not a time budget, so the weights are reproducible), sized to ~2 minutes on 2 cores.
# The draft gets the very same recipe: it is worse only for being smaller.
TRAIN_CONFIGS = {"target": TrainConfig(steps=600), "draft": TrainConfig(steps=600)}


def resolve_cache_dir(cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    if cache_dir is not None:
        return pathlib.Path(cache_dir)
    env = os.environ.get(CACHE_DIR_ENV)
    return pathlib.Path(env) if env else DEFAULT_CACHE_DIR


def cache_key(corpus: Corpus) -> str:
    """Hash of everything the weights depend on; a mismatch means the cached weights are stale."""
    recipe = {
        "format_version": FORMAT_VERSION,
        "corpus": corpus.description(),
        "models": {name: {"model": asdict(MODEL_CONFIGS[name]), "train": asdict(TRAIN_CONFIGS[name])} for name in MODEL_CONFIGS},
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)  # bytearray: frombuffer wants a writable buffer


def unigram_loss(data: bytes) -> float:
    """Entropy of the byte frequencies of data, in nats/byte: the loss of a model that ignores context."""
    counts = torch.bincount(bytes_tensor(data).long(), minlength=256).double()
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * probs.log()).sum())


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr_max * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr_min + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr_max - cfg.lr_min)


@torch.no_grad()
def evaluate(model: GPT, data: torch.Tensor, seq_len: int, n_windows: int) -> float:
    """Mean next-byte loss in nats over n_windows windows evenly spaced across data."""
    model.eval()
    starts = torch.linspace(0, len(data) - seq_len - 1, n_windows).long()  # [N]
    windows = data[starts[:, None] + torch.arange(seq_len + 1)].long()  # [N, seq_len+1]
    total = 0.0
    for chunk in windows.split(32):
        logits = model(chunk[:, :-1])  # [n, seq_len, V]
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
    return total / windows[:, 1:].numel()


def train_model(name: str, corpus: Corpus) -> tuple[GPT, dict]:
    config, cfg = MODEL_CONFIGS[name], TRAIN_CONFIGS[name]
    train_data, val_data = bytes_tensor(corpus.train), bytes_tensor(corpus.val)
    torch.manual_seed(cfg.seed)
    model = GPT(config)
    # Weight decay only on matrices; norms and biases (vectors) are left alone, as in nanoGPT.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr_max, betas=(0.9, cfg.beta2))
    batches = torch.Generator().manual_seed(cfg.seed)  # own generator: the data order does not depend on init
    offsets = torch.arange(cfg.seq_len + 1)  # [T+1]
    started = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        starts = torch.randint(0, len(train_data) - cfg.seq_len - 1, (cfg.batch_size,), generator=batches)  # [B]
        batch = train_data[starts[:, None] + offsets].long()  # [B, T+1]
        logits = model(batch[:, :-1])  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            log.info("%s step %d/%d loss %.3f", name, step, cfg.steps, loss.item())
    train_seconds = time.perf_counter() - started
    val_loss = evaluate(model, val_data, cfg.seq_len, cfg.eval_windows)
    stats = {
        "val_loss": val_loss,
        "params": model.num_params(),
        "final_train_loss": loss.item(),
        "train_seconds": train_seconds,
        "config": asdict(config),
        "train": asdict(cfg),
    }
    log.info("%s trained in %.1f s, val loss %.3f nats/byte", name, train_seconds, val_loss)
    return model, stats


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    with open(path, "a+") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes, also if the process dies
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _atomic_write(path: pathlib.Path, write) -> None:
    """Write through a temp file in the same directory and rename it, so readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private; the cache is meant to be shared
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _weights_path(cache_dir: pathlib.Path, name: str, key: str) -> pathlib.Path:
    # The key in the name makes a weights file immutable: a retrain never replaces a file someone is loading.
    return cache_dir / f"{name}-{key[:16]}.pt"


def _read_meta(cache_dir: pathlib.Path, key: str) -> dict | None:
    try:
        meta = json.loads((cache_dir / META_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if meta.get("key") != key or not all(_weights_path(cache_dir, name, key).is_file() for name in MODEL_CONFIGS):
        return None
    return meta


def _train_all(corpus: Corpus, key: str, cache_dir: pathlib.Path) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)  # same thread count every time: reductions then add up the same way
    started = time.perf_counter()
    try:
        meta: dict = {"key": key, "format_version": FORMAT_VERSION, "corpus": corpus.description()}
        for name in MODEL_CONFIGS:
            model, meta[name] = train_model(name, corpus)
            _atomic_write(_weights_path(cache_dir, name, key), lambda f, m=model: torch.save(m.state_dict(), f))
    finally:
        torch.set_num_threads(threads)
    meta["unigram_val_loss"] = unigram_loss(corpus.val)
    meta["corpus_bytes"] = len(corpus.train) + len(corpus.val)
    meta["train_seconds"] = time.perf_counter() - started
    _atomic_write(cache_dir / META_FILE, lambda f: f.write(json.dumps(meta, indent=2, sort_keys=True).encode()))
    current = {_weights_path(cache_dir, name, key) for name in MODEL_CONFIGS}
    for stale in cache_dir.glob("*.pt"):
        if stale not in current:
            stale.unlink(missing_ok=True)
    return meta


def ensure_trained(cache_dir: pathlib.Path | None = None, *, force: bool = False) -> dict:
    """Train both models unless weights for the current recipe are cached; return the training metadata."""
    cache_dir = resolve_cache_dir(cache_dir)
    corpus = build_corpus(CORPUS_MAX_BYTES)
    key = cache_key(corpus)
    if not force and (meta := _read_meta(cache_dir, key)) is not None:
        return meta
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / LOCK_FILE):
        # Whoever held the lock before us may just have trained the very same recipe.
        if not force and (meta := _read_meta(cache_dir, key)) is not None:
            return meta
        log.info("training target and draft into %s", cache_dir)
        return _train_all(corpus, key, cache_dir)


def load_model(name: str, cache_dir: pathlib.Path | None = None) -> GPT:
    """The trained model `name` ("target" or "draft") in eval mode, training both first if needed."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"load_model: unknown model {name!r}, expected one of {sorted(MODEL_CONFIGS)}")
    cache_dir = resolve_cache_dir(cache_dir)
    meta = ensure_trained(cache_dir)
    model = GPT(MODEL_CONFIGS[name])
    state = torch.load(_weights_path(cache_dir, name, meta["key"]), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    model.requires_grad_(False)  # inference only: no autograd bookkeeping even outside inference_mode
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agents.train", description=__doc__)
    parser.add_argument("--cache-dir", type=pathlib.Path, default=None, help=f"default: ${CACHE_DIR_ENV} or {DEFAULT_CACHE_DIR}")
    parser.add_argument("--force", action="store_true", help="retrain even if cached weights match")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    meta = ensure_trained(args.cache_dir, force=args.force)
    print(f"corpus: {meta['corpus_bytes']} bytes, trained in {meta['train_seconds']:.1f} s (both models)")
    print(f"{'model':<8} {'params':>9} {'val loss (nats/byte)':>21}")
    for name in MODEL_CONFIGS:
        print(f"{name:<8} {meta[name]['params']:>9} {meta[name]['val_loss']:>21.3f}")
    print(f"{'unigram':<8} {'':>9} {meta['unigram_val_loss']:>21.3f}")


if __name__ == "__main__":
    main()
