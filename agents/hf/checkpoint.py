"""A local Hugging Face checkpoint directory, read without torch: its family, shape, tensor index and tokenizer.

What a checkpoint directory holds (as `save_pretrained` writes it): `config.json`, the weights as
`model.safetensors` or shards named by `model.safetensors.index.json`, and `tokenizer.json` (a fast tokenizer).
Everything here checks what it reads, and every error is a ConfigError naming the file and what is wrong (the
CLI's exit 2): a run fails at load, in the launcher, not minutes later in an agent.

The safetensors headers are read directly (8 bytes of little-endian length, then a JSON table of every tensor's
dtype, shape and byte range), so the index costs no torch and reads no weights.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from testbed.core.errors import ConfigError

HF_PREFIX = "hf:"
# Positions a stage's KV cache holds at most: a checkpoint's own limit (max_position_embeddings) is often 32k-128k,
# far past what a tiny CPU ring decodes; the cache is preallocated, so it is capped here (stated in the README).
CONTEXT_CAP = 2048
# Weight dtypes the stages can load (they compute in float32 on this CPU box: see agents.hf.model).
LOADABLE_DTYPES = ("F32", "F16", "BF16", "F64")
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not one
# What the stages' layers (agents.hf.layers) run: activations by config.json's name, rotary scalings by rope_type
# with the keys each needs
ACTIVATION_NAMES = ("silu", "swish", "relu", "gelu", "gelu_new", "gelu_pytorch_tanh")
ROPE_KEYS = {"default": (), "linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


@dataclass(frozen=True)
class Family:
    """Where a family keeps its parts, in the tensor names of its *ForCausalLM checkpoint."""

    base: str  # the decoder's module: "transformer" (GPT-2) or "model"
    layers: str  # its list of decoder layers
    embeddings: tuple[str, ...]  # the entry's embedding modules (GPT-2's learned positions too)
    final_norm: str
    # config.json's names for the shape: layers, width, heads, KV heads (None: as many as heads), context
    n_layer: str
    n_embd: str
    n_head: str
    kv_heads: str | None
    context: str
    tied_default: bool  # tie_word_embeddings when config.json does not say


_GPT2 = Family("transformer", "h", ("wte", "wpe"), "ln_f", "n_layer", "n_embd", "n_head", None, "n_positions", True)
_LLAMA_LIKE = dict(base="model", layers="layers", embeddings=("embed_tokens",), final_norm="norm",
                   n_layer="num_hidden_layers", n_embd="hidden_size", n_head="num_attention_heads",
                   kv_heads="num_key_value_heads", context="max_position_embeddings")
FAMILIES = {
    "gpt2": _GPT2,
    "llama": Family(**_LLAMA_LIKE, tied_default=False),
    "qwen2": Family(**_LLAMA_LIKE, tied_default=False),
    "mistral": Family(**_LLAMA_LIKE, tied_default=False),
}


def is_hf(name: str) -> bool:
    return name.startswith(HF_PREFIX)


@dataclass(frozen=True)
class ModelShape:
    """What agents.zoo.configs.GPTConfig is to the byte models, for a checkpoint: the shape the ring and the summaries
    need (the hidden width on the wire, the context, the layers to split)."""

    vocab_size: int
    block_size: int  # positions a stage's cache holds: the checkpoint's context, at most CONTEXT_CAP
    n_layer: int
    n_head: int
    n_embd: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint directory, checked: open it with Checkpoint.open(path)."""

    path: Path
    model_type: str
    config: dict
    shape: ModelShape
    tied: bool  # the LM head is the token embedding (no lm_head.weight of its own)
    tensors: dict  # canonical tensor name ("model.layers.0.mlp.up_proj.weight") -> (file, stored name)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def name(self) -> str:
        return f"{HF_PREFIX}{self.path}"

    @staticmethod
    def open(name_or_path: str | Path) -> "Checkpoint":
        """The checkpoint at `name_or_path` ("hf:PATH" or PATH; relative to the working directory), read once per
        process and path."""
        raw = str(name_or_path)
        return _open(Path(raw[len(HF_PREFIX):] if is_hf(raw) else raw).expanduser().resolve())

    def layer_prefix(self, layer: int) -> str:
        return f"{self.family.base}.{self.family.layers}.{layer}."

    def stage_tensors(self, first: int, last: int, entry: bool) -> dict[str, tuple[Path, str]]:
        """The tensors a stage of layers first..last-1 loads (and nothing else: a stage of a large checkpoint reads
        only its share); the entry also its embeddings, the final norm and the LM head."""
        if not 0 <= first <= last <= self.shape.n_layer:
            raise ConfigError(f"layers {first}..{last - 1} are outside the checkpoint's 0..{self.shape.n_layer - 1}",
                              source=str(self.path / "config.json"), key="num_hidden_layers")
        prefixes = [self.layer_prefix(i) for i in range(first, last)]
        if entry:
            family = self.family
            prefixes += [f"{family.base}.{m}." for m in (*family.embeddings, family.final_norm)]
            prefixes += [] if self.tied else ["lm_head."]
        wanted = {name: where for name, where in self.tensors.items() if name.startswith(tuple(prefixes))}
        for prefix in prefixes:
            if not any(name.startswith(prefix) for name in wanted):
                raise ConfigError(f"no tensor named {prefix}* in the checkpoint's weights",
                                  source=str(self.index_file), key=prefix.rstrip("."))
        return wanted

    @property
    def index_file(self) -> Path:
        index = self.path / "model.safetensors.index.json"
        return index if index.is_file() else self.path / "model.safetensors"

    def vocabulary(self) -> "TokenizerVocabulary":
        return _vocabulary(self.path, self.shape.vocab_size)


def _config_int(config: dict, key: str, source: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"expected a positive integer, got {value!r}", source=str(source), key=key)
    return value


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no {path.name}: {what}", source=str(path.parent)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not readable JSON ({exc})", source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", source=str(path))
    return data


def _safetensors_header(path: Path) -> dict:
    """The tensor table of one safetensors file (name -> {dtype, shape, data_offsets}), without reading weights."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8) or b"\0" * 8)
            if not 0 < length <= MAX_HEADER_BYTES:
                raise ConfigError(f"not a safetensors file (header length {length})", source=str(path))
            header = json.loads(f.read(length))
    except FileNotFoundError:
        raise ConfigError("the weights file is missing", source=str(path)) from None
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not a safetensors file ({exc})", source=str(path)) from None
    header.pop("__metadata__", None)
    return header


def _tensor_files(path: Path) -> tuple[dict[str, Path], dict[str, tuple[int, ...]]]:
    """Every stored tensor name -> the file that holds it (one file, or the shards of an index), and -> its shape."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, "").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError("expected a non-empty weight_map", source=str(index), key="weight_map")
        files = {name: path / shard for name, shard in weight_map.items()}
        headers = {shard: _safetensors_header(shard) for shard in set(files.values())}
        for name, shard in files.items():
            if name not in headers[shard]:
                raise ConfigError(f"the index names tensor {name!r} in {shard.name}, which does not hold it",
                                  source=str(index), key=name)
        entries = {name: headers[shard][name] for name, shard in files.items()}
    elif (path / "model.safetensors").is_file():
        header = _safetensors_header(path / "model.safetensors")
        files, entries = {name: path / "model.safetensors" for name in header}, header
    else:
        found = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = f" (found {', '.join(found)}: pickled weights are never loaded; save with safe_serialization)" if found else ""
        raise ConfigError(f"no model.safetensors or model.safetensors.index.json{hint}", source=str(path))
    for name, entry in entries.items():
        if entry.get("dtype") not in LOADABLE_DTYPES:
            raise ConfigError(f"tensor {name!r} is {entry.get('dtype')}, which this machine cannot run "
                              f"(loadable: {', '.join(LOADABLE_DTYPES)})", source=str(files[name]), key=name)
    return files, {name: tuple(entry.get("shape", ())) for name, entry in entries.items()}


@functools.cache
def _open(path: Path) -> Checkpoint:
    if not path.is_dir():
        raise ConfigError("no such checkpoint directory" if not path.exists() else "not a directory",
                          source=str(path))
    config_file = path / "config.json"
    config = _read_json(config_file, "a checkpoint directory holds config.json (save_pretrained writes it)")
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(FAMILIES)})",
                          source=str(config_file), key="model_type")
    if config.get("quantization_config"):
        raise ConfigError("a quantized checkpoint, which this machine cannot run (the stages compute in float32)",
                          source=str(config_file), key="quantization_config")
    family = FAMILIES[model_type]
    n_head = _config_int(config, family.n_head, config_file)
    n_embd = _config_int(config, family.n_embd, config_file)
    head_dim = _config_int(config, "head_dim", config_file, n_embd // n_head)
    kv_heads = _config_int(config, family.kv_heads, config_file, n_head) if family.kv_heads else n_head
    if n_head % kv_heads:
        raise ConfigError(f"{n_head} attention heads do not divide into {kv_heads} KV heads", source=str(config_file),
                          key=family.kv_heads)
    _check_runnable(config, model_type, config_file)
    shape = ModelShape(vocab_size=_config_int(config, "vocab_size", config_file),
                       block_size=min(_config_int(config, family.context, config_file), CONTEXT_CAP,
                                      _window(config, model_type)),
                       n_layer=_config_int(config, family.n_layer, config_file), n_head=n_head, n_embd=n_embd,
                       kv_heads=kv_heads, head_dim=head_dim)
    stored, stored_shapes = _tensor_files(path)
    # GPT-2's original checkpoints name tensors without the decoder's prefix ("h.0.attn.c_attn.weight")
    canonical = {name if name.startswith((f"{family.base}.", "lm_head.")) else f"{family.base}.{name}": (file, name)
                 for name, file in stored.items()}
    tied = bool(config.get("tie_word_embeddings", family.tied_default))
    checkpoint = Checkpoint(path, model_type, config, shape, tied, canonical)
    checkpoint.stage_tensors(0, shape.n_layer, entry=True)  # every part present, named if not
    _check_tensors(checkpoint, {name: stored_shapes[stored_name] for name, (_, stored_name) in canonical.items()})
    checkpoint.vocabulary()  # and a tokenizer that fits the vocabulary
    return checkpoint


def layer_shapes(checkpoint: Checkpoint, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor layer `layer` of the checkpoint runs, by canonical name -> its shape as config.json makes it."""
    s, config, p = checkpoint.shape, checkpoint.config, checkpoint.layer_prefix(layer)
    C, q_width, kv_width = s.n_embd, s.n_head * s.head_dim, s.kv_heads * s.head_dim
    if checkpoint.model_type == "gpt2":
        inner = config.get("n_inner") or 4 * C
        return {f"{p}ln_1.weight": (C,), f"{p}ln_1.bias": (C,), f"{p}ln_2.weight": (C,), f"{p}ln_2.bias": (C,),
                f"{p}attn.c_attn.weight": (C, 3 * C), f"{p}attn.c_attn.bias": (3 * C,),
                f"{p}attn.c_proj.weight": (C, C), f"{p}attn.c_proj.bias": (C,),
                f"{p}mlp.c_fc.weight": (C, inner), f"{p}mlp.c_fc.bias": (inner,),
                f"{p}mlp.c_proj.weight": (inner, C), f"{p}mlp.c_proj.bias": (C,)}
    inner = config.get("intermediate_size") or 4 * C
    attn, mlp = f"{p}self_attn.", f"{p}mlp."
    shapes = {f"{p}input_layernorm.weight": (C,), f"{p}post_attention_layernorm.weight": (C,),
              f"{attn}q_proj.weight": (q_width, C), f"{attn}k_proj.weight": (kv_width, C),
              f"{attn}v_proj.weight": (kv_width, C), f"{attn}o_proj.weight": (C, q_width),
              f"{mlp}gate_proj.weight": (inner, C), f"{mlp}up_proj.weight": (inner, C),
              f"{mlp}down_proj.weight": (C, inner)}
    qkv_bias = checkpoint.model_type == "qwen2" or bool(config.get("attention_bias"))
    if qkv_bias:
        shapes |= {f"{attn}q_proj.bias": (q_width,), f"{attn}k_proj.bias": (kv_width,),
                   f"{attn}v_proj.bias": (kv_width,)}
    if checkpoint.model_type != "qwen2" and config.get("attention_bias"):
        shapes[f"{attn}o_proj.bias"] = (C,)
    if config.get("mlp_bias"):
        shapes |= {f"{mlp}gate_proj.bias": (inner,), f"{mlp}up_proj.bias": (inner,), f"{mlp}down_proj.bias": (C,)}
    return shapes


def entry_shapes(checkpoint: Checkpoint) -> dict[str, tuple[int, ...]]:
    """The entry's own tensors: the embeddings, the final norm and (untied) the LM head."""
    s, family = checkpoint.shape, checkpoint.family
    base = family.base
    shapes = {f"{base}.{family.embeddings[0]}.weight": (s.vocab_size, s.n_embd),
              f"{base}.{family.final_norm}.weight": (s.n_embd,)}
    if checkpoint.model_type == "gpt2":
        shapes |= {f"{base}.wpe.weight": (checkpoint.config.get("n_positions", s.block_size), s.n_embd),
                   f"{base}.{family.final_norm}.bias": (s.n_embd,)}
    if not checkpoint.tied:
        shapes["lm_head.weight"] = (s.vocab_size, s.n_embd)
    return shapes


def _check_tensors(checkpoint: Checkpoint, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor the stages will read is in the weights, at the shape config.json makes it (read from the
    safetensors headers: a bad checkpoint stops the run at load, by name, not an agent minutes later)."""
    wanted = [entry_shapes(checkpoint)] + [layer_shapes(checkpoint, i) for i in range(checkpoint.shape.n_layer)]
    for group in wanted:
        for name, expected in group.items():
            if name not in shapes:
                raise ConfigError(f"no tensor named {name!r} in the checkpoint's weights",
                                  source=str(checkpoint.index_file), key=name)
            if shapes[name] != tuple(expected):
                raise ConfigError(f"tensor {name!r} is {shapes[name]}, config.json makes it {tuple(expected)}",
                                  source=str(checkpoint.tensors[name][0]), key=name)


def rope_parameters(config: dict) -> dict:
    """The rotary scaling as one dict, from v5's rope_parameters or the older rope_theta + rope_scaling."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return params


def _check_runnable(config: dict, model_type: str, config_file: Path) -> None:
    """The activation and the rotary scaling are ones the stages' layers run, or the run stops here, by name."""
    key = "activation_function" if model_type == "gpt2" else "hidden_act"
    name = config.get(key, "gelu_new" if model_type == "gpt2" else "silu")
    if name not in ACTIVATION_NAMES:
        raise ConfigError(f"activation {name!r} is not supported (supported: {', '.join(ACTIVATION_NAMES)})",
                          source=str(config_file), key=key)
    if model_type == "gpt2":
        return
    rope = rope_parameters(config)
    if rope["rope_type"] not in ROPE_KEYS:
        raise ConfigError(f"rope type {rope['rope_type']!r} is not supported (supported: {', '.join(ROPE_KEYS)})",
                          source=str(config_file), key="rope_parameters")
    missing = [k for k in ROPE_KEYS[rope["rope_type"]] if not isinstance(rope.get(k), (int, float))]
    if missing:
        raise ConfigError(f"rope type {rope['rope_type']!r} needs {', '.join(missing)}", source=str(config_file),
                          key="rope_parameters")


def _window(config: dict, model_type: str) -> int:
    """Mistral's (and Qwen2's, where used) sliding attention window: the context is capped at it, so no position
    ever attends past the window and a full causal mask is the window's mask."""
    window = config.get("sliding_window")
    used = model_type == "mistral" or (model_type == "qwen2" and config.get("use_sliding_window"))
    return window if used and isinstance(window, int) and window > 0 else CONTEXT_CAP


class TokenizerVocabulary:
    """The checkpoint's own tokenizer (tokenizer.json, through the `tokenizers` library: no torch), as the byte
    models' agents.zoo.configs.BYTES: encode(text) -> ids, decode(ids) -> text."""

    def __init__(self, path: Path, vocab_size: int) -> None:
        from tokenizers import Tokenizer

        file = path / "tokenizer.json"
        if not file.is_file():
            raise ConfigError("no tokenizer.json (a fast tokenizer, as save_pretrained writes it)", source=str(path))
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # noqa: BLE001 - the library's errors are untyped; named here at the boundary
            raise ConfigError(f"not a tokenizer ({exc})", source=str(file)) from None
        self.size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        if self.size > vocab_size:
            raise ConfigError(f"the tokenizer has {self.size} tokens, more than the model's vocab_size {vocab_size}",
                              source=str(file))

    @property
    def vocab(self) -> dict[str, int]:
        """Every token's id: what two checkpoints must share to speculate for each other."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)


@functools.cache
def _vocabulary(path: Path, vocab_size: int) -> TokenizerVocabulary:
    return TokenizerVocabulary(path, vocab_size)
