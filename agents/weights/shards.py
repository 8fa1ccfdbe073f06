"""A Hugging Face checkpoint cut by stage: what an origin serves so that each node fetches only its share.

`shard_by_stage(src, out, layer_ranges)` writes one safetensors file per stage holding exactly the tensors that
stage loads (Checkpoint.stage_tensors: its layers, and on the entry the embeddings, the final norm and the LM head),
a `model.safetensors.index.json` naming the file of every tensor (the sharded checkpoint layout transformers itself
writes), and copies of the checkpoint's other small files. Node i fetches `stage<i>.safetensors` and the shared
files; the files of all nodes together are a checkpoint again, which loads as the original does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from agents.hf.checkpoint import Checkpoint
from agents.weights.stages import stage_file
from agents.weights.verified import RECORD

INDEX = "model.safetensors.index.json"


def shard_by_stage(src: Path, out: Path, layer_ranges: list[tuple[int, int]],
                   extras: list[bool] | None = None) -> list[list[str]]:
    """Write `out` (see the module doc); returns, per stage, the names of the files its node needs. `extras`: the
    stages that also load the embeddings, the final norm and the head (default: the entry only); a tensor two stages
    hold is in each one's file, and the index names the last."""
    checkpoint = Checkpoint.open(src)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    sizes: dict[str, int] = {}  # a tensor two stages hold counts once
    extras = extras or [stage == 0 for stage in range(len(layer_ranges))]
    for stage, ((first, last), entry) in enumerate(zip(layer_ranges, extras)):
        wanted = checkpoint.stage_tensors(first, last, entry)
        tensors = {}
        for name, (path, key) in sorted(wanted.items()):
            with safe_open(str(path), framework="pt") as f:
                tensors[name] = f.get_tensor(key)
        save_file(tensors, str(out / stage_file(stage)), metadata={"format": "pt"})
        weight_map.update({name: stage_file(stage) for name in tensors})
        sizes.update({name: t.numel() * t.element_size() for name, t in tensors.items()})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=1))
    shared = [INDEX]
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != INDEX:
            shutil.copyfile(path, out / path.name)
            shared.append(path.name)
    return [[stage_file(stage), *shared] for stage in range(len(layer_ranges))]


def assemble(nodes: list[Path], out: Path) -> Path:
    """The files the nodes fetched, as one checkpoint directory (hard links where the filesystem allows): what a
    ring on one box loads, each agent reading its own stage's file. The nodes' records of what they verified are
    not copied: the caller records what the directory holds (agents.weights.verified.record)."""
    out.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        for path in node.iterdir():
            if path.is_file() and not path.name.endswith((".partial", ".progress")) and path.name != RECORD \
                    and not (out / path.name).exists():
                try:
                    (out / path.name).hardlink_to(path)
                except OSError:
                    shutil.copyfile(path, out / path.name)
    return out
