"""[[stages]]: StageConfig, the stages a scenario lists (and the separate head's agent), their regions and layers."""

from __future__ import annotations

from dataclasses import dataclass, fields

from testbed.core.decode import PlacementConfig
from testbed.core.errors import ConfigError
from testbed.core.roofline import Roofline
from testbed.scenario.regions import RegionMatrix
from testbed.scenario.validate import check_keys, number, string

MAX_STAGES = 1024  # a virtual ring may be this long (netem.virtual); agent processes: ~16-20 fit this box


@dataclass(frozen=True)
class StageConfig:
    name: str
    compute_ms: float = 0.0  # emulated per-lap compute; 0 = the real forward pass only
    layers: int | None = None  # target layers on this stage; None = split evenly
    # Emulated cost of one forward pass over T positions of each of b streams (a prefill or speculative block
    # of T tokens, a continuous batch of b one-token frames):
    #     compute_ms + prefill_ms_per_token * (T - 1) + per_token_ms * (b - 1)
    per_token_ms: float = 0.0  # marginal cost of one more stream in a batch (memory-bound decode: small)
    # marginal cost of one more position in a block (compute-bound prefill); unset under a [geometry], the roofline's
    # of the stage's share on its hardware, else on testbed.deploy.rules.PREFILL_HARDWARE (apply_prefill)
    prefill_ms_per_token: float = 0.0
    region: str | None = None  # a name of the scenario's [regions]: the ring hops come from its matrix
    is_head: bool = False  # the separate LM head's agent (placement.head = "separate"): no layers, appended last
    # Compute from hardware (testbed.deploy): the stage's share of the [geometry] model on `devices` of a preset (or
    # a [hardware.NAME] of the scenario); its roofline is worked out at load. compute_ms, when given, overrides it.
    hardware: str | None = None
    devices: int = 1
    profile: str | None = None  # a measured profile's file (testbed.deploy.profile): replaces the roofline
    roofline: Roofline | None = None  # derived, not a TOML key (None where compute_ms is given)
    # derived from [geometry] and the hardware's memory (testbed.deploy.rules.apply_hardware), not TOML keys: the
    # bytes its devices have left beside its weights, and the K and V of one position on its layers (0: unknown)
    kv_room_bytes: float = 0.0
    kv_position_bytes: float = 0.0

    def cost_ms(self, n_tok: int = 1, batch: int = 1, context: int = 0) -> float:
        """A forward pass over n_tok positions of each of `batch` streams attending to `context` positions."""
        if self.roofline is not None:
            return self.roofline.seconds(n_tok, batch, context) * 1e3
        return self.compute_ms + self.prefill_ms_per_token * (n_tok - 1) + self.per_token_ms * (batch - 1)


# the TOML keys: not the head's flag ([placement]) nor what is derived at load
STAGE_KEYS = {f.name for f in fields(StageConfig)} - {"is_head", "roofline", "kv_room_bytes", "kv_position_bytes"}


def stage_from_dict(st: object, i: int, source: str, scale: float) -> StageConfig:
    """One [[stages]] table; its times multiplied by the scenario's scale."""
    where = f"stages[{i}]"
    if not isinstance(st, dict):
        raise ConfigError("expected a table", source=source, key=where)
    check_keys(st, STAGE_KEYS, source, where)
    layers = st.get("layers")
    if layers is not None:
        # 0: a stage that only forwards the hidden state, with its emulated compute (rings of hundreds of stages)
        layers = number(st, "layers", 1, source, where, minimum=0, integer=True)
    return StageConfig(
        name=string(st, "name", f"stage{i}", source, where),
        compute_ms=number(st, "compute_ms", 0.0, source, where, maximum=60_000) * scale,
        layers=layers,
        per_token_ms=number(st, "per_token_ms", 0.0, source, where, maximum=60_000) * scale,
        prefill_ms_per_token=number(st, "prefill_ms_per_token", 0.0, source, where, maximum=60_000) * scale,
        region=string(st, "region", "", source, where) or None,
        hardware=string(st, "hardware", "", source, where) or None,
        devices=number(st, "devices", 1, source, where, minimum=1, maximum=4096, integer=True),
        profile=string(st, "profile", "", source, where) or None,
    )


def stages_from_list(stages_raw: object, placement: PlacementConfig, source: str, scale: float) -> list[StageConfig]:
    """The [[stages]] array, then the separate head's agent where placement.head says so; names unique."""
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ConfigError("expected a non-empty array of [[stages]] tables", source=source, key="stages")
    if len(stages_raw) > MAX_STAGES:
        raise ConfigError(f"expected at most {MAX_STAGES} stages, got {len(stages_raw)}", source=source, key="stages")
    stages = [stage_from_dict(st, i, source, scale) for i, st in enumerate(stages_raw)]
    if placement.head == "separate":
        stages.append(StageConfig(name="head", compute_ms=placement.head_ms, layers=0,
                                  region=placement.head_region or None, is_head=True))
    if len({s.name for s in stages}) != len(stages):
        raise ConfigError("stage names must be unique" + (" (the separate head's agent is named \"head\")"
                                                         if placement.head == "separate" else ""),
                          source=source, key="stages")
    return stages


def placed_regions(stages: list[StageConfig], regions: RegionMatrix | None, placement: PlacementConfig,
                   source: str) -> list[str]:
    """The stages' regions in ring order (empty where none is placed); every stage or none names one, and each is
    a region of [regions]."""
    if placement.head == "separate" and regions is not None and not placement.head_region:
        raise ConfigError("a separate head in a scenario with [regions] needs placement.head_region",
                          source=source, key="placement.head_region")
    if placement.head_region and regions is None:
        raise ConfigError("placement.head_region names a region but the scenario has no [regions] table",
                          source=source, key="placement.head_region")
    placed = [st.region for st in stages if st.region is not None]
    if placed and regions is None:
        raise ConfigError("stages name regions but the scenario has no [regions] table", source=source,
                          key="stages.region")
    for i, st in enumerate(stages):
        if st.region is not None and st.region not in regions.names:
            raise ConfigError(f"unknown region {st.region!r}; expected one of {', '.join(regions.names)}",
                              source=source, key=f"stages[{i}].region")
    if placed and len(placed) != len(stages):
        raise ConfigError("either every stage names a region or none does", source=source, key="stages.region")
    return placed


def split_layers(n_layers: int, stages: tuple[StageConfig, ...], source: str = "<scenario>") -> list[tuple[int, int]]:
    """Each stage's [first, last) target layers: explicit `layers` where given, the rest split evenly."""
    if stages and stages[-1].is_head:  # the separate head's agent runs no layers
        return split_layers(n_layers, stages[:-1], source) + [(n_layers, n_layers)]
    n = sum(1 for s in stages if s.layers is None)  # stages to fill: an explicit `layers = 0` forwards only
    if n > n_layers:
        raise ConfigError(f"{n} stages but the model has only {n_layers} layers; every stage needs at least one "
                          "(or layers = 0: a stage that only forwards, with its emulated compute)",
                          source=source, key="stages")
    fixed = sum(s.layers for s in stages if s.layers is not None)
    free = [i for i, s in enumerate(stages) if s.layers is None]
    remaining = n_layers - fixed
    if remaining < len(free) or (not free and remaining != 0):
        raise ConfigError(f"stage layers add up to {fixed} (+{len(free)} stages to fill) but the model has "
                          f"{n_layers} layers", source=source, key="stages.layers")
    counts = [s.layers or 0 for s in stages]
    for j, i in enumerate(free):
        counts[i] = remaining // len(free) + (1 if j < remaining % len(free) else 0)
    ranges, first = [], 0
    for c in counts:
        ranges.append((first, first + c))
        first += c
    return ranges
