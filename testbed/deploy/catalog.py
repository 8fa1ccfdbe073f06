"""The shipped catalogues (model geometry, hardware datasheets, cloud-region latencies) as typed, checked presets."""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Callable

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_keys, check_number, check_text

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1}
EARTH_RADIUS_KM = 6371.0  # the mean radius: great-circle distances within ~0.5% of the ellipsoid's
FIBER_KM_PER_S = 200_000.0  # light in glass (refractive index ~1.5): 5 us per km, the floor under any route

MODEL_KEYS = {"source", "d_model", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "params_b",
              "active_params_b", "dtype", "context"}
HARDWARE_KEYS = {"source", "memory_gb", "memory_bw_gbs", "tflops_bf16", "tflops_fp8", "mem_efficiency",
                 "flop_efficiency", "efficiency_source"}
REGION_KEYS = {"city", "provider", "lat", "lon"}
REGIONS_TOP_KEYS = {"source", "date", "names", "one_way_ms", "regions"}
REGIONS_OPTIONAL_KEYS = {"flow_rate_mbit", "flow_rate_source"}  # one TCP flow's rate between regions, sourced
MODEL_COUNTS = ("d_model", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context")


@dataclass(frozen=True)
class ModelPreset:
    """A released model's geometry: what sizes its weights, its KV cache and the tensor that crosses a stage cut."""

    name: str
    source: str
    d_model: int  # hidden size: one token's residual vector
    layers: int
    heads: int
    kv_heads: int  # what the cache holds per layer: MLA models are entered as 1 head of the latent's width / 2
    head_dim: int
    ffn: int  # MLP intermediate size (for MoE: one expert's)
    vocab: int
    params: int  # total parameter count
    active_params: int  # touched per token (== params for dense models)
    dtype: str  # the released weights' dtype, a key of DTYPE_BYTES
    context: int  # max positions
    note: str = ""

    @property
    def bytes_per_value(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> int:
        return self.params * self.bytes_per_value

    @property
    def active_weight_bytes(self) -> int:
        """What a decode step streams from memory per token (MoE: only the routed experts)."""
        return self.active_params * self.bytes_per_value

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * self.layers * self.bytes_per_value

    def hidden_bytes(self, n_tok: int = 1) -> int:
        """The residual tensor [n_tok, d_model] that crosses each pipeline cut (seed paper, Eq. 1)."""
        return n_tok * self.d_model * self.bytes_per_value


@dataclass(frozen=True)
class HardwarePreset:
    """One accelerator's datasheet figures and the stated fractions of them a decode step and a prefill reach."""

    name: str
    source: str
    memory_gb: float
    memory_bw_gbs: float  # decimal GB/s
    tflops_bf16: float  # dense, no sparsity
    tflops_fp8: float  # dense; 0 where the part has no FP8 datapath
    mem_efficiency: float
    flop_efficiency: float
    efficiency_source: str
    note: str = ""
    tflops_f32: float = 0.0  # the datasheet's FP32 figure; 0 = not given

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for matrix work in `dtype`: a part without FP8 runs it at its 16-bit rate (the weights are
        upcast); f32 takes the datasheet's FP32 figure, else half the 16-bit rate (one FP32 FMA per two 16-bit)."""
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}", key="dtype")
        if dtype == "fp8":
            tflops = self.tflops_fp8 if self.tflops_fp8 > 0 else self.tflops_bf16
        elif dtype == "f32":
            tflops = self.tflops_f32 if self.tflops_f32 > 0 else self.tflops_bf16 / 2
        else:
            tflops = self.tflops_bf16
        return tflops * 1e12

    @property
    def memory_bw_bytes_s(self) -> float:
        return self.memory_bw_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


@dataclass(frozen=True)
class Region:
    """A cloud region: where it is and whose it is."""

    name: str
    city: str
    provider: str  # e.g. "aws eu-west-1"
    lat: float  # degrees north
    lon: float  # degrees east


@dataclass(frozen=True)
class RegionCatalog:
    """Named regions and a measured one-way latency matrix between them (row = from), with its source and date."""

    source: str
    date: str
    regions: tuple[Region, ...]
    names: tuple[str, ...]
    one_way_ms: tuple[tuple[float, ...], ...]
    flow_rate_mbit: float = 0.0  # what one TCP flow between two regions gets (0: not stated, unlimited)
    flow_rate_source: str = ""

    def region(self, name: str, source: str | None = None, key: str | None = None) -> Region:
        found = {r.name: r for r in self.regions}
        if name not in found:
            raise _unknown("region", name, found, source, key)
        return found[name]

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise _unknown("region", name, self.names, None, None)
        return self.names.index(name)

    def latency_ms(self, a: str, b: str) -> float:
        return self.one_way_ms[self._index(a)][self._index(b)]

    def distance_km(self, a: str, b: str) -> float:
        """Great-circle distance (haversine) between the two regions' coordinates."""
        ra, rb = self.region(a), self.region(b)
        lat_a, lat_b = math.radians(ra.lat), math.radians(rb.lat)
        half_chord = (math.sin((lat_b - lat_a) / 2) ** 2
                      + math.cos(lat_a) * math.cos(lat_b) * math.sin(math.radians(rb.lon - ra.lon) / 2) ** 2)
        return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(half_chord))

    def fiber_floor_ms(self, a: str, b: str) -> float:
        """One way along the great circle at the speed of light in fiber: no route between the two is faster."""
        return self.distance_km(a, b) / FIBER_KM_PER_S * 1000.0

    def matrix(self, names: list[str] | tuple[str, ...]) -> tuple[tuple[str, ...], list[list[float]]]:
        """The sub-matrix for `names` in that order, as a scenario's [regions] names / one_way_ms."""
        order = tuple(names)
        return order, [[self.latency_ms(a, b) for b in order] for a in order]


def _unknown(kind: str, name: str, known: Any, source: str | None, key: str | None) -> ConfigError:
    return ConfigError(f"unknown {kind} {name!r}; known: {', '.join(sorted(known))}", source=source, key=key)


def _entry(table: Any, source: str, name: str, required: set[str], optional: set[str]) -> dict:
    """One catalogue entry: a table with every required key and nothing unknown."""
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key=name)
    check_keys(table, required | optional, source, name)
    missing = sorted(required - table.keys())
    if missing:
        raise ConfigError(f"missing key (required: {', '.join(sorted(required))})", source=source,
                          key=f"{name}.{missing[0]}")
    if "source" in required:  # every figure names where it comes from
        check_text(table["source"], source, f"{name}.source")
    if "note" in table:
        check_text(table["note"], source, f"{name}.note", empty_ok=True)
    return table


def parse_models(data: dict, source: str) -> dict[str, ModelPreset]:
    """models.toml: one table per model (its name the table's key)."""
    presets = {}
    for name, raw in data.items():
        table = _entry(raw, source, name, MODEL_KEYS, {"note"})
        for key in MODEL_COUNTS:
            check_number(table[key], source, f"{name}.{key}", minimum=1, integer=True)
        for key in ("params_b", "active_params_b"):
            check_number(table[key], source, f"{name}.{key}", positive=True)
        check_number(table["active_params_b"], source, f"{name}.active_params_b", maximum=table["params_b"])
        check_text(table["dtype"], source, f"{name}.dtype", tuple(DTYPE_BYTES))
        # Sanity rules that hold for every family here, MLA included (DeepSeek-V3: 7168 = 128 * 56); the stronger
        # d_model == heads * head_dim is not checked: MLA's cached head_dim is the latent's, not the query's.
        if table["d_model"] % table["heads"]:
            raise ConfigError(f"d_model {table['d_model']} is not a multiple of heads {table['heads']}",
                              source=source, key=f"{name}.heads")
        if table["heads"] % table["kv_heads"]:
            raise ConfigError(f"heads {table['heads']} is not a multiple of kv_heads {table['kv_heads']} (GQA)",
                              source=source, key=f"{name}.kv_heads")
        presets[name] = ModelPreset(
            name=name, source=table["source"], d_model=table["d_model"], layers=table["layers"],
            heads=table["heads"], kv_heads=table["kv_heads"], head_dim=table["head_dim"], ffn=table["ffn"],
            vocab=table["vocab"], params=round(table["params_b"] * 1e9),
            active_params=round(table["active_params_b"] * 1e9), dtype=table["dtype"], context=table["context"],
            note=table.get("note", ""))
    return presets


def parse_hardware(data: dict, source: str) -> dict[str, HardwarePreset]:
    """hardware.toml: one table per part."""
    presets = {}
    for name, raw in data.items():
        table = _entry(raw, source, name, HARDWARE_KEYS, {"note", "tflops_f32"})
        for key in ("memory_gb", "memory_bw_gbs", "tflops_bf16"):
            check_number(table[key], source, f"{name}.{key}", positive=True)
        for key in ("tflops_fp8", "tflops_f32"):
            check_number(table.get(key, 0.0), source, f"{name}.{key}", minimum=0)
        for key in ("mem_efficiency", "flop_efficiency"):
            check_number(table[key], source, f"{name}.{key}", positive=True, maximum=1)
        check_text(table["efficiency_source"], source, f"{name}.efficiency_source")
        presets[name] = HardwarePreset(
            name=name, source=table["source"], memory_gb=float(table["memory_gb"]),
            memory_bw_gbs=float(table["memory_bw_gbs"]), tflops_bf16=float(table["tflops_bf16"]),
            tflops_fp8=float(table["tflops_fp8"]), mem_efficiency=float(table["mem_efficiency"]),
            flop_efficiency=float(table["flop_efficiency"]), efficiency_source=table["efficiency_source"],
            note=table.get("note", ""), tflops_f32=float(table.get("tflops_f32", 0.0)))
    return presets


def parse_regions(data: dict, source: str) -> RegionCatalog:
    """regions.toml: source, date, names, one_way_ms (row = from, zero diagonal) and a [regions.NAME] per name."""
    check_keys(data, REGIONS_TOP_KEYS | REGIONS_OPTIONAL_KEYS, source, "")
    missing = sorted(REGIONS_TOP_KEYS - data.keys())
    if missing:
        raise ConfigError("missing key", source=source, key=missing[0])
    check_text(data["source"], source, "source")
    check_text(data["date"], source, "date")
    tables = data["regions"]
    if not isinstance(tables, dict) or not tables:
        raise ConfigError("expected a table of regions", source=source, key="regions")
    regions = []
    for name, raw in tables.items():
        where = f"regions.{name}"
        table = _entry(raw, source, where, REGION_KEYS, set())
        check_text(table["city"], source, f"{where}.city")
        check_text(table["provider"], source, f"{where}.provider")
        check_number(table["lat"], source, f"{where}.lat", minimum=-90, maximum=90)
        check_number(table["lon"], source, f"{where}.lon", minimum=-180, maximum=180)
        regions.append(Region(name, table["city"], table["provider"], float(table["lat"]), float(table["lon"])))
    names = data["names"]
    if not isinstance(names, list) or len(set(names)) != len(names) or set(names) != set(tables):
        raise ConfigError(f"expected each of the {len(tables)} [regions.NAME] tables named once",
                          source=source, key="names")
    matrix = data["one_way_ms"]
    if not isinstance(matrix, list) or len(matrix) != len(names) \
            or not all(isinstance(row, list) and len(row) == len(names) for row in matrix):
        raise ConfigError(f"expected a {len(names)} x {len(names)} array (row = from)", source=source,
                          key="one_way_ms")
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            check_number(value, source, f"one_way_ms[{i}][{j}]", minimum=0, maximum=60_000)
        if row[i] != 0:
            raise ConfigError("a region's latency to itself must be 0", source=source, key=f"one_way_ms[{i}][{i}]")
    check_number(data.get("flow_rate_mbit", 0.0), source, "flow_rate_mbit", minimum=0, maximum=100_000)
    if data.get("flow_rate_mbit") and not data.get("flow_rate_source"):
        raise ConfigError("a flow rate needs its source", source=source, key="flow_rate_source")
    return RegionCatalog(source=data["source"], date=data["date"], regions=tuple(regions), names=tuple(names),
                         one_way_ms=tuple(tuple(float(v) for v in row) for row in matrix),
                         flow_rate_mbit=float(data.get("flow_rate_mbit", 0.0)),
                         flow_rate_source=data.get("flow_rate_source", ""))


def read_catalogue(path: Path | Traversable, parse: Callable[[dict, str], Any]) -> Any:
    """A catalogue file parsed by `parse`; TOML syntax errors become a ConfigError naming the file."""
    source = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=source) from exc
    return parse(data, source)


def _shipped(file: str) -> Traversable:
    return resources.files(__package__).joinpath(file)


@functools.cache
def _models() -> dict[str, ModelPreset]:
    return read_catalogue(_shipped("models.toml"), parse_models)


@functools.cache
def _hardware() -> dict[str, HardwarePreset]:
    return read_catalogue(_shipped("hardware.toml"), parse_hardware)


@functools.cache
def regions() -> RegionCatalog:
    """The shipped region catalogue (frozen, read once)."""
    return read_catalogue(_shipped("regions.toml"), parse_regions)


def models() -> dict[str, ModelPreset]:
    """The shipped model presets by name (read once; each call gets its own dict of the frozen presets)."""
    return dict(_models())


def hardware() -> dict[str, HardwarePreset]:
    """The shipped hardware presets by name (read once; each call gets its own dict)."""
    return dict(_hardware())


def model_preset(name: str, source: str | None = None, key: str | None = None) -> ModelPreset:
    """A model preset by name; an unknown name is a ConfigError naming `source` and `key` and listing the known."""
    if name not in _models():
        raise _unknown("model preset", name, _models(), source, key)
    return _models()[name]


def hardware_preset(name: str, source: str | None = None, key: str | None = None) -> HardwarePreset:
    if name not in _hardware():
        raise _unknown("hardware preset", name, _hardware(), source, key)
    return _hardware()[name]


def region(name: str, source: str | None = None, key: str | None = None) -> Region:
    return regions().region(name, source, key)
