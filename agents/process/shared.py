"""The models an agent process computes with, loaded once per process and shared by whatever runs in it."""

from __future__ import annotations

from typing import Any

from agents.hf.checkpoint import is_hf
from agents.zoo.configs import is_null, model_config

_SHARED: dict[str, Any] = {}


def shared_model(name: str, stage: tuple[int, int, bool] | None = None):
    """Model `name`, once per process: read-only weights, so the agents of a virtual run (all in one process,
    netem.virtual) share one copy, and a real agent process loads each name once.

    A byte model (agents.zoo.train.load_model) loads whole (a megabyte); a null model "null:NAME" (agents.zoo.null)
    has its shapes only. A checkpoint ("hf:PATH", agents.hf.model)
    loads only what is asked: `stage` = (first layer, last layer exclusive, is the entry) for a pipeline stage,
    None for all of it (a draft)."""
    if name not in _SHARED:
        if is_null(name):
            from agents.zoo.null import NullModel

            _SHARED[name] = NullModel(model_config(name), name)
        elif is_hf(name):
            from agents.hf.model import load_hf

            _SHARED[name] = load_hf(name)
        else:
            from agents.zoo.train import load_model

            _SHARED[name] = load_model(name)
            _SHARED[name].name = name  # what draft_name reads: which model a stage runs
    model = _SHARED[name]
    if is_hf(name):
        model.load(*(stage or (0, model.config.n_layer, True)))
    return model


def draft_name(draft: str, target) -> str:
    """The model a speculating mode drafts with, beside the `target` its stage runs: decode.draft "trained" (the
    shipped byte draft), "calibrated" (the target's logits with the acceptance dialled, agents.modes.speculative:
    the byte "target", or the checkpoint itself), or a checkpoint "hf:PATH"."""
    target_name = getattr(target, "name", "target")
    if draft == "calibrated":
        return target_name if is_hf(target_name) else "target"
    return draft if is_hf(draft) else "draft"
