"""Scenarios: frozen dataclasses loaded from TOML, checked where they are built, with --set overrides."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from testbed.core.decode import (ALLREDUCE, CODECS, MAX_BLOCK, MODES, DecodeConfig, PlacementConfig, SpecConfig,
                                 TPConfig, WireConfig)
from agents.configs import model_config
from agents.hf.checkpoint import is_hf
from testbed.model_rules import BYTE_MODELS, check_models, model_name
from testbed.decode_rules import decode_from_dict, parse_k_range  # noqa: F401 - parse_k_range re-exported
from testbed.placement_rules import edge_links, placement_from_dict as _placement, spec_from_dict
from testbed.placement_rules import tensor_parallel as _tensor_parallel
from testbed.core.errors import ConfigError
from testbed.core.records import LAP_TIMEOUT_S, LOSS_RTO_MS, LinkSpec
from testbed.core.roofline import Roofline
from testbed.deploy.catalog import ModelPreset
from testbed.deploy.rules import apply_geometry, prompt_lap_s
from testbed.regions import RegionMatrix, parse_regions as _regions
from testbed.schedule import LinkEvent, parse_schedule
from testbed.validate import check_keys as _check_keys
from testbed.validate import number as _number
from testbed.validate import string as _string

SCENARIO_PACKAGE = "testbed.scenarios"
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
    prefill_ms_per_token: float = 0.0  # marginal cost of one more position in a block (compute-bound prefill)
    region: str | None = None  # a name of the scenario's [regions]: the ring hops come from its matrix
    is_head: bool = False  # the separate LM head's agent (placement.head = "separate"): no layers, appended last
    # Compute from hardware (testbed.deploy): the stage's share of the [geometry] model on `devices` of a preset (or
    # a [hardware.NAME] of the scenario); its roofline is worked out at load. compute_ms, when given, overrides it.
    hardware: str | None = None
    devices: int = 1
    roofline: Roofline | None = None  # derived, not a TOML key (None where compute_ms is given)

    def cost_ms(self, n_tok: int = 1, batch: int = 1, context: int = 0) -> float:
        """A forward pass over n_tok positions of each of `batch` streams attending to `context` positions."""
        if self.roofline is not None:
            return self.roofline.seconds(n_tok, batch, context) * 1e3
        return self.compute_ms + self.prefill_ms_per_token * (n_tok - 1) + self.per_token_ms * (batch - 1)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    description: str
    stages: tuple[StageConfig, ...]
    links: tuple[LinkSpec, ...]  # every directed link; the ring hops come first, in stage order
    decode: DecodeConfig
    loss_rto_ms: float = LOSS_RTO_MS
    model: str = "target"
    scale: float = 1.0  # every delay and emulated time above is already multiplied by it
    wire: WireConfig = WireConfig()
    regions: RegionMatrix | None = None
    placement: PlacementConfig = PlacementConfig()
    parallel: str = "pp"  # "pp": each stage a slice of the layers; "tp": every agent a slice of every layer
    tp: TPConfig = TPConfig()
    spec: SpecConfig = SpecConfig()  # where the draft runs; "edge": spec.clients agents after the stages
    schedule: tuple[LinkEvent, ...] = ()  # [[network.schedule]]: links changing over time (testbed.schedule)
    lap_timeout_s: float = LAP_TIMEOUT_S  # a frame not back within this long means a peer or a link is gone
    geometry: ModelPreset | None = None  # [geometry]: the model the frames and the rooflines emulate (testbed.deploy)

    @property
    def n_agents(self) -> int:
        """Processes a run starts: the stages (the ring), then the edge clients (agents.modes.dsd)."""
        return self.n_stages + (self.spec.clients if self.spec.placement == "edge" else 0)

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def ring(self) -> tuple[LinkSpec, ...]:
        """Hop i is stage i -> stage (i + 1) % N; empty for a single stage."""
        if self.n_stages == 1:
            return ()
        return self.links[: self.n_stages]

    @property
    def t_ring_s(self) -> float:
        return sum(link.delay_ms for link in self.ring) / 1e3

    @property
    def emulated_compute_s(self) -> float:
        return sum(stage.cost_ms() for stage in self.stages) / 1e3

    def dilated(self, factor: float, base_ms: tuple[float, ...] = ()) -> "Scenario":
        """What the box runs under time dilation `factor` (testbed.dilation): every delay, jitter, emulated
        compute, draft time and RTO multiplied by it, every link rate divided by it (serialization takes
        `factor` times as long). `base_ms[i]`, the measured base one-way latency of link i at zero configured
        delay, is subtracted from that link's dilated delay (never below zero): base-path compensation.
        """
        if not factor >= 1.0:
            raise ConfigError(f"expected a dilation factor >= 1, got {factor!r}", source=self.source, key="dilation")
        if base_ms and len(base_ms) != len(self.links):
            raise ConfigError(f"expected one base latency per link ({len(self.links)}), got {len(base_ms)}",
                              source=self.source, key="dilation")
        links = tuple(replace(link, delay_ms=max(0.0, link.delay_ms * factor - (base_ms[i] if base_ms else 0.0)),
                              jitter_ms=link.jitter_ms * factor,
                              rate_mbit=link.rate_mbit / factor if link.rate_mbit else 0.0)
                      for i, link in enumerate(self.links))
        stages = tuple(replace(stage, compute_ms=stage.compute_ms * factor, per_token_ms=stage.per_token_ms * factor,
                               prefill_ms_per_token=stage.prefill_ms_per_token * factor,
                               roofline=stage.roofline.scaled(factor) if stage.roofline else None)
                       for stage in self.stages)
        decode = replace(self.decode, draft_ms=self.decode.draft_ms * factor)
        return replace(self, stages=stages, links=links, decode=decode, loss_rto_ms=self.loss_rto_ms * factor,
                       schedule=tuple(e.scaled(factor, rates=True) for e in self.schedule),
                       lap_timeout_s=self.lap_timeout_s * factor)


# --- loading -----------------------------------------------------------------------------------

_TOP_KEYS = {"name", "description", "model", "stages", "network", "decode", "scale", "wire", "regions", "placement",
             "parallel", "tp", "spec", "geometry", "hardware"}
_TP_KEYS = {f.name for f in fields(TPConfig)}
PARALLEL = ("pp", "tp")
_WIRE_KEYS = {f.name for f in fields(WireConfig)} - {"width", "value_bytes", "extra_positions"}  # from [geometry]
_STAGE_KEYS = {f.name for f in fields(StageConfig)} - {"is_head", "roofline"}  # the head's from [placement]
_NETWORK_KEYS = {"hops_ms", "jitter_ms", "loss_pct", "rate_mbit", "loss_rto_ms", "seed", "links", "schedule",
                 "lap_timeout_s"}
_LINK_KEYS = {f.name for f in fields(LinkSpec)} - {"seed"}  # a link's seed follows network.seed
_DECODE_KEYS = {f.name for f in fields(DecodeConfig)}


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files(SCENARIO_PACKAGE).iterdir()
                  if p.name.endswith(".toml"))


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> Scenario:
    """Load a built-in scenario by name, or a TOML file by path, then apply KEY=VALUE overrides."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        source = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read scenario file: {exc.strerror}", source=source) from exc
    else:
        if name_or_path not in builtin_names():
            raise ConfigError(f"no built-in scenario {name_or_path!r} and no such file; built-ins: "
                              f"{', '.join(builtin_names())}")
        source = f"<built-in {name_or_path}>"
        text = resources.files(SCENARIO_PACKAGE).joinpath(f"{name_or_path}.toml").read_text()
    try:
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:  # tomllib recurses once per level of nesting
        raise ConfigError(f"not valid TOML: {exc}", source=source) from exc
    for item in overrides or []:
        apply_override(raw, item, source)
    return scenario_from_dict(raw, source)


def parse_value(text: str) -> Any:
    """A --set value: a TOML value if it parses as one (5, 1.5, true, [1, 2], "x"), else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # nested deeper than tomllib's recursion: not a TOML value
        return text


def apply_override(raw: dict, item: str, source: str) -> None:
    """Apply `a.b.c=value` to the raw TOML dict; list indexes are numbers, `*` means every element."""
    key, sep, value_text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set expects KEY=VALUE, got {item!r}", source="--set")
    value = parse_value(value_text)
    parts = key.split(".")

    def assign(node: Any, rest: list[str], walked: str) -> None:
        head = rest[0]
        here = f"{walked}.{head}" if walked else head
        if isinstance(node, list):
            if head == "*":
                targets = range(len(node))
            elif head.isdigit() and int(head) < len(node):
                targets = [int(head)]
            else:
                raise ConfigError(f"index {head!r} out of range (list of {len(node)})", source="--set", key=here)
            for i in targets:
                if len(rest) == 1:
                    node[i] = value
                else:
                    assign(node[i], rest[1:], here)
            return
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set inside a {type(node).__name__}", source="--set", key=here)
        if len(rest) == 1:
            node[head] = value
        else:
            assign(node.setdefault(head, {}), rest[1:], here)

    assign(raw, parts, "")


def scenario_from_dict(raw: dict, source: str = "<dict>") -> Scenario:
    """Validate a raw TOML dict into a Scenario; every error names the source, the key and the expectation."""
    raw = copy.deepcopy(raw)
    _check_keys(raw, _TOP_KEYS, source, "")
    name = _string(raw, "name", Path(source).stem if source.endswith(".toml") else "scenario", source, "")
    description = _string(raw, "description", "", source, "")
    model = model_name(raw.get("model", "target"), source, "model", BYTE_MODELS)
    scale = _number(raw, "scale", 1.0, source, "", minimum=1e-6)

    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ConfigError("expected a non-empty array of [[stages]] tables", source=source, key="stages")
    if len(stages_raw) > MAX_STAGES:
        raise ConfigError(f"expected at most {MAX_STAGES} stages, got {len(stages_raw)}", source=source, key="stages")
    stages = []
    for i, st in enumerate(stages_raw):
        where = f"stages[{i}]"
        if not isinstance(st, dict):
            raise ConfigError("expected a table", source=source, key=where)
        _check_keys(st, _STAGE_KEYS, source, where)
        layers = st.get("layers")
        if layers is not None:
            # 0: a stage that only forwards the hidden state, with its emulated compute (rings of hundreds of stages)
            layers = _number(st, "layers", 1, source, where, minimum=0, integer=True)
        stages.append(StageConfig(
            name=_string(st, "name", f"stage{i}", source, where),
            compute_ms=_number(st, "compute_ms", 0.0, source, where, maximum=60_000) * scale,
            layers=layers,
            per_token_ms=_number(st, "per_token_ms", 0.0, source, where, maximum=60_000) * scale,
            prefill_ms_per_token=_number(st, "prefill_ms_per_token", 0.0, source, where, maximum=60_000) * scale,
            region=_string(st, "region", "", source, where) or None,
            hardware=_string(st, "hardware", "", source, where) or None,
            devices=_number(st, "devices", 1, source, where, minimum=1, maximum=4096, integer=True),
        ))
    placement = _placement(raw.get("placement", {}), source, scale)
    if placement.head == "separate":
        stages.append(StageConfig(name="head", compute_ms=placement.head_ms, layers=0,
                                  region=placement.head_region or None, is_head=True))
    if len({s.name for s in stages}) != len(stages):
        raise ConfigError("stage names must be unique" + (" (the separate head's agent is named \"head\")"
                                                         if placement.head == "separate" else ""),
                          source=source, key="stages")

    regions = _regions(raw.get("regions"), source, scale)
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
    net = raw.get("network", {})
    if not isinstance(net, dict):
        raise ConfigError("expected a table", source=source, key="network")
    _check_keys(net, _NETWORK_KEYS, source, "network")
    n = len(stages)
    if placed and "hops_ms" not in net:  # the ring's hops from the region matrix (already scaled: undo below)
        hops = [ms / scale for ms in regions.ring_ms(placed)]
    else:
        hops = net.get("hops_ms", [0.0] * n if n > 1 else [])
    if not isinstance(hops, list):
        raise ConfigError("expected an array of one-way delays in ms", source=source, key="network.hops_ms")
    expected_hops = n if n > 1 else 0
    if len(hops) != expected_hops:
        head = (" plus one for the separate head's agent, which sits after the last stage"
                if placement.head == "separate" else "")
        raise ConfigError(f"expected {expected_hops} ring hop delays (one per stage{head}, stage i -> i+1, the last "
                          f"closing the ring), got {len(hops)}", source=source, key="network.hops_ms")
    jitter = _number(net, "jitter_ms", 0.0, source, "network", maximum=10_000)
    loss = _number(net, "loss_pct", 0.0, source, "network", maximum=100)
    rate = _number(net, "rate_mbit", 0.0, source, "network", maximum=100_000)
    seed = _number(net, "seed", 0, source, "network", integer=True)
    loss_rto_ms = _number(net, "loss_rto_ms", LOSS_RTO_MS, source, "network", minimum=1.0, maximum=60_000) * scale
    links: list[LinkSpec] = []
    for i, delay in enumerate(hops):
        delay = _number({f"hops_ms[{i}]": delay}, f"hops_ms[{i}]", 0, source, "network", maximum=60_000)
        links.append(LinkSpec(i, (i + 1) % n, delay * scale, jitter * scale, loss, rate, seed + i))
    extra = net.get("links", [])
    if not isinstance(extra, list):
        raise ConfigError("expected an array of [[network.links]] tables", source=source, key="network.links")
    seen = {(link.src, link.dst) for link in links}
    for j, lk in enumerate(extra):
        where = f"network.links[{j}]"
        if not isinstance(lk, dict):
            raise ConfigError("expected a table", source=source, key=where)
        _check_keys(lk, _LINK_KEYS, source, where)
        src = _number(lk, "src", -1, source, where, maximum=n - 1, integer=True)
        dst = _number(lk, "dst", -1, source, where, maximum=n - 1, integer=True)
        if src == dst:
            raise ConfigError("a link needs two different stages", source=source, key=where)
        if (src, dst) in seen:
            raise ConfigError(f"link {src}->{dst} is already defined (ring hops come from network.hops_ms)",
                              source=source, key=where)
        seen.add((src, dst))
        links.append(LinkSpec(src, dst, _number(lk, "delay_ms", 0.0, source, where, maximum=60_000) * scale,
                              _number(lk, "jitter_ms", jitter, source, where) * scale,
                              _number(lk, "loss_pct", loss, source, where, maximum=100),
                              _number(lk, "rate_mbit", rate, source, where), seed + len(links)))

    dec = raw.get("decode", {})
    if not isinstance(dec, dict):
        raise ConfigError("expected a table", source=source, key="decode")
    _check_keys(dec, _DECODE_KEYS, source, "decode")
    decode = decode_from_dict(dec, source, scale)
    if decode.mode == "streams" and len(stages) < 2:
        raise ConfigError("several streams in flight need a ring of at least two stages", source=source,
                          key="decode.mode" if decode.streams == 1 else "decode.streams")
    wire_raw = raw.get("wire", {})
    if not isinstance(wire_raw, dict):
        raise ConfigError("expected a table", source=source, key="wire")
    _check_keys(wire_raw, _WIRE_KEYS, source, "wire")
    wire = WireConfig(codec=_string(wire_raw, "codec", "f32", source, "wire", CODECS),
                      block=_number(wire_raw, "block", 64, source, "wire", minimum=1, maximum=MAX_BLOCK, integer=True))
    if placement.head == "last" and len(stages) < 2:
        raise ConfigError("the head on the last stage needs a ring of at least two stages (one stage is the entry)",
                          source=source, key="placement.head")
    if placement.head == "last" and decode.mode == "tree" and decode.temperature > 0:
        raise ConfigError("the last stage verifies a tree greedily only (sampling needs the draft's distributions, "
                          "which stay on the entry): decode.temperature must be 0", source=source, key="placement.head")
    if placement.head not in MODES[decode.mode].heads:
        runs = " or ".join(f"{name} decode" for name, info in MODES.items() if placement.head in info.heads)
        raise ConfigError(f"{placement.head!r} runs {runs}, not {decode.mode!r} (a head off "
                          f"the entry samples one token a lap: speculation verifies its drafts in the head, several "
                          f"streams batch there)", source=source, key="placement.head")
    parallel = _string(raw, "parallel", "pp", source, "", PARALLEL)
    tp_raw = raw.get("tp", {})
    if not isinstance(tp_raw, dict):
        raise ConfigError("expected a table", source=source, key="tp")
    _check_keys(tp_raw, _TP_KEYS, source, "tp")
    tp = TPConfig(allreduce=_string(tp_raw, "allreduce", "ring", source, "tp", ALLREDUCE))
    if parallel == "tp" and wire.codec != "f32":
        raise ConfigError("tensor parallelism sends partial sums that every rank must add up to the same bits: "
                          "wire.codec must be \"f32\"", source=source, key="wire.codec")
    if parallel == "tp":
        decode, links = _tensor_parallel(decode, links, stages, placement, tp, regions, source)
    spec, decode = spec_from_dict(raw.get("spec", {}), decode, source, scale)
    if spec.placement == "edge" and (parallel != "pp" or placement.head != "entry"):
        raise ConfigError("edge drafts verify on the entry of a pipeline: keep parallel and placement.head at their "
                          "defaults", source=source, key="spec.placement")
    check_models(model, decode, parallel=parallel, drafts_on_edge=spec.placement == "edge", source=source)
    if is_hf(model):  # a byte model's split is checked at launch, a checkpoint's here: its layers are its own
        split_layers(model_config(model).n_layer, tuple(stages), source)
    geometry, stages, wire = apply_geometry(raw, stages, wire, placement.head, model, decode, scale, source)
    links += edge_links(spec, len(stages), seed + len(links))
    schedule = parse_schedule(net.get("schedule"), {(link.src, link.dst) for link in links}, source, scale)
    lap_timeout_s = _number(net, "lap_timeout_s", LAP_TIMEOUT_S, source, "network", minimum=0.1, maximum=3600) * scale
    if "lap_timeout_s" not in net:  # a long prompt on a slow link: its lap may outlast the default several times
        lap_timeout_s = max(lap_timeout_s, 3 * prompt_lap_s(links[:len(stages)], wire, decode.prompt_tokens))
    return Scenario(name=name, source=source, description=description, stages=tuple(stages), links=tuple(links),
                    decode=decode, loss_rto_ms=loss_rto_ms, model=model, scale=scale, wire=wire, regions=regions,
                    placement=placement, parallel=parallel, tp=tp, spec=spec, schedule=schedule,
                    lap_timeout_s=lap_timeout_s, geometry=geometry)


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
