"""The scenario's models: `model` (the stages' weights) and `decode.draft`, a byte model by name or a local
checkpoint "hf:PATH" (agents.hf), checked where the scenario is loaded (the path, the checkpoint, the split, the
draft's vocabulary), so a bad one is exit 2 naming the key and the file, before anything starts."""

from __future__ import annotations

from pathlib import Path

from agents.zoo.configs import MODEL_CONFIGS, NULL_PREFIX, is_null
from agents.hf.checkpoint import HF_PREFIX, Checkpoint, is_hf
from agents.modes import MODES
from testbed.core.decode import DRAFT_KINDS, DecodeConfig
from testbed.core.errors import ConfigError

BYTE_MODELS = tuple(MODEL_CONFIGS)


def checkpoint_name(value: str, source: str, key: str) -> str:
    """"hf:PATH" as the absolute, checked "hf:/abs/PATH" every agent opens (PATH relative to the working directory)."""
    path = Path(value[len(HF_PREFIX):]).expanduser()
    if not str(path):
        raise ConfigError(f"expected hf:PATH, a checkpoint directory, got {value!r}", source=source, key=key)
    try:
        return Checkpoint.open(path).name
    except ConfigError as exc:
        raise ConfigError(str(exc), source=source, key=key) from None


def model_name(value: object, source: str, key: str, choices: tuple[str, ...], *, null: bool = False) -> str:
    """One of `choices`, or a checkpoint "hf:PATH"; with `null`, also a null model "null:NAME" of one of them."""
    if isinstance(value, str) and is_hf(value):
        return checkpoint_name(value, source, key)
    if null and is_null(value) and value[len(NULL_PREFIX):] in choices:
        return str(value)
    if value not in choices:
        nulls = f", \"{NULL_PREFIX}NAME\" (NAME's shapes, no computation)" if null else ""
        raise ConfigError(f"expected one of {', '.join(repr(c) for c in choices)}, \"hf:PATH\"{nulls}; got {value!r}",
                          source=source, key=key)
    return str(value)


def check_models(model: str, decode: DecodeConfig, *, parallel: str, drafts_on_edge: bool, source: str) -> None:
    """What a checkpoint or a null model can and cannot run with, and a draft that fits its target."""
    if is_null(model):
        _check_null(model, decode, parallel=parallel, drafts_on_edge=drafts_on_edge, source=source)
    if is_hf(model) and parallel == "tp":
        raise ConfigError("tensor parallelism splits the byte models' matmuls (agents.modes.tp); a checkpoint runs "
                          "parallel = \"pp\"", source=source, key="parallel")
    drafts = MODES[decode.mode].drafts or drafts_on_edge  # (edge clients draft: spec.placement)
    if not is_hf(decode.draft):
        if is_hf(model) and drafts and decode.draft == "trained":
            raise ConfigError("the shipped byte draft does not share a checkpoint's tokenizer: set decode.draft to "
                              "\"hf:PATH\" (a draft checkpoint with the same tokenizer) or \"calibrated\"",
                              source=source, key="decode.draft")
        return
    draft = Checkpoint.open(decode.draft)
    if not is_hf(model):
        raise ConfigError(f"a checkpoint draft needs a checkpoint target with its tokenizer, not the byte model "
                          f"{model!r}", source=source, key="decode.draft")
    target = Checkpoint.open(model)
    if draft.vocabulary().vocab != target.vocabulary().vocab or draft.shape.vocab_size != target.shape.vocab_size:
        raise ConfigError(f"the draft's vocabulary ({draft.shape.vocab_size} rows, tokenizer of "
                          f"{draft.vocabulary().size}) is not the target's ({target.shape.vocab_size}, "
                          f"{target.vocabulary().size}): speculation needs the same tokenizer",
                          source=source, key="decode.draft")


def _check_null(model: str, decode: DecodeConfig, *, parallel: str, drafts_on_edge: bool, source: str) -> None:
    """A null model (agents.zoo.null) keeps a run's timing only where no token's value decides what happens next."""
    if MODES[decode.mode].drafts_in(decode) or drafts_on_edge:
        raise ConfigError(f"{model!r} computes no tokens, and speculation's timing depends on which it accepts: "
                          f"decode.mode {decode.mode!r} needs a model (\"{model[len(NULL_PREFIX):]}\")",
                          source=source, key="model")
    if parallel == "tp":
        raise ConfigError(f"{model!r} has no matmuls for tensor parallelism to split: parallel = \"tp\" needs a model",
                          source=source, key="model")


def draft_rule(dec: dict, source: str) -> str:
    """decode.draft: "trained", "calibrated" or a checkpoint "hf:PATH"."""
    return model_name(dec.get("draft", DecodeConfig.draft), source, "decode.draft", DRAFT_KINDS)


__all__ = ["BYTE_MODELS", "check_models", "checkpoint_name", "draft_rule", "model_name"]
