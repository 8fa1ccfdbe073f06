"""Scenarios: frozen dataclasses loaded from TOML, checked where they are built, with --set overrides."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from agents.modes import MODES
from agents.modes.speculative.settings import SpecSettings
from testbed.core.decode import (ALLREDUCE, CODECS, MAX_BLOCK, DecodeConfig, PlacementConfig, SpecConfig, TPConfig,
                                 WireConfig)
from agents.zoo.configs import model_config
from agents.hf.checkpoint import is_hf
from testbed.core.errors import ConfigError
from testbed.core.records import LAP_TIMEOUT_S, LOSS_RTO_MS, LinkSpec
from testbed.core.tcp import TRANSPORTS
from testbed.deploy.catalog import ModelPreset
from testbed.deploy.rules import apply_geometry, prompt_lap_s
from testbed.scenario.decode import decode_from_dict, decode_keys, parse_k_range  # noqa: F401 - parse_k_range re-exported
from testbed.scenario.decode import settings_tables, table_keys
from testbed.scenario.model import BYTE_MODELS, check_models, model_name
from testbed.scenario.network import NETWORK_KEYS, links_from_dict
from testbed.scenario.placement import edge_links, placement_from_dict as _placement, spec_from_dict
from testbed.scenario.placement import tensor_parallel as _tensor_parallel
from testbed.scenario.regions import RegionMatrix, parse_regions as _regions
from testbed.scenario.schedule import LinkEvent, parse_schedule
from testbed.scenario.stages import StageConfig, placed_regions, split_layers, stages_from_list
from testbed.scenario.validate import check_keys as _check_keys
from testbed.scenario.validate import number as _number
from testbed.scenario.validate import string as _string
from testbed.scenario.weights import WeightsConfig, weights_from_dict

SCENARIO_PACKAGE = "testbed.scenario.builtin"


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
    schedule: tuple[LinkEvent, ...] = ()  # [[network.schedule]]: links changing over time (testbed.scenario.schedule)
    lap_timeout_s: float = LAP_TIMEOUT_S  # a frame not back within this long means a peer or a link is gone
    geometry: ModelPreset | None = None  # [geometry]: the model the frames and the rooflines emulate (testbed.deploy)
    transport: str = "tuned"  # [network] transport: what the senders' TCP does (testbed.core.tcp)
    weights: WeightsConfig | None = None  # [weights]: the shards' distribution, the run's first phase

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

    def layer_ranges(self, n_layers: int) -> list[tuple[int, int]]:
        """Each stage's [first, last) layers of an n_layers model (testbed.scenario.stages.split_layers)."""
        return split_layers(n_layers, self.stages, self.source)

    @property
    def t_ring_s(self) -> float:
        return sum(link.delay_ms for link in self.ring) / 1e3

    @property
    def kv_positions(self) -> int:
        """Positions of K and V the ring holds at once: the stage with the least room for them decides (its devices'
        memory beside its share of the [geometry]'s weights, over the K and V of one position on its layers); 0 where
        no stage has hardware to say (no budget)."""
        rooms = [int(st.kv_room_bytes // st.kv_position_bytes) for st in self.stages if st.kv_position_bytes > 0]
        return max(0, min(rooms)) if rooms else 0

    @property
    def emulated_compute_s(self) -> float:
        return sum(stage.cost_ms() for stage in self.stages) / 1e3

    def dilated(self, factor: float, base_ms: tuple[float, ...] = ()) -> "Scenario":
        """What the box runs under time dilation `factor` (testbed.launch.dilation): every delay, jitter, emulated
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
        decode = self.decode.time_scaled(factor)
        return replace(self, stages=stages, links=links, decode=decode, loss_rto_ms=self.loss_rto_ms * factor,
                       schedule=tuple(e.scaled(factor, rates=True) for e in self.schedule),
                       lap_timeout_s=self.lap_timeout_s * factor)


# --- loading -----------------------------------------------------------------------------------

_OWN_KEYS = {"name", "description", "model", "stages", "network", "decode", "scale", "wire", "regions", "placement",
             "parallel", "tp", "spec", "geometry", "hardware", "weights"}


def top_keys() -> set[str]:
    """The tables and keys a scenario may hold: its own, and the tables the registered modes' settings name
    ([workload]: ModeSettings.TABLE), read when checked (a test may register a mode)."""
    return _OWN_KEYS | settings_tables()


_TOP_KEYS = top_keys()  # at import, with the registry's modes
_TP_KEYS = {f.name for f in fields(TPConfig)}
PARALLEL = ("pp", "tp")
_WIRE_KEYS = {f.name for f in fields(WireConfig)} - {"width", "value_bytes", "extra_positions", "own_width",
                                                    "kv_layer_bytes", "stage_layers"}  # derived from [geometry]


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


def section(raw: dict, key: str, allowed: set[str], source: str) -> dict:
    """raw[key] as a table (empty when absent) holding only `allowed` keys."""
    table = raw.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key=key)
    _check_keys(table, allowed, source, key)
    return table


def scenario_from_dict(raw: dict, source: str = "<dict>") -> Scenario:
    """Validate a raw TOML dict into a Scenario; every error names the source, the key and the expectation."""
    raw = copy.deepcopy(raw)
    _check_keys(raw, top_keys(), source, "")
    name = _string(raw, "name", Path(source).stem if source.endswith(".toml") else "scenario", source, "")
    description = _string(raw, "description", "", source, "")
    model = model_name(raw.get("model", "target"), source, "model", BYTE_MODELS, null=True)
    scale = _number(raw, "scale", 1.0, source, "", minimum=1e-6)
    placement = _placement(raw.get("placement", {}), source, scale)
    stages = stages_from_list(raw.get("stages"), placement, source, scale)
    regions = _regions(raw.get("regions"), source, scale)
    placed = placed_regions(stages, regions, placement, source)
    net = section(raw, "network", NETWORK_KEYS, source)
    links = links_from_dict(net, len(stages), regions, placed, placement.head, scale, source)
    seed = _number(net, "seed", 0, source, "network", integer=True)
    loss_rto_ms = _number(net, "loss_rto_ms", LOSS_RTO_MS, source, "network", minimum=1.0, maximum=60_000) * scale
    transport = _string(net, "transport", "tuned", source, "network", TRANSPORTS)
    tables = {table: section(raw, table, table_keys(table), source) for table in sorted(settings_tables()) if table in raw}
    decode = decode_from_dict(section(raw, "decode", decode_keys(), source), source, scale, tables)
    if len(stages) < MODES[decode.mode].min_stages:
        raise ConfigError(f"{decode.mode} decode needs a ring of at least {MODES[decode.mode].min_stages} stages",
                          source=source,
                          key="decode.mode" if decode.streams == 1 else "decode.streams")
    if MODES[decode.mode].no_k_sweep and decode.settings(SpecSettings).k_sweep:
        raise ConfigError(f"{decode.mode} decode runs no K sweep: decode.k is a number or \"auto\"", source=source,
                          key="decode.k_sweep")
    wire_raw = section(raw, "wire", _WIRE_KEYS, source)
    wire = WireConfig(codec=_string(wire_raw, "codec", "f32", source, "wire", CODECS),
                      block=_number(wire_raw, "block", 64, source, "wire", minimum=1, maximum=MAX_BLOCK, integer=True))
    check_head(placement, decode, len(stages), source)
    parallel = _string(raw, "parallel", "pp", source, "", PARALLEL)
    tp = TPConfig(allreduce=_string(section(raw, "tp", _TP_KEYS, source), "allreduce", "ring", source, "tp",
                                    ALLREDUCE))
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
    check_model_fits(model, decode, stages, source)
    geometry, stages, wire = apply_geometry(raw, stages, wire, placement.head, model, decode, scale, source)
    links += edge_links(spec, len(stages), seed + len(links))
    schedule = parse_schedule(net.get("schedule"), {(link.src, link.dst) for link in links}, source, scale)
    lap_timeout_s = _number(net, "lap_timeout_s", LAP_TIMEOUT_S, source, "network", minimum=0.1, maximum=3600) * scale
    if "lap_timeout_s" not in net:  # a long prompt on a slow link: its lap may outlast the default several times
        lap_timeout_s = max(lap_timeout_s, 3 * prompt_lap_s(links[:len(stages)], wire, decode.prompt_tokens))
    return Scenario(name=name, source=source, description=description, stages=tuple(stages), links=tuple(links),
                    decode=decode, loss_rto_ms=loss_rto_ms, model=model, scale=scale, wire=wire, regions=regions,
                    placement=placement, parallel=parallel, tp=tp, spec=spec, schedule=schedule,
                    lap_timeout_s=lap_timeout_s, geometry=geometry, transport=transport,
                    weights=weights_from_dict(raw.get("weights"), regions, placed, links, scale, source))


def check_model_fits(model: str, decode: DecodeConfig, stages: list[StageConfig], source: str) -> None:
    """A checkpoint's layers over the stages (a byte model's split is checked at launch), and the mode's lengths
    against the model's context (ModeInfo.check_context: serve's fixed prompt and output lengths)."""
    if is_hf(model):
        split_layers(model_config(model).n_layer, tuple(stages), source)
    if (check := MODES[decode.mode].check_context) is not None:
        try:
            check(decode, model_config(model).block_size, model)
        except ValueError as exc:
            key, _, why = str(exc).partition(": ")
            raise ConfigError(why, source=source, key=key) from exc


def check_head(placement: PlacementConfig, decode: DecodeConfig, n_stages: int, source: str) -> None:
    """Where the LM head runs must suit the ring and the decode mode."""
    if placement.head == "last" and n_stages < 2:
        raise ConfigError("the head on the last stage needs a ring of at least two stages (one stage is the entry)",
                          source=source, key="placement.head")
    if placement.head == "last" and MODES[decode.mode].greedy_on_last and decode.temperature > 0:
        raise ConfigError(f"the last stage verifies {decode.mode} decode greedily only (sampling needs the draft's "
                          "distributions, which stay on the entry): decode.temperature must be 0", source=source,
                          key="placement.head")
    if placement.head not in MODES[decode.mode].heads:
        runs = " or ".join(f"{name} decode" for name, info in MODES.items() if placement.head in info.heads)
        raise ConfigError(f"{placement.head!r} runs {runs}, not {decode.mode!r} (a head off "
                          f"the entry samples one token a lap: speculation verifies its drafts in the head, several "
                          f"streams batch there)", source=source, key="placement.head")
