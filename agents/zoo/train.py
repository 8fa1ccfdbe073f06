"""Deterministic offline training of the target, deep target and draft models, shipped in agents/zoo/weights/."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import pathlib
import time
from dataclasses import asdict, dataclass

import torch
from torch.nn import functional as F

from agents.zoo.checkpoint import _load_state, _locked, _save_fp16, _save_state, _sha256, _threads, _write_json
from agents.zoo.corpus import Corpus, build_corpus, corpus_recipe, warn_if_differs
from agents.hf.quality import checkpoint_report
from agents.zoo.measure import ALPHA_WINDOWS, acceptance, bytes_tensor, report, unigram_loss
from agents.zoo.configs import DRAFT_CONFIG, MODEL_CONFIGS, GPTConfig
from agents.zoo.model import GPT

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # bump when model.py computes something different, or the checkpoint or metadata layout changes
DEFAULT_CACHE_DIR = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "models"
CACHE_DIR_ENV = "GEO_RING_CACHE"
WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent / "weights"  # shipped with the package
SHIPPED_META_FILE = "weights.json"
META_FILE = "meta.json"
LOCK_FILE = "train.lock"
EVAL_WINDOWS_PER_KIND = 128  # fixed, evenly spaced windows of each kind's validation split
QUICK_EVAL_WINDOWS_PER_KIND = 4  # the test's re-check of the shipped weights' loss, in well under a second
ALPHA_TEMPERATURES = (0.7, 1.0)
FP16_TOLERANCE_NATS = 0.01  # the shipped fp16 weights may lose at most this much against the float32 ones


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 16
    seq_len: int = 256  # the full block, so every position embedding the decoders will use gets trained
    lr_max: float = 3e-3
    lr_min: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.99  # nanoGPT's choice for small models and short runs
    grad_clip: float = 1.0
    seed: int = 1337
    # Same thread count every time: reductions then add up the same way. Small models train as fast on one
    # thread, and a 2-thread OpenMP team of tiny ops stalls badly on a busy machine.
    threads: int = 2


# Step counts are fixed (not a time budget), so the weights are reproducible; sized so that the target reaches
# <= 1.5 nats/byte (1.19) and all of --retrain takes ~75 minutes on a 2-core VM (see README).
TRAIN_CONFIGS = {
    "target": TrainConfig(steps=3600),
    "draft": TrainConfig(steps=1400, threads=1),  # the target's step count: worse only for being smaller
    "target-deep": TrainConfig(steps=2400, lr_max=2e-3),  # 16 layers: a gentler peak rate
}
# What shipped before this recipe (600 short steps of the same target); retrained by --retrain for comparison.
PREVIOUS_RECIPE = ("target", TrainConfig(steps=600, batch_size=8, lr_max=3e-3, lr_min=3e-4, warmup_steps=20, threads=1))


def resolve_cache_dir(cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    if cache_dir is not None:
        return pathlib.Path(cache_dir)
    env = os.environ.get(CACHE_DIR_ENV)
    return pathlib.Path(env) if env else DEFAULT_CACHE_DIR


def recipe(names: tuple[str, ...] | None = None) -> dict:
    """Everything the weights (of `names`, default all) depend on, known without reading the corpus."""
    names = tuple(MODEL_CONFIGS) if names is None else names
    return {
        "format_version": FORMAT_VERSION,
        "corpus": corpus_recipe(),
        "models": {name: {"model": asdict(MODEL_CONFIGS[name]), "train": asdict(TRAIN_CONFIGS[name])} for name in names},
    }


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay from lr_max to lr_min at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr_max * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr_min + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr_max - cfg.lr_min)


def eval_windows(data: bytes, n_windows: int, seq_len: int) -> torch.Tensor:
    """n_windows windows of seq_len+1 bytes evenly spaced across data -> [N, seq_len+1]."""
    tensor = bytes_tensor(data)
    starts = torch.linspace(0, len(tensor) - seq_len - 1, n_windows).long()  # [N]
    return tensor[starts[:, None] + torch.arange(seq_len + 1)].long()  # [N, seq_len+1]


@torch.no_grad()
def window_loss(model: GPT, windows: torch.Tensor) -> float:
    """Mean next-byte loss in nats over windows [N, T+1]."""
    model.eval()
    total = 0.0
    for chunk in windows.split(32):
        logits = model(chunk[:, :-1])  # [n, T, V]
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
    return total / windows[:, 1:].numel()


def evaluate(model: GPT, corpus: Corpus, windows_per_kind: int = EVAL_WINDOWS_PER_KIND) -> dict:
    """Held-out loss of each kind, and overall: their mean weighted by each kind's share of validation bytes."""
    seq_len = model.config.block_size
    by_kind = {kind: window_loss(model, eval_windows(val, windows_per_kind, seq_len)) for kind, val in corpus.val_by_kind}
    sizes = dict((kind, len(val)) for kind, val in corpus.val_by_kind)
    overall = sum(by_kind[kind] * sizes[kind] for kind in by_kind) / sum(sizes.values())
    return {"val_loss": overall, "val_loss_by_kind": by_kind}


@torch.inference_mode(False)  # load_model may be the first call, from a caller in inference mode
@torch.enable_grad()
def train_model(name: str, corpus: Corpus, config: GPTConfig | None = None, cfg: TrainConfig | None = None) -> tuple[GPT, dict]:
    """Train model `name` by its recipe (or the one given); same thread count and seeds give the same weights."""
    config = MODEL_CONFIGS[name] if config is None else config
    cfg = TRAIN_CONFIGS[name] if cfg is None else cfg
    train_data = bytes_tensor(corpus.train)
    torch.manual_seed(cfg.seed)
    model = GPT(config)
    # Weight decay only on matrices; norms and biases (vectors) are left alone, as in nanoGPT.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
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
        if step % 100 == 0 or step == cfg.steps - 1:
            log.info("%s step %d/%d loss %.3f (%.0f s)", name, step, cfg.steps, loss.item(), time.perf_counter() - started)
    train_seconds = time.perf_counter() - started
    model.requires_grad_(False)
    stats = {
        **evaluate(model, corpus),
        "params": model.num_params(),
        "final_train_loss": loss.item(),
        "train_seconds": train_seconds,
        "tokens_per_second": cfg.steps * cfg.batch_size * cfg.seq_len / train_seconds,
        "config": asdict(config),
        "train": asdict(cfg),
    }
    log.info("%s trained in %.1f s, val loss %.3f nats/byte", name, train_seconds, stats["val_loss"])
    return model.eval(), stats


# ---- shipped weights (agents/zoo/weights/) ----


def read_shipped(weights_dir: pathlib.Path | None = None) -> dict | None:
    """The shipped metadata if it is for the current recipe and every weights file has its recorded sha256."""
    weights_dir = WEIGHTS_DIR if weights_dir is None else weights_dir
    try:
        meta = json.loads((weights_dir / SHIPPED_META_FILE).read_text())
    except FileNotFoundError:
        log.info("no shipped weights in %s", weights_dir)
        return None
    if meta.get("key") != recipe_hash():
        log.info("shipped weights are for recipe %.16s, the current recipe is %.16s: not used", meta.get("key"), recipe_hash())
        return None
    for name in MODEL_CONFIGS:
        entry = meta.get("models", {}).get(name)
        path = weights_dir / entry["file"] if entry else None
        if path is None or not path.is_file() or _sha256(path) != entry["sha256"]:
            log.warning("shipped weights for %s are missing or do not match their sha256 in %s: not used", name, weights_dir)
            return None
    return meta


# ---- the cache (used only when the recipe has changed since the weights were shipped) ----


def _weights_path(cache_dir: pathlib.Path, name: str, key: str) -> pathlib.Path:
    # The key in the name makes a weights file immutable: a retrain never replaces a file someone is loading.
    return cache_dir / f"{name}-{key[:16]}.safetensors"


def _read_meta(cache_dir: pathlib.Path, key: str) -> dict | None:
    try:
        meta = json.loads((cache_dir / META_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if meta.get("key") != key or not all(_weights_path(cache_dir, name, key).is_file() for name in MODEL_CONFIGS):
        return None
    return meta


def _train_into_cache(corpus: Corpus, key: str, cache_dir: pathlib.Path) -> dict:
    started = time.perf_counter()
    meta: dict = {"key": key, "source": "cache", "corpus": corpus.description(), "models": {}}
    for name in MODEL_CONFIGS:
        with _threads(TRAIN_CONFIGS[name].threads):
            model, meta["models"][name] = train_model(name, corpus)
        _save_state(model, _weights_path(cache_dir, name, key))
    meta["unigram_val_loss"] = unigram_loss(corpus.val)
    meta["train_seconds"] = time.perf_counter() - started
    _write_json(cache_dir / META_FILE, meta)
    keep = {_weights_path(cache_dir, name, key) for name in MODEL_CONFIGS} | set(cache_dir.glob("*.fp32.*"))  # --retrain's
    for stale in {*cache_dir.glob("*.pt"), *cache_dir.glob("*.safetensors")} - keep:  # .pt: from before safetensors
        stale.unlink(missing_ok=True)
    return meta


def needs_training(cache_dir: pathlib.Path | None = None) -> bool:
    """Whether the next load_model trains first (the recipe changed since the shipped weights, and no cache)."""
    return read_shipped() is None and _read_meta(resolve_cache_dir(cache_dir), recipe_hash()) is None


def trained_meta(cache_dir: pathlib.Path | None = None) -> dict | None:
    """Metadata of the weights load_model will use, if they exist: the shipped ones, else the cache's; None: they
    must be trained first (ensure_trained)."""
    if (shipped := read_shipped()) is not None:
        return shipped
    return _read_meta(resolve_cache_dir(cache_dir), recipe_hash())


def ensure_trained(cache_dir: pathlib.Path | None = None) -> dict:
    """Metadata of the weights load_model will use: the shipped ones, else the cache's, training them if needed."""
    if (meta := trained_meta(cache_dir)) is not None:
        return meta
    cache_dir = resolve_cache_dir(cache_dir)
    key = recipe_hash()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / LOCK_FILE):
        # Whoever held the lock before us may just have trained the very same recipe.
        if (meta := _read_meta(cache_dir, key)) is not None:
            return meta
        log.info("training %s into %s (the shipped weights do not match the current recipe)", ", ".join(MODEL_CONFIGS), cache_dir)
        return _train_into_cache(build_corpus(), key, cache_dir)


def load_model(name: str, cache_dir: pathlib.Path | None = None) -> GPT:
    """The trained model `name` (one of MODEL_CONFIGS) in eval mode, float32; shipped, else cached/trained."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"load_model: unknown model {name!r}, expected one of {sorted(MODEL_CONFIGS)}")
    meta = ensure_trained(cache_dir)
    if meta.get("source") == "shipped":
        path = WEIGHTS_DIR / meta["models"][name]["file"]
    else:
        path = _weights_path(resolve_cache_dir(cache_dir), name, meta["key"])
    return _load_state(GPT(MODEL_CONFIGS[name]), path)


# ---- measurements printed beside the losses ----


# ---- --retrain: train everything, measure, write agents/zoo/weights/ ----


def _trained(name: str, corpus: Corpus, cache_dir: pathlib.Path, resume: bool) -> tuple[GPT, dict]:
    """Train `name` (or "previous") and keep its float32 weights and stats in the cache; resume reuses them."""
    config, cfg = (MODEL_CONFIGS[PREVIOUS_RECIPE[0]], PREVIOUS_RECIPE[1]) if name == "previous" else (MODEL_CONFIGS[name], TRAIN_CONFIGS[name])
    # Keyed by this model's own recipe, so --resume keeps a model whose recipe did not change.
    model_recipe = {**recipe(()), "models": {name: {"model": asdict(config), "train": asdict(cfg)}}}
    model_key = hashlib.sha256(json.dumps(model_recipe, sort_keys=True).encode()).hexdigest()
    fp32_path = cache_dir / f"{name}-{model_key[:16]}.fp32.safetensors"
    stats_path = fp32_path.with_suffix(".json")
    if resume and fp32_path.is_file() and stats_path.is_file():
        log.info("%s: reusing %s", name, fp32_path)
        return _load_state(GPT(config), fp32_path), json.loads(stats_path.read_text())
    with _threads(cfg.threads):
        model, stats = train_model(name, corpus, config, cfg)
    _save_state(model, fp32_path)
    _write_json(stats_path, stats)
    return model, stats


def retrain(cache_dir: pathlib.Path | None = None, *, resume: bool = False, only: tuple[str, ...] = (),
            weights_dir: pathlib.Path | None = None) -> dict | None:
    """Train every model from scratch, measure it, and write the shipped fp16 weights and their metadata.

    The float32 weights of each finished model also go to the cache; with resume, a model already there for
    this recipe (an interrupted --retrain, or one run with `only`) is not trained again. With `only`, just
    those models are trained into the cache (to spread a retrain over processes) and nothing is written.
    """
    cache_dir = resolve_cache_dir(cache_dir)
    weights_dir = WEIGHTS_DIR if weights_dir is None else weights_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    weights_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    corpus = build_corpus()
    if only:
        for name in only:
            _trained(name, corpus, cache_dir, resume)
        return None
    meta: dict = {"key": recipe_hash(), "source": "shipped", "recipe": recipe(), "corpus": corpus.description(), "models": {}}
    models: dict[str, GPT] = {}
    for name in MODEL_CONFIGS:
        model, stats = _trained(name, corpus, cache_dir, resume)
        path = weights_dir / f"{name}.safetensors"
        _save_fp16(model, path)
        models[name] = shipped = _load_state(GPT(MODEL_CONFIGS[name]), path)  # everything below measures what ships
        fp16 = evaluate(shipped, corpus)
        if abs(fp16["val_loss"] - stats["val_loss"]) > FP16_TOLERANCE_NATS:
            raise RuntimeError(f"{name}: fp16 weights lose {fp16['val_loss'] - stats['val_loss']:.4f} nats/byte, over {FP16_TOLERANCE_NATS}")
        meta["models"][name] = {
            **stats,
            "file": path.name,
            "sha256": _sha256(path),
            "val_loss_fp16": fp16["val_loss"],
            "quick_val_loss_fp16": evaluate(shipped, corpus, QUICK_EVAL_WINDOWS_PER_KIND)["val_loss"],
        }
    _, previous = _trained("previous", corpus, cache_dir, resume)
    meta["previous_recipe"] = {"model": PREVIOUS_RECIPE[0], **previous}
    meta["unigram_val_loss"] = unigram_loss(corpus.val)
    alpha_windows = eval_windows(corpus.val, ALPHA_WINDOWS, DRAFT_CONFIG.block_size)
    meta["alpha_hat"] = {
        target: {str(t): acceptance(models[target], models["draft"], alpha_windows, t) for t in (0.0, *ALPHA_TEMPERATURES)}
        for target in ("target", "target-deep")
    }
    meta["train_seconds"] = sum(m["train_seconds"] for m in meta["models"].values()) + previous["train_seconds"]
    meta["retrain_seconds"] = time.perf_counter() - started
    _write_json(weights_dir / SHIPPED_META_FILE, meta)
    return meta


def check(weights_dir: pathlib.Path = WEIGHTS_DIR) -> list[str]:
    """Problems with the shipped weights (empty if none): recipe hash, sha256, loading, the recorded loss."""
    try:
        meta = json.loads((weights_dir / SHIPPED_META_FILE).read_text())
    except FileNotFoundError:
        return [f"{weights_dir / SHIPPED_META_FILE}: missing"]
    problems = []
    if meta.get("key") != recipe_hash():
        problems.append(f"{SHIPPED_META_FILE}: recipe hash {meta.get('key', '')[:16]}, the current recipe is {recipe_hash()[:16]}")
    corpus = build_corpus()
    warn_if_differs(meta["corpus"]["sha256"], corpus)
    for name, config in MODEL_CONFIGS.items():
        entry = meta["models"].get(name)
        if entry is None:
            problems.append(f"{SHIPPED_META_FILE}: no entry for model {name}")
            continue
        path = weights_dir / entry["file"]
        if not path.is_file() or _sha256(path) != entry["sha256"]:
            problems.append(f"{path}: missing or not the sha256 recorded in {SHIPPED_META_FILE}")
            continue
        model = _load_state(GPT(config), path)
        if corpus.sha256 == meta["corpus"]["sha256"]:
            loss = evaluate(model, corpus, QUICK_EVAL_WINDOWS_PER_KIND)["val_loss"]
            if abs(loss - entry["quick_val_loss_fp16"]) > 1e-3:
                problems.append(f"{path}: quick val loss {loss:.4f}, recorded {entry['quick_val_loss_fp16']:.4f}")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agents.zoo.train", description=__doc__)
    parser.add_argument("--cache-dir", type=pathlib.Path, default=None, help=f"default: ${CACHE_DIR_ENV} or {DEFAULT_CACHE_DIR}")
    parser.add_argument("--retrain", action="store_true", help=f"train every model from scratch and rewrite {WEIGHTS_DIR}")
    parser.add_argument("--resume", action="store_true", help="with --retrain: reuse models an interrupted --retrain finished")
    parser.add_argument("--only", nargs="+", choices=[*MODEL_CONFIGS, "previous"], default=(),
                        help="with --retrain: train just these into the cache (then --retrain --resume gathers them)")
    parser.add_argument("--check", action="store_true", help="verify the shipped weights: recipe hash, sha256, loading, loss")
    parser.add_argument("--model", nargs=2, metavar=("hf:TARGET", "hf:DRAFT"), help="a checkpoint pair's alpha-hat instead")
    args = parser.parse_args(argv)
    if args.model:
        raise SystemExit(checkpoint_report(*args.model))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.check:
        problems = check()
        for problem in problems:
            print(f"check: {problem}")
        print("check: shipped weights OK" if not problems else f"check: {len(problems)} problem(s)")
        raise SystemExit(1 if problems else 0)
    if args.retrain and args.only:
        retrain(args.cache_dir, resume=args.resume, only=tuple(args.only))
        print(f"trained {', '.join(args.only)} into {resolve_cache_dir(args.cache_dir)}")
        return
    if args.retrain:
        meta = retrain(args.cache_dir, resume=args.resume)
        print(f"retrained in {meta['retrain_seconds'] / 60:.1f} min; wrote {WEIGHTS_DIR}")
    else:
        meta = ensure_trained(args.cache_dir)
    print(report(meta, {name: load_model(name) for name in MODEL_CONFIGS}))


if __name__ == "__main__":
    main()
