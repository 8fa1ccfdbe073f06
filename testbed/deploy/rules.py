"""A scenario's [geometry] and compute from hardware: the emulated model on the wire and each stage's roofline."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from testbed.core.decode import DecodeConfig, WireConfig
from testbed.core.errors import ConfigError
from testbed.core.roofline import Roofline
from testbed.deploy.catalog import (DTYPE_BYTES, HardwarePreset, ModelPreset, hardware_preset, model_preset,
                                    parse_hardware)
from testbed.scenario.validate import check_keys, number, string

# A [geometry]'s prefill where a stage names no hardware (or pins compute_ms): what a position of its prompt costs on
# this default part, the fewest of them that hold the stage's share (PrefillRate says where each figure came from).
PREFILL_HARDWARE = "h100-sxm"

GEOMETRY_KEYS = {"preset", "d_model", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "params_b",
                 "active_params_b", "dtype", "context"}
NEEDED_WITHOUT_PRESET = ("d_model", "layers", "heads", "params_b")


def geometry_from_dict(table: Any, source: str) -> ModelPreset | None:
    """[geometry]: a model preset (`preset = "llama-3.1-70b"`) and/or explicit keys (each overrides the preset's)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key="geometry")
    check_keys(table, GEOMETRY_KEYS, source, "geometry")
    name = string(table, "preset", "", source, "geometry")
    base = model_preset(name, source=source, key="geometry.preset") if name else None
    if base is None:
        missing = [k for k in NEEDED_WITHOUT_PRESET if k not in table]
        if missing:
            raise ConfigError(f"a geometry without a preset needs {', '.join(NEEDED_WITHOUT_PRESET)}; missing "
                              f"{', '.join(missing)}", source=source, key=f"geometry.{missing[0]}")

    def count(key: str, fallback: float, *, integer: bool = True) -> Any:
        return number(table, key, fallback, source, "geometry", minimum=1, integer=integer)

    d_model = count("d_model", base.d_model if base else 0)
    heads = count("heads", base.heads if base else 0)
    if ("d_model" in table or "heads" in table) and "head_dim" not in table and d_model % heads:
        raise ConfigError(f"d_model {d_model} is not a multiple of heads {heads}", source=source,
                          key="geometry.d_model")
    head_dim = count("head_dim", base.head_dim if base and "d_model" not in table and "heads" not in table
                     else d_model // heads)
    kv_heads = count("kv_heads", base.kv_heads if base else heads)
    if heads % kv_heads:
        raise ConfigError(f"kv_heads {kv_heads} does not divide heads {heads} (grouped-query attention shares each "
                          "K/V head among a whole number of query heads)", source=source, key="geometry.kv_heads")
    params_b = count("params_b", base.params / 1e9 if base else 0, integer=False)
    active_b = count("active_params_b", base.active_params / 1e9 if base and "params_b" not in table else params_b,
                     integer=False)
    if active_b > params_b:
        raise ConfigError(f"active_params_b {active_b:g} exceeds params_b {params_b:g}", source=source,
                          key="geometry.active_params_b")
    dtype = string(table, "dtype", base.dtype if base else "bf16", source, "geometry", tuple(DTYPE_BYTES))
    geometry = ModelPreset(
        name=name or "custom", source=base.source if base and len(table) == 1 else source, d_model=d_model,
        layers=count("layers", base.layers if base else 0), heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        ffn=count("ffn", base.ffn if base else 4 * d_model), vocab=count("vocab", base.vocab if base else 32_000),
        params=round(params_b * 1e9), active_params=round(active_b * 1e9), dtype=dtype,
        context=count("context", base.context if base else 8192), note=base.note if base else "")
    if geometry.params <= 2 * geometry.vocab * geometry.d_model:
        raise ConfigError(f"params_b {params_b:g} leaves nothing for the layers beyond the embedding and the head "
                          f"(2 x vocab x d_model = {2 * geometry.vocab * geometry.d_model / 1e9:.3g} B)",
                          source=source, key="geometry.params_b")
    return geometry


def geometry_table(geometry: ModelPreset) -> dict[str, Any]:
    """A [geometry] table that loads back to `geometry` (a study that rebuilds a scenario keeps its geometry)."""
    return {"d_model": geometry.d_model, "layers": geometry.layers, "heads": geometry.heads,
            "kv_heads": geometry.kv_heads, "head_dim": geometry.head_dim, "ffn": geometry.ffn, "vocab": geometry.vocab,
            "params_b": geometry.params / 1e9, "active_params_b": geometry.active_params / 1e9,
            "dtype": geometry.dtype, "context": geometry.context}


def hardware_tables(table: Any, source: str) -> dict[str, HardwarePreset]:
    """[hardware.NAME] tables of a scenario: presets of its own, with the catalogue's keys."""
    if table is None:
        return {}
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError("expected [hardware.NAME] tables", source=source, key="hardware")
    try:
        return parse_hardware(table, source)
    except ConfigError as exc:  # the catalogue's keys are NAME.key; in a scenario they sit under [hardware]
        message = str(exc).removeprefix(f"{source}: {exc.key}: ")
        raise ConfigError(message, source=source, key=f"hardware.{exc.key}") from exc


@dataclass(frozen=True)
class StageShare:
    """What one stage holds of the emulated model: its layers, and whether the LM head's matrix is on it."""

    layers: int
    head: bool


def emulated_split(geometry: ModelPreset, stages: list[Any], head_stage: int | None,
                   source: str) -> list[StageShare]:
    """Each stage's share of the emulated model's layers: the stages that compute (not `layers = 0`, not the
    separate head's agent) split them evenly, the first ones taking one more where they do not divide."""
    computing = [i for i, st in enumerate(stages) if st.layers != 0 and not st.is_head]
    if len(computing) > geometry.layers:
        raise ConfigError(f"{len(computing)} stages compute but the geometry has {geometry.layers} layers",
                          source=source, key="stages")
    counts = [0] * len(stages)
    for j, i in enumerate(computing):
        counts[i] = geometry.layers // len(computing) + (1 if j < geometry.layers % len(computing) else 0)
    return [StageShare(c, i == head_stage) for i, c in enumerate(counts)]


def stage_roofline(geometry: ModelPreset, share: StageShare, hardware: HardwarePreset, devices: int) -> Roofline:
    """The roofline of `share` of the model on `devices` of `hardware` (testbed.core.roofline.Roofline)."""
    embed_head = geometry.vocab * geometry.d_model  # the LM head's matrix (the embedding is a row lookup)
    layer_params = (geometry.params - 2 * embed_head) / geometry.layers
    layer_active = (geometry.active_params - 2 * embed_head) / geometry.layers
    head = embed_head if share.head else 0
    value = geometry.bytes_per_value
    return Roofline(
        weight_bytes=(share.layers * layer_active + head) * value,
        flops_per_token=2.0 * (share.layers * layer_active + head),
        kv_bytes_per_position=2.0 * geometry.kv_heads * geometry.head_dim * share.layers * value,
        memory_bw_bytes_s=hardware.memory_bw_bytes_s * hardware.mem_efficiency * devices,
        flop_s=hardware.peak_flops(geometry.dtype) * hardware.flop_efficiency * devices,
        total_weight_bytes=(share.layers * layer_params + head) * value)


def resident_bytes(geometry: ModelPreset, share: StageShare, entry: bool) -> float:
    """Weights a stage keeps in memory: its layers (every expert), the head's matrix, the entry's embedding."""
    embed_head = geometry.vocab * geometry.d_model
    layer_params = (geometry.params - 2 * embed_head) / geometry.layers
    return (share.layers * layer_params + embed_head * (share.head + entry)) * geometry.bytes_per_value


def apply_hardware(stages: list[Any], geometry: ModelPreset | None, own: dict[str, HardwarePreset],
                   head_stage: int | None, scale: float, source: str) -> list[Any]:
    """Each stage that names `hardware` gets the roofline of its share of the geometry (scaled by `scale`); a
    share that does not fit in its devices' memory is refused."""
    named = [i for i, st in enumerate(stages) if st.hardware]
    if geometry is None and named:
        raise ConfigError("compute from hardware needs a [geometry] (the model whose share each stage computes)",
                          source=source, key=f"stages[{named[0]}].hardware")
    if geometry is None:
        return stages
    shares = emulated_split(geometry, stages, head_stage, source)  # checks that every computing stage has a layer
    out = list(stages)
    for i in named:
        st = stages[i]
        hw = own[st.hardware] if st.hardware in own else hardware_preset(st.hardware, source=source,
                                                                           key=f"stages[{i}].hardware")
        need = resident_bytes(geometry, shares[i], entry=i == 0)
        if need > hw.memory_gb * 1e9 * st.devices:
            raise ConfigError(f"stage {st.name!r} holds {need / 1e9:.1f} GB of {geometry.name} in {geometry.dtype}; "
                              f"{st.devices} x {hw.name} have {hw.memory_gb * st.devices:g} GB (add devices)",
                              source=source, key=f"stages[{i}].devices")
        roofline = stage_roofline(geometry, shares[i], hw, st.devices)
        out[i] = replace(st, kv_room_bytes=hw.memory_gb * 1e9 * st.devices - need,
                         kv_position_bytes=roofline.kv_bytes_per_position)
        if st.compute_ms == 0:  # compute_ms, when given, overrides the roofline
            out[i] = replace(out[i], roofline=roofline.scaled(scale))
    return out


def devices_to_hold(geometry: ModelPreset, share: StageShare, entry: bool, hardware: HardwarePreset) -> int:
    """The fewest devices of `hardware` whose memory holds the stage's weights (resident_bytes)."""
    return max(1, math.ceil(resident_bytes(geometry, share, entry) / hardware.memory_bytes))


@dataclass(frozen=True)
class PrefillRate:
    """What one more position of a prompt costs a stage (compute-bound prefill: its FLOPs a token over the devices'
    effective FLOP/s, Roofline.flops_per_token / flop_s), and on what hardware that figure was worked out."""

    ms_per_token: float
    hardware: str
    devices: int
    default: bool  # the stage named no hardware: PREFILL_HARDWARE, the fewest that hold its share

    @property
    def source(self) -> str:
        how = "the default hardware, the fewest that hold the share" if self.default else "the stage's hardware"
        return f"roofline of {self.devices} x {self.hardware} ({how})"


def prefill_rate(geometry: ModelPreset, share: StageShare, entry: bool, hardware: HardwarePreset | None = None,
                 devices: int = 1) -> PrefillRate:
    """The prefill cost per position of a stage's share of `geometry`: on `devices` of `hardware`, or (None) on the
    fewest PREFILL_HARDWARE that hold the share. An unchunked prompt goes through the stages one after another, so
    seed-700b on 3 stages of 6 H100s costs ~0.47 ms a position over the ring, ~0.93 s for 2,000 (seed 000 puts such
    a prefill at 1-2 s)."""
    default = hardware is None
    if hardware is None:
        hardware = hardware_preset(PREFILL_HARDWARE)
        devices = devices_to_hold(geometry, share, entry, hardware)
    roofline = stage_roofline(geometry, share, hardware, devices)
    return PrefillRate(roofline.flops_per_token / roofline.flop_s * 1e3, hardware.name, devices, default)


def apply_prefill(raw_stages: list[Any], stages: list[Any], geometry: ModelPreset, own: dict[str, HardwarePreset],
                  head_stage: int | None, scale: float, source: str) -> list[Any]:
    """A [geometry]'s stages whose compute is not a roofline (compute_ms given, or no hardware) and that do not set
    prefill_ms_per_token get it from prefill_rate (scaled by `scale`): a prompt's positions cost compute, as seed
    000's C_prefill(P) says, rather than nothing past the first (prefill_ms_per_token = 0 turns it off)."""
    shares = emulated_split(geometry, stages, head_stage, source)
    out = list(stages)
    for i, st in enumerate(stages):
        given = i < len(raw_stages) and isinstance(raw_stages[i], dict) and "prefill_ms_per_token" in raw_stages[i]
        if st.roofline is not None or given or (shares[i].layers == 0 and not shares[i].head):
            continue
        hw = (own.get(st.hardware) or hardware_preset(st.hardware, source=source, key=f"stages[{i}].hardware")
              ) if st.hardware else None
        rate = prefill_rate(geometry, shares[i], i == 0, hw, st.devices)
        out[i] = replace(st, prefill_ms_per_token=rate.ms_per_token * scale)
    return out


def apply_profiles(stages: list[Any], scale: float, source: str) -> list[Any]:
    """Each stage that names a measured profile computes as it says (scaled by `scale`), in place of its roofline;
    compute_ms, when given, still overrides."""
    from testbed.deploy.profile import load_profile

    return [replace(st, roofline=Roofline(profile=load_profile(st.profile, source, f"stages[{i}].profile")
                                          ).scaled(scale))
            if st.profile and st.compute_ms == 0 else st for i, st in enumerate(stages)]


def apply_geometry(raw: dict, stages: list[Any], wire: WireConfig, head: str, model: str, decode: DecodeConfig,
                   scale: float, source: str) -> tuple[ModelPreset | None, list[Any], WireConfig]:
    """[geometry], [hardware.NAME] and the stages' hardware of a raw scenario: (the geometry, the stages with their
    rooflines, the [wire] with the geometry on it, and an emulated prompt's extra positions). `head`:
    placement.head (the LM head's matrix is on the entry, on the last stage, or on its own agent)."""
    from agents.zoo.configs import model_config
    from agents.zoo.prompts import prompt_window

    geometry = geometry_from_dict(raw.get("geometry"), source)
    head_stage = {"entry": 0, "last": len(stages) - 1}.get(head)  # "separate": the head's own agent
    own = hardware_tables(raw.get("hardware"), source)
    stages = apply_hardware(stages, geometry, own, head_stage, scale, source)
    stages = apply_profiles(stages, scale, source)
    if geometry is not None:
        stages = apply_prefill(raw.get("stages") or [], stages, geometry, own, head_stage, scale, source)
    if geometry is None and decode.prompt_tokens == 0:
        return geometry, stages, wire
    shape = model_config(model)
    extra = decode.prompt_tokens - prompt_window(decode.prompt_tokens, shape.block_size)
    if extra and geometry is None:
        raise ConfigError(f"the model holds {shape.block_size} positions: a longer prompt is emulated, with a "
                          "[geometry] (the model whose hidden state the frames carry)", source=source,
                          key="decode.prompt_tokens")
    if extra and geometry is not None and decode.prompt_tokens > geometry.context:
        raise ConfigError(f"{geometry.name} holds {geometry.context} positions, not {decode.prompt_tokens}",
                          source=source, key="decode.prompt_tokens")
    if extra and decode.prefill_chunk:
        raise ConfigError("an emulated prompt (past the model's window) goes in one block: prefill_chunk must be 0",
                          source=source, key="decode.prefill_chunk")
    if geometry is not None:
        shares = emulated_split(geometry, stages, head_stage, source)
        wire = replace(geometry_wire(wire, geometry, shape.n_embd, source), extra_positions=extra,
                       kv_layer_bytes=2 * geometry.kv_heads * geometry.head_dim * geometry.bytes_per_value,
                       stage_layers=tuple(share.layers for share in shares))
    return geometry, stages, wire


def prompt_lap_s(ring: list[Any], wire: WireConfig, prompt_tokens: int) -> float:
    """A prompt's lap on the links alone: each hop's delay and its serialization of the prompt's hidden state at
    the hop's rate (the geometry's bytes: a 64 MiB prompt at 10 Mbit/s takes 54 s a hop)."""
    from agents.process.codec import emulated_payload_bytes

    size = emulated_payload_bytes(prompt_tokens, wire) if wire.width else 0
    return sum(link.delay_ms / 1e3 + (0.0 if math.isinf(link.rate_bytes_s) else size / link.rate_bytes_s)
               for link in ring)


def geometry_wire(wire: WireConfig, geometry: ModelPreset, own_width: int, source: str) -> WireConfig:
    """The [wire] with the geometry's hidden state on it (agents.process.wire pads HIDDEN frames to it)."""
    if geometry.d_model * geometry.bytes_per_value < own_width * 4:
        raise ConfigError(f"a hidden state of {geometry.d_model} x {geometry.dtype} is smaller than the computing "
                          f"model's own ({own_width} x f32): frames cannot shrink to it", source=source,
                          key="geometry.d_model")
    return replace(wire, width=geometry.d_model, value_bytes=geometry.bytes_per_value, own_width=own_width)
