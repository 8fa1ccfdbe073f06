"""The search's input file: the machines a user has (kind, count, region, memory, price), the region matrix, the model,
the objective and the constraints, read from TOML and checked; every error names the file and the key.

    model = "llama-3.1-70b"
    objective = "tok_s"            # or "tok_s_per_dollar", "goodput", "goodput_per_dollar" (these need [workload])
    [[machines]]
    hardware = "h100-sxm"
    devices = 8                    # accelerators in one machine (tensor parallel inside it, over NVLink)
    count = 2
    region = "virginia"
    price_hour = 98.32             # $ an hour, one machine
    [speculation]
    draft = "llama-3.1-8b"
    alpha = 0.7
    [constraints]
    max_regions = 3
    head_region = "virginia"

[regions] gives the one-way delays (names, one_way_ms; default: the shipped catalogue's), or `regions = "links.toml"`
names a file that has them: `testbed probe --out`'s, whose rate_mbit (the slowest link's goodput) the search takes too
unless the file states its own.

[workload] states what the goodput objectives serve (testbed/studies/search/goodput.py): prompt_tokens,
output_tokens, arrival (poisson, constant), the SLO (goodput = "ttft:MS tpot:MS"), attainment (50, 90 or 99: the
percentile that must meet it), streams (the cap), requests (the run predicted) and seed.

[wire] (codecs, block, codec_gb_s), [placement] (kv, parallel) and [lan] (one_way_ms, gbit_s) add the codec, KV
local or shipped and TP groups inside a region as dimensions (testbed/studies/search/dims.py); a [workload] streams
list makes the batch cap one. [wire] round_trips (default 1) prices a stack whose protocol makes several round trips
a hop: 2n - 1 one-way delays on every hop of the lap.

[published] names a deployment someone measured (../shared/PUBLISHED.md): every machine of the file, in the file's
order (the first is the entry), split as the published system splits (`even`, or `memory`: exo's layers by memory
share); the search prints it beside its own best split of the same ring, with the published figure where there is
one (testbed/studies/search/published/).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from testbed.core.errors import ConfigError
from testbed.deploy.catalog import HardwarePreset, ModelPreset, hardware_preset, model_preset, regions
from testbed.scenario.validate import check_keys, number, string
from testbed.studies.search.dims import Dims, dims_from_dict

OBJECTIVES = ("tok_s", "tok_s_per_dollar", "goodput", "goodput_per_dollar")
PER_DOLLAR = ("tok_s_per_dollar", "goodput_per_dollar")
SERVING = ("goodput", "goodput_per_dollar")  # objectives ranked by the serve mode's queueing model
MODES = ("off", "sync", "async")  # speculation: none, synchronous (K*), overlapped (K* at each window)
MAX_MACHINES = 16  # machines in all (sum of counts): the ring's stages at most
MAX_WINDOW = 64
MAX_CAP = 4096  # [workload] streams: the largest batch cap
EXAMPLES = ("example", "small")  # shipped input files, by name (testbed/studies/search/NAME.toml)

TOP_KEYS = {"model", "objective", "prompt_tokens", "tokens", "context", "rate_mbit", "machines", "regions",
            "speculation", "constraints", "published", "workload", "wire", "placement", "lan"}
MACHINE_KEYS = {"name", "hardware", "devices", "count", "region", "memory_gb", "price_hour"}
SPEC_KEYS = {"draft", "alpha", "guess", "windows", "modes"}
CONSTRAINT_KEYS = {"max_regions", "head_region", "memory_fraction"}
REGION_KEYS = {"names", "one_way_ms", "source"}
PUBLISHED_KEYS = {"row", "system", "split", "tok_s", "source", "assumed"}
WORKLOAD_KEYS = {"prompt_tokens", "output_tokens", "arrival", "goodput", "attainment", "streams", "requests",
                 "seed"}
ARRIVALS = ("poisson", "constant")  # the open-loop arrivals the goodput search states (the serve mode's names)
ATTAINMENTS = (50, 90, 99)  # percent: the percentiles the queueing model predicts (median, p90, p99)
PUBLISHED_SPLITS = ("even", "memory")  # as a scenario splits a [geometry]; exo's layers by memory share


@dataclass(frozen=True)
class Machine:
    """One kind of machine the user has: `count` boxes of `devices` x `hardware` each, in one region."""

    name: str  # a label, unique in the file (default: the hardware preset's name and the region)
    hardware: HardwarePreset  # memory_gb already overridden where the file says so
    devices: int
    count: int
    region: str
    price_hour: float  # $ an hour, one machine (0: not stated)

    @property
    def memory_bytes(self) -> float:
        return self.hardware.memory_bytes * self.devices


@dataclass(frozen=True)
class Matrix:
    """One-way delays between the regions in use (row = from), and where they come from."""

    names: tuple[str, ...]
    one_way_ms: tuple[tuple[float, ...], ...]
    source: str

    def ms(self, a: str, b: str) -> float:
        return self.one_way_ms[self.names.index(a)][self.names.index(b)]


@dataclass(frozen=True)
class Published:
    """A deployment someone measured: the file's machines in its order, split the published system's way."""

    row: int  # of ../shared/PUBLISHED.md (0: not a row of it)
    system: str  # "exo", "prima.cpp", ...
    split: str  # "even" or "memory" (exo: each machine's layers in proportion to its memory)
    tok_s: float  # the published single-stream rate (0: none published for this setup)
    source: str  # where it was published
    assumed: str  # what the source leaves out and how the file fills it in


@dataclass(frozen=True)
class Workload:
    """[workload]: the requests the goodput objectives serve (fixed lengths, open-loop arrivals), the SLO and the
    share of requests that must meet it, and the streams cap (the KV memory may cap it lower)."""

    prompt_tokens: int = 512
    output_tokens: int = 128
    arrival: str = "poisson"
    goodput: str = ""  # vLLM's --goodput targets: "ttft:MS tpot:MS" (the serve mode's [workload].goodput)
    attainment: int = 90  # percent: the stated percentile of TTFT and of TPOT must meet the targets
    streams: int = 64  # requests in the ring at once at most (decode.streams of the serve run)
    caps: tuple[int, ...] = ()  # streams = [a list]: each cap a candidate, refused where its KV does not fit
    requests: int = 1000  # the run the prediction is of (a finite run's waiting tail depends on its length)
    seed: int = 0


@dataclass(frozen=True)
class SearchSpec:
    """A checked input file: what the search may combine and what it maximizes."""

    source: str
    model: ModelPreset
    objective: str  # "tok_s" or "tok_s_per_dollar"
    machines: tuple[Machine, ...]
    matrix: Matrix
    prompt_tokens: int = 2048  # the prompt before decode: the decode's context starts here
    tokens: int = 24  # tokens decoded: the rate is over these laps (and the virtual runs decode as many)
    context: int = 8192  # positions of KV every stage keeps memory for (one stream)
    rate_mbit: float = 5000.0  # every link's rate (0: unlimited)
    draft: ModelPreset | None = None  # speculation's draft, run whole on the entry machine
    alpha: float = 0.7  # the draft's acceptance rate (stated, i.i.d. per position)
    guess: float = 0.7  # overlap: the chance the draft guesses the target's next token after all K accepted
    windows: tuple[int, ...] = (4,)  # overlap: rounds in flight at most
    modes: tuple[str, ...] = MODES
    max_regions: int = 0  # 0: any number
    head_region: str = ""  # "": any region may hold the entry (the embedding, the LM head, the draft)
    memory_fraction: float = 1.0  # of each machine's memory the weights, KV and draft may use
    published: Published | None = None  # a published deployment of these machines, to set beside the search's
    workload: Workload | None = None  # [workload]: what the goodput objectives serve
    dims: Dims = Dims()  # [wire], [placement], [lan]: codecs, KV local or shipped, TP groups and their LAN

    @property
    def decode_context(self) -> float:
        """The decode's mean context: laps j = 1..tokens-1 attend to P + j positions, and a stage's KV reads are
        linear in it, so the mean lap is the lap at P + tokens / 2 (predict.decode_tok_s, summed)."""
        return self.prompt_tokens + self.tokens / 2


def example_path(name: str) -> Path:
    return Path(str(resources.files(__package__).joinpath(f"{name}.toml")))


def resolve(text: str) -> Path:
    """FILE, or the name of a shipped example (`example`, `small`)."""
    return example_path(text) if text in EXAMPLES and not Path(text).exists() else Path(text)


def load_spec(text: str) -> SearchSpec:
    """The input file at `text` (or a shipped example's name), checked; a ConfigError names the file and the key."""
    path = resolve(text)
    source = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the search file: {exc.strerror} (or name a shipped one: "
                          f"{', '.join(EXAMPLES)})", source=source, key="FILE") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=source) from exc
    return spec_from_dict(raw, source)


def spec_from_dict(raw: dict, source: str = "<dict>") -> SearchSpec:
    check_keys(raw, TOP_KEYS, source, "")
    if "model" not in raw:
        raise ConfigError("required: a model preset (testbed/deploy/models.toml)", source=source, key="model")
    model = model_preset(string(raw, "model", "", source, ""), source=source, key="model")
    objective = string(raw, "objective", "tok_s", source, "", OBJECTIVES)
    table, rate_mbit = _included(raw.get("regions"), source)
    matrix = _matrix(table, source)
    machines = _machines(raw.get("machines"), matrix, objective, source)
    spec_table = _table(raw, "speculation", source)
    check_keys(spec_table, SPEC_KEYS, source, "speculation")
    draft = model_preset(string(spec_table, "draft", "", source, "speculation"), source=source,
                         key="speculation.draft") if spec_table.get("draft") else None
    alpha = number(spec_table, "alpha", 0.7, source, "speculation", maximum=0.999)
    guess = number(spec_table, "guess", alpha, source, "speculation", maximum=1.0)
    windows = _ints(spec_table.get("windows", [4]), source, "speculation.windows", 1, MAX_WINDOW)
    modes = spec_table.get("modes", list(MODES) if draft else ["off"])
    if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"expected a non-empty list of {', '.join(MODES)}, got {modes!r}", source=source,
                          key="speculation.modes")
    if draft is None and set(modes) - {"off"}:
        raise ConfigError("speculation needs a draft model preset", source=source, key="speculation.draft")
    limits = _table(raw, "constraints", source)
    check_keys(limits, CONSTRAINT_KEYS, source, "constraints")
    head = string(limits, "head_region", "", source, "constraints")
    if head and head not in {m.region for m in machines}:
        raise ConfigError(f"no machine is in {head!r} (machines are in {', '.join(sorted({m.region for m in machines}))})",
                          source=source, key="constraints.head_region")
    return SearchSpec(
        source=source, model=model, objective=objective, machines=machines, matrix=matrix,
        prompt_tokens=number(raw, "prompt_tokens", 2048, source, "", minimum=1, maximum=model.context,
                             integer=True),
        tokens=number(raw, "tokens", 24, source, "", minimum=2, maximum=10_000, integer=True),
        context=number(raw, "context", 8192, source, "", minimum=1, maximum=model.context, integer=True),
        rate_mbit=number(raw, "rate_mbit", rate_mbit or regions().flow_rate_mbit, source, "", maximum=100_000),
        draft=draft, alpha=alpha, guess=guess, windows=tuple(dict.fromkeys(windows)),
        modes=tuple(dict.fromkeys(modes)),
        max_regions=number(limits, "max_regions", 0, source, "constraints", integer=True, maximum=64),
        head_region=head,
        memory_fraction=number(limits, "memory_fraction", 1.0, source, "constraints", minimum=0.01, maximum=1.0),
        published=_published(raw, source), workload=_workload(raw, objective, model, source),
        dims=dims_from_dict(raw, source))


def _published(raw: dict, source: str) -> Published | None:
    if "published" not in raw:
        return None
    table = _table(raw, "published", source)
    check_keys(table, PUBLISHED_KEYS, source, "published")
    return Published(row=number(table, "row", 0, source, "published", integer=True, maximum=10_000),
                     system=string(table, "system", "", source, "published"),
                     split=string(table, "split", "even", source, "published", PUBLISHED_SPLITS),
                     tok_s=number(table, "tok_s", 0.0, source, "published", maximum=1e6),
                     source=string(table, "source", "", source, "published"),
                     assumed=string(table, "assumed", "", source, "published"))


def _workload(raw: dict, objective: str, model: ModelPreset, source: str) -> Workload | None:
    """[workload], checked (every bad key named); required, with its goodput targets, by the goodput objectives."""
    if "workload" not in raw:
        if objective in SERVING:
            raise ConfigError(f"the objective {objective} needs a [workload] (prompt_tokens, output_tokens, goodput "
                              f"= \"ttft:MS tpot:MS\", attainment)", source=source, key="workload")
        return None
    table = _table(raw, "workload", source)
    check_keys(table, WORKLOAD_KEYS, source, "workload")
    goodput = string(table, "goodput", "", source, "workload")
    if goodput:
        from agents.modes.serve.slo import Goodput

        try:
            Goodput.parse(goodput)
        except ValueError as exc:
            raise ConfigError(str(exc), source=source, key="workload.goodput") from exc
    elif objective in SERVING:
        raise ConfigError(f"the objective {objective} needs SLO targets: goodput = \"ttft:MS tpot:MS\"",
                          source=source, key="workload.goodput")
    attainment = number(table, "attainment", 90, source, "workload", integer=True, maximum=100)
    caps = tuple(sorted(set(_ints(table["streams"], source, "workload.streams", 1, MAX_CAP)))) \
        if isinstance(table.get("streams"), list) else ()
    if attainment not in ATTAINMENTS:
        raise ConfigError(f"expected one of {', '.join(map(str, ATTAINMENTS))} (the percentiles the queueing model "
                          f"predicts), got {attainment}", source=source, key="workload.attainment")
    return Workload(
        prompt_tokens=number(table, "prompt_tokens", 512, source, "workload", minimum=1, integer=True,
                             maximum=model.context),
        output_tokens=number(table, "output_tokens", 128, source, "workload", minimum=1, integer=True,
                             maximum=model.context),
        arrival=string(table, "arrival", "poisson", source, "workload", ARRIVALS), goodput=goodput,
        attainment=attainment, streams=max(caps) if caps else number(table, "streams", 64, source, "workload",
                                                                     minimum=1, integer=True, maximum=MAX_CAP),
        caps=caps,
        requests=number(table, "requests", 1000, source, "workload", minimum=10, integer=True, maximum=100_000),
        seed=number(table, "seed", 0, source, "workload", integer=True, maximum=2**31))


def _table(raw: dict, key: str, source: str) -> dict:
    table = raw.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key=key)
    return table


def _ints(values: Any, source: str, key: str, low: int, high: int) -> list[int]:
    if not isinstance(values, list) or not values or not all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values):
        raise ConfigError(f"expected a non-empty list of integers in [{low}, {high}], got {values!r}", source=source,
                          key=key)
    return values


def _included(value: Any, source: str) -> tuple[Any, float | None]:
    """`regions = "FILE"`: the [regions] table of another file (`testbed probe --out`'s, a path relative to the search
    file) and its top-level rate_mbit if it has one (the probe's slowest link); else the value as it is."""
    if not isinstance(value, str):
        return value, None
    path = Path(value) if Path(value).is_absolute() else Path(source).parent / value
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the region file {str(path)!r}: {exc.strerror}", source=source,
                          key="regions") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the region file {str(path)!r} is not valid TOML: {exc}", source=source,
                          key="regions") from exc
    if not isinstance(raw.get("regions"), dict):
        raise ConfigError(f"the region file {str(path)!r} has no [regions] table (names, one_way_ms)", source=source,
                          key="regions")
    rate = number(raw, "rate_mbit", 0.0, str(path), "", maximum=100_000) if "rate_mbit" in raw else None
    return raw["regions"], rate


def _matrix(table: Any, source: str) -> Matrix:
    """[regions] of the file (names, one_way_ms, row = from; or the one a `regions = "FILE"` names), else the shipped
    catalogue's."""
    if table is None:
        catalogue = regions()
        return Matrix(catalogue.names, catalogue.one_way_ms, f"{catalogue.source} ({catalogue.date})")
    if not isinstance(table, dict):
        raise ConfigError("expected a table (names, one_way_ms) or the name of a file with one (testbed probe "
                          "--out)", source=source, key="regions")
    check_keys(table, REGION_KEYS, source, "regions")
    names = table.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names) \
            or len(set(names)) != len(names):
        raise ConfigError(f"expected a list of distinct region names, got {names!r}", source=source,
                          key="regions.names")
    rows = table.get("one_way_ms")
    if not isinstance(rows, list) or len(rows) != len(names) \
            or not all(isinstance(row, list) and len(row) == len(names) for row in rows):
        raise ConfigError(f"expected a {len(names)} x {len(names)} array of one-way ms (row = from)", source=source,
                          key="regions.one_way_ms")
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            number({"v": value}, "v", 0, source, f"regions.one_way_ms[{i}][{j}]", maximum=60_000)
        if row[i] != 0:
            raise ConfigError("a region's delay to itself must be 0", source=source, key=f"regions.one_way_ms[{i}][{i}]")
    return Matrix(tuple(names), tuple(tuple(float(v) for v in row) for row in rows),
                  string(table, "source", "the search file's [regions]", source, "regions"))


def _machines(items: Any, matrix: Matrix, objective: str, source: str) -> tuple[Machine, ...]:
    if not isinstance(items, list) or not items or not all(isinstance(m, dict) for m in items):
        raise ConfigError("expected one or more [[machines]] tables", source=source, key="machines")
    out: list[Machine] = []
    for i, table in enumerate(items):
        where = f"machines[{i}]"
        check_keys(table, MACHINE_KEYS, source, where)
        for key in ("hardware", "region"):
            if key not in table:
                raise ConfigError("required", source=source, key=f"{where}.{key}")
        part = hardware_preset(string(table, "hardware", "", source, where), source=source, key=f"{where}.hardware")
        region = string(table, "region", "", source, where)
        if region not in matrix.names:
            raise ConfigError(f"region {region!r} is missing from the region matrix ({matrix.source}; it has "
                              f"{', '.join(matrix.names)})", source=source, key=f"{where}.region")
        memory_gb = number(table, "memory_gb", part.memory_gb, source, where, minimum=0.001, maximum=1e6)
        if memory_gb != part.memory_gb:
            part = replace(part, memory_gb=memory_gb)
        price = number(table, "price_hour", 0.0, source, where, maximum=1e6)
        if objective in PER_DOLLAR and price <= 0:
            raise ConfigError(f"the objective is {objective}: every machine needs its price_hour > 0",
                              source=source, key=f"{where}.price_hour")
        out.append(Machine(name=string(table, "name", f"{part.name}@{region}", source, where), hardware=part,
                           devices=number(table, "devices", 1, source, where, minimum=1, maximum=4096, integer=True),
                           count=number(table, "count", 1, source, where, minimum=1, maximum=MAX_MACHINES,
                                        integer=True),
                           region=region, price_hour=price))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"machine names must be unique, got {names}", source=source, key="machines")
    total = sum(m.count for m in out)
    if total > MAX_MACHINES:
        raise ConfigError(f"at most {MAX_MACHINES} machines in all (each is a stage of the ring), got {total}",
                          source=source, key="machines")
    return tuple(out)
