"""The decode settings every agent receives (typed across the process boundary), and a decode mode's card (ModeInfo)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, TypeVar

from testbed.core.jsonrecord import JsonRecord
from testbed.core.settings import ModeSettings

DRAFT_KINDS = ("trained", "calibrated")
BATCHING = ("none", "continuous")
MAX_STREAMS = 1024  # agents.process.stage.PipelineStage.MAX_STREAMS: the KV caches one stage keeps

S = TypeVar("S", bound=ModeSettings)


@dataclass(frozen=True)
class DecodeConfig(JsonRecord):
    """[decode] of a scenario. Defaults live here once; agents get it as JSON and rebuild this very class.

    The keys every mode reads are fields here; a mode's own keys (decode.k, decode.tree_n, ...) are its settings
    class's (ModeSettings, in its folder, named on its card), one instance each in `mode_settings`: read them with
    decode.settings(TheClass) (its defaults where the config holds none)."""

    mode: str = "plain"  # a key of agents.modes.MODES
    tokens: int = 32  # per stream
    prompt: str = "    def __repr__(self):\n        return "  # one the shipped models continue greedily (README)
    prompt_tokens: int = 0  # > 0: a synthetic prompt of exactly this many tokens (agents.zoo.prompts), not `prompt`
    prefill_chunk: int = 0  # > 0: plain decode prefills the prompt in chunks of this many tokens, pipelined
    # several sequences in flight (the streams mode; the agents size their inboxes and the dsd cloud batches by them)
    streams: int = 1  # each stage keeps one KV cache per stream
    batching: str = "none"  # "none" (one frame per forward pass) or "continuous" (all queued frames)
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0
    # the draft model of every mode that drafts (ModeInfo.drafts: speculative, tree; dsd's edge clients)
    draft: str = "trained"  # or "calibrated", or a checkpoint "hf:PATH"
    alpha: float = 0.8  # dialled acceptance rate of the calibrated draft
    draft_ms: float = 0.0  # emulated per-token draft time c_d; 0 = the real draft forward only
    mode_settings: tuple[ModeSettings, ...] = ()  # every registered mode's own settings (testbed.scenario.decode)

    def settings(self, cls: type[S]) -> S:
        """The settings of class `cls` this config holds (cls's defaults where it holds none)."""
        for held in self.mode_settings:
            if type(held) is cls:
                return held
        return cls()

    def with_settings(self, cls: type[ModeSettings], **changes) -> DecodeConfig:
        """This config with `changes` made to its `cls` settings."""
        changed = dataclasses.replace(self.settings(cls), **changes)
        others = tuple(held for held in self.mode_settings if type(held) is not cls)
        return dataclasses.replace(self, mode_settings=others + (changed,))

    def to_section(self) -> dict:
        """The [decode] table, flat as a user writes it: its own keys and the keys of every mode's settings that live
        there (to_dict's values); the settings with a table of their own are in tables()."""
        own = {key: value for key, value in self.to_dict().items() if key != "mode_settings"}
        return own | {key: value for held in self.mode_settings if held.TABLE == "decode"
                      for key, value in held.to_dict().items() if key != "settings"}

    def tables(self) -> dict[str, dict]:
        """The tables of the settings it holds that have one of their own ([workload], [endpoint]), as a user
        writes them: with to_section, the whole of what the config holds."""
        out: dict[str, dict] = {}
        for held in self.mode_settings:
            if held.TABLE != "decode":
                out.setdefault(held.TABLE, {}).update({k: v for k, v in held.to_dict().items() if k != "settings"})
        return out

    def time_scaled(self, factor: float) -> DecodeConfig:
        """Every duration `factor` times as long: draft_ms, and each mode's settings ending in "_ms"."""
        return dataclasses.replace(self, draft_ms=self.draft_ms * factor,
                                   mode_settings=tuple(held.time_scaled(factor) for held in self.mode_settings))


CODECS = ("f32", "f16", "int8-block")
MAX_BLOCK = 0xFFFF


@dataclass(frozen=True)
class WireConfig(JsonRecord):
    """[wire] of a scenario: how hidden states travel on every link of the ring (agents.process.wire encodes them)."""

    codec: str = "f32"  # one of CODECS
    block: int = 64  # int8-block: values per absmax scale
    # An emulated geometry ([geometry], testbed.deploy; not TOML keys of [wire]): a HIDDEN frame carries the bytes of
    # a hidden state `width` values wide at `value_bytes` a value (before the codec), padded (agents.process.wire). 0: the
    # computing model's own tensor only.
    width: int = 0
    value_bytes: int = 4
    # A prompt longer than the computing model holds (decode.prompt_tokens past its window): the block at position 0
    # stands for this many more positions than it computes, on the wire and in its cost (the rest are emulated).
    extra_positions: int = 0
    own_width: int = 0  # the computing model's hidden width, with a geometry: a REDUCE message's share scales from it
    # Shipped KV (placement.kv = "ship") at the geometry's size: K and V of one position on one of its layers, and
    # each stage's share of its layers (a KV frame carries its sender's count in its flags; the receiver checks it)
    kv_layer_bytes: int = 0
    stage_layers: tuple[int, ...] = ()


KV_PLACEMENTS = ("local", "ship")
HEAD_PLACEMENTS = ("entry", "separate", "last")


@dataclass(frozen=True)
class PlacementConfig(JsonRecord):
    """[placement] of a scenario: where state lives (seed 000, "Placement laws")."""

    # "local": every stage keeps its KV cache (the law). "ship": the anti-pattern of a migrating design, each
    # stage also sends the K and V it just computed to its successor every step (measured, not asserted).
    kv: str = "local"
    # "entry": the LM head and sampler run on the entry node (N hops a lap). "separate": on their own agent after
    # the last stage (agents.process.head), and the sampled token travels on to the entry: N + 1 hops a lap. "last": on the
    # last stage, which returns only the token id (N hops; the return hop carries an id, not a hidden state).
    head: str = "entry"
    head_region: str = ""  # separate head in a scenario with [regions]: where its agent sits
    head_ms: float = 0.0  # separate head: its agent's emulated compute per lap (0 = the real head only)


DRAFT_PLACEMENTS = ("colocated", "edge")
MAX_CLIENTS = 32


@dataclass(frozen=True)
class SpecConfig(JsonRecord):
    """[spec] of a speculative scenario: where the draft runs (seeds 002/003, "Speculation at a Distance")."""

    # "colocated": the draft runs on the entry, beside the target. "edge": each of `clients` edge clients runs its
    # own draft in its own agent, over an edge-cloud link to the entry (one-way rtt_ms / 2 each way), and the
    # entry only verifies (agents.modes.dsd); `pipelined`: an edge keeps drafting while its round is verified.
    placement: str = "colocated"
    clients: int = 1
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    rate_mbit: float = 0.0
    pipelined: bool = False


ALLREDUCE = ("ring", "all-to-all")


@dataclass(frozen=True)
class TPConfig(JsonRecord):
    """[tp] of a scenario with parallel = "tp" (agents.modes.tp): how the two all-reduces per layer travel."""

    # "ring": reduce-scatter + all-gather over the ring's links, 2 (N - 1) serial steps of 1/N of the tensor.
    # "all-to-all": every rank sends its whole partial to every other one (needs a link between every pair).
    allreduce: str = "ring"


ROLES = ("runner", "summary", "metrics")  # the modules a mode's folder may hold beside its card and its facts


@dataclass(frozen=True)
class ModeInfo:
    """One decode mode's card: what the testbed does with it. A mode is a folder, agents/modes/<name>/ (its
    __init__ holds this card as INFO, beside its facts.py and settings.py), and one line in agents.modes.MODES.

    The folder's other modules, by role, each imported only by the process that needs it: `runner` (the agents;
    torch), `summary` (the launcher: the mode's part of RunSummary) and `metrics` (its run-log part and Prometheus
    family). part(role) finds them by those names, so this card imports nothing: it sits on the ground floor, below
    its runner (floor 1) and its summary and metrics (floor 3), so it cannot import them, and a list of them on each
    role's floor would be a registry line per role, not one per mode. Its settings and facts it imports itself.
    """

    name: str
    package: str  # the mode's folder as a package (its __name__)
    metric_kind: str  # the `kind` label of its laps in Prometheus
    # its part of RunSummary: the record type (in its facts, beside its lap facts) and the JSON field it goes to
    # (modes may share one: plain speculation and its K sweep); None where its summary module makes none
    summary: type | None = None
    summary_field: str | None = None
    every_agent: bool = False  # the runner runs on every agent (tensor parallelism), not on the entry alone
    lap_kind: str = "decode"  # LapRecord.kind of the laps that make its tokens (prefill and probe laps do not)
    heads: tuple[str, ...] = ("entry",)  # the placement.head values it runs with (HEAD_PLACEMENTS)
    # auto dilation calibrates it as itself at zero delay, not as plain decode of its ring: its overhead is off the
    # ring (dsd: the edge clients' hops); its summary part's calibration_lap() gives a lap's overhead and physics
    own_calibration: bool = False
    min_stages: int = 1  # the smallest ring it runs on (several streams in flight need a second stage to be in)
    greedy_on_last: bool = False  # with placement.head = "last" it decodes greedily only (the draft stays on the entry)
    spec_headline: bool = False  # its run's predicted rate is r_spec (RunSummary.is_speculative), not the wall
    drafts: bool = False  # it drafts with decode.draft (the scenario's model section checks the draft)
    # whether a run of these settings drafts, where that depends on them (serve: decode.speculate > 0); None: `drafts`
    drafting: Callable[[DecodeConfig], bool] | None = None
    no_k_sweep: bool = False  # it runs no K sweep: decode.k_sweep is refused where it loads
    # A run longer than the run log's window (testbed.launch.summarize.mode_summary): a summary module with
    # summarize_totals reads its metrics part's sums over every lap ((run log, scenario) -> its part); without it,
    # its summarize reads the window's laps, with these fields of its part (field, lap kind) counted over the run.
    window_counts: tuple[tuple[str, str], ...] = ()
    # several sequences in flight: the run log keeps each one's tokens and a window of their decode laps, and the
    # collector exports the streams gauges over it (testbed.launch.runlog, testbed.launch.collector)
    per_stream: bool = False
    # what a scenario's other sections turn it into: with decode.streams > 1 (plain decode of several streams is the
    # streams mode), with spec.placement = "edge" (the drafter moves to edge clients: dsd), with parallel = "tp"
    # (plain decode of one stream runs as the tp mode); None: it has no such form
    streams_as: str | None = None
    edge_as: str | None = None
    tp_as: str | None = None
    # its own [decode] keys: ModeSettings classes (its folder's settings.py; a mode may read another's, as dsd reads
    # speculation's K): every registered one is checked and carried in DecodeConfig.mode_settings
    settings: tuple[type[ModeSettings], ...] = ()
    # its settings against the model's context where a scenario loads: (decode config, the model's positions, the
    # model's name) -> raises ValueError whose text starts with the key (serve: a fixed prompt that cannot fit)
    check_context: Callable[[DecodeConfig, int, str], None] | None = None

    def __post_init__(self) -> None:
        if (self.summary is None) != (self.summary_field is None):
            raise ValueError(f"mode {self.name!r}: a summary part needs both its type and its field, or neither")

    def drafts_in(self, decode: DecodeConfig) -> bool:
        """Whether a run of these settings drafts (its timing then depends on the tokens the draft gets accepted)."""
        return self.drafting(decode) if self.drafting is not None else self.drafts

    def part(self, role: str):
        """The folder's `role` module (one of ROLES), imported; None where the mode has none."""
        if role not in ROLES:
            raise ValueError(f"a mode's part is one of {', '.join(ROLES)}, not {role!r}")
        return _module_or_none(f"{self.package}.{role}")

    def runner_path(self, attribute: str = "Runner") -> str:
        """"module:attribute" of its runner (AgentSpec.runner: the agent imports it, the launcher does not)."""
        return f"{self.package}.runner:{attribute}"


@functools.cache
def _module_or_none(name: str):
    """The module `name`, imported once; None where there is none (looked up once: the collector asks each scrape)."""
    import importlib
    import importlib.util

    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


def resolve(path: str):
    """Import "module:attribute" and return the attribute."""
    import importlib

    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
