"""A model's tensors by pipeline stage: which a stage loads, the cut an origin serves (one file a stage), and a stage's
model from the shard its node fetched and verified.

A stage loads its layers' tensors; a stage with `extras` (the entry, a separate head, a last stage that samples:
what agents.process.agent asks shared_model for) also the embeddings, the final norm and the LM head. For a byte
model (agents.zoo) those are the `transformer.h.N.` tensors and BYTE_MODEL_EXTRAS; for a Hugging Face checkpoint,
Checkpoint.stage_tensors.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from agents.weights.verified import UnverifiedWeights

BYTE_MODEL_EXTRAS = ("transformer.wte.", "transformer.wpe.", "transformer.ln_f.", "lm_head.")


def stage_file(stage: int) -> str:
    return f"stage{stage}.safetensors"


def byte_prefixes(first: int, last: int, extras: bool) -> tuple[str, ...]:
    """The names a byte model's stage of layers first..last-1 loads start with."""
    return (*(f"transformer.h.{n}." for n in range(first, last)), *(BYTE_MODEL_EXTRAS if extras else ()))


def byte_model_file(name: str) -> Path:
    """The shipped weights of byte model `name` (or of NAME in "null:NAME")."""
    from agents import zoo
    from agents.zoo.configs import NULL_PREFIX

    return Path(zoo.__file__).parent / "weights" / f"{name.removeprefix(NULL_PREFIX)}.safetensors"


@functools.cache
def safetensors_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's tensors (name -> dtype, shape, data_offsets) and where their data begins."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def tensor_span(path: Path, name: str) -> tuple[int, int]:
    """Tensor `name`'s (first byte, bytes) in the file."""
    header, base = safetensors_header(path)
    start, end = header[name]["data_offsets"]
    return base + start, end - start


def stage_spans(model: str, ranges: list[tuple[int, int]], extras: list[bool]) -> list[list[tuple[Path, str, int]]]:
    """Per stage, the (file, tensor, bytes) it loads of `model`: a Hugging Face checkpoint's stage_tensors, or the
    shipped byte model's layers (and with `extras` its embeddings, final norm and head)."""
    from agents.hf.checkpoint import Checkpoint, is_hf

    if is_hf(model):
        checkpoint = Checkpoint.open(model)
        wanted = [checkpoint.stage_tensors(first, last, entry) for (first, last), entry in zip(ranges, extras)]
        return [[(path, key, tensor_span(path, key)[1]) for path, key in w.values()] for w in wanted]
    path = byte_model_file(model)
    names = sorted(safetensors_header(path)[0])
    return [[(path, name, tensor_span(path, name)[1]) for name in names if name.startswith(byte_prefixes(*r, extra))]
            for r, extra in zip(ranges, extras)]


def cut_byte_model(model: str, ranges: list[tuple[int, int]], extras: list[bool], out: Path) -> list[list[str]]:
    """Byte model `model` cut by stage into `out`, its tensors copied raw into one safetensors file a stage (a
    Hugging Face checkpoint's cut: agents.weights.shards); per stage, the files its node needs."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for stage, spans in enumerate(stage_spans(model, ranges, extras)):
        header, blobs, offset = {}, [], 0
        for path, name, n_bytes in spans:
            header[name] = dict(safetensors_header(path)[0][name], data_offsets=[offset, offset + n_bytes])
            with path.open("rb") as f:
                f.seek(tensor_span(path, name)[0])
                blobs.append(f.read(n_bytes))
            offset += n_bytes
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
        (out / stage_file(stage)).write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))
        files.append([stage_file(stage)])
    return files


def load_byte_stage(name: str, shard: Path, first: int, last: int, extras: bool):
    """Byte model `name`'s GPT with a stage's tensors from `shard` (a verified file): exactly the tensors that
    stage uses, each of its shape, or UnverifiedWeights says which are missing or extra. The layers it does not run
    keep their initial values (it never computes with them)."""
    import torch
    from safetensors.torch import load_file

    from agents.zoo.configs import model_config
    from agents.zoo.model import GPT

    model = GPT(model_config(name))
    state = load_file(str(shard), device="cpu")
    expected = {key for key in model.state_dict() if key.startswith(byte_prefixes(first, last, extras))}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise UnverifiedWeights(f"{shard}: not the tensors of {name}'s layers {first}..{last - 1}"
                                f"{' and its entry' if extras else ''}: missing {missing[:3]}, extra {extra[:3]}")
    try:
        model.load_state_dict({key: value.to(torch.float32) for key, value in state.items()}, strict=False)
    except RuntimeError as exc:  # a shape that is not the config's
        raise UnverifiedWeights(f"{shard}: {exc}") from exc
    model.requires_grad_(False)  # inference only, as agents.zoo.checkpoint loads a whole model
    model.name = name  # what draft_name reads: which model a stage runs
    return model.eval()
