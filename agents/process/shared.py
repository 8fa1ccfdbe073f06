"""The models an agent process computes with, loaded once per process and shared by whatever runs in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.hf.checkpoint import is_hf
from agents.zoo.configs import is_null, model_config

_SHARED: dict[str, Any] = {}


def shared_model(name: str, stage: tuple[int, int, bool] | None = None, weights: str = ""):
    """Model `name`, once per process: read-only weights, so the agents of a virtual run (all in one process,
    netem.virtual) share one copy, and a real agent process loads each name once.

    A byte model (agents.zoo.train.load_model) loads whole (a megabyte); a null model "null:NAME" (agents.zoo.null)
    has its shapes only. A checkpoint ("hf:PATH", agents.hf.model)
    loads only what is asked: `stage` = (first layer, last layer exclusive, is the entry) for a pipeline stage,
    None for all of it (a draft).

    `weights`: a directory of fetched, verified files (AgentSpec.weights, the [weights] phase's): the stage loads
    from there instead (verified_model); a null model loads nothing, from there or elsewhere."""
    if weights and not is_null(name):
        return verified_model(name, stage, Path(weights))
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


def verified_model(name: str, stage: tuple[int, int, bool] | None, directory: Path):
    """Model `name`'s stage from `directory`, every file of its record hashed again first (agents.weights.verified:
    a byte changed since its fetch verified it, and UnverifiedWeights stops the agent before it serves). A byte
    model: a GPT of its config with exactly that stage's tensors from the one shard there (load_byte_stage); a
    checkpoint: the directory is one (the nodes' files assembled), from which the stage loads its share."""
    from agents.weights import verified
    from agents.weights.stages import load_byte_stage

    first, last, extras = stage or (0, model_config(name).n_layer, True)
    key = f"{name} from {directory}" + ("" if is_hf(name) else f", layers {first}..{last} {extras}")
    if key not in _SHARED:
        files = verified.check(directory)
        if is_hf(name):
            from agents.hf.model import load_hf

            _SHARED[key] = load_hf(f"hf:{directory}")
            _SHARED[key].name = name  # a draft (draft_name) is the checkpoint itself, loaded as without [weights]
        else:
            shards = [path for file, path in files.items() if file.endswith(".safetensors")]
            if len(shards) != 1:
                raise verified.UnverifiedWeights(f"{directory}: expected one verified shard, found {len(shards)}")
            _SHARED[key] = load_byte_stage(name, shards[0], first, last, extras)
    model = _SHARED[key]
    if is_hf(name):
        model.load(first, last, extras)
    return model


def draft_name(draft: str, target) -> str:
    """The model a speculating mode drafts with, beside the `target` its stage runs: decode.draft "trained" (the
    shipped byte draft), "calibrated" (the target's logits with the acceptance dialled, agents.modes.speculative:
    the byte "target", or the checkpoint itself), or a checkpoint "hf:PATH"."""
    target_name = getattr(target, "name", "target")
    if draft == "calibrated":
        return target_name if is_hf(target_name) else "target"
    return draft if is_hf(draft) else "draft"
