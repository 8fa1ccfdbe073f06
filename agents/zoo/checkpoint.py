"""Weights files and the training process's habits: atomic writes, fp16 save/load, locks, pinned threads.

Every weights file is safetensors (a JSON header and raw tensors; nothing in it can run code when loaded), the
shipped byte models' as a local Hugging Face checkpoint's are: no torch.load or pickle anywhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Iterator

import torch

from agents.zoo.model import GPT


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(n)  # same thread count every time: reductions then add up the same way
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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


def _write_json(path: pathlib.Path, data: dict) -> None:
    _atomic_write(path, lambda f: f.write((json.dumps(data, indent=2, sort_keys=True) + "\n").encode()))


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _save_state(model: GPT, path: pathlib.Path, dtype: torch.dtype = torch.float32) -> None:
    """The model's weights as safetensors; tied tensors (wte and lm_head) are stored once each, as copies."""
    from safetensors.torch import save

    state = {key: value.detach().to(dtype).contiguous().clone() for key, value in model.state_dict().items()}
    _atomic_write(path, lambda f: f.write(save(state, metadata={"config": json.dumps(model.config.__dict__)})))


def _save_fp16(model: GPT, path: pathlib.Path) -> None:
    _save_state(model, path, torch.float16)


def _load_state(model: GPT, path: pathlib.Path) -> GPT:
    from safetensors.torch import load_file

    state = load_file(str(path), device="cpu")
    model.load_state_dict({key: value.to(torch.float32) for key, value in state.items()})  # the agents compute in float32
    model.requires_grad_(False)  # inference only: no autograd bookkeeping even outside inference_mode
    return model.eval()
