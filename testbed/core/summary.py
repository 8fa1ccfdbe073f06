"""RunSummary: the one typed result of a run (JSON summary, dashboard, report, sweep, bench all read it)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from agents.modes import MODES
from testbed.core.decode import WireConfig
from testbed.core.jsonrecord import field_names, to_plain
from testbed.core.records import JsonRecord, record_from_dict


@dataclass(frozen=True)
class HopSummary(JsonRecord):
    hop: str  # "src->dst"
    configured_ms: float
    measured_ms_p50: float | None
    measured_ms_p99: float | None
    bytes_per_lap: int | None


@dataclass(frozen=True)
class StageSummary(JsonRecord):
    stage: int
    name: str
    emulated_ms: float
    compute_ms_mean: float | None  # with emulated padding
    real_ms_mean: float | None  # the real forward passes


@dataclass(frozen=True)
class TtftSummary(JsonRecord):
    """The first (prefill) lap: measured against C_prefill + T_ring (seed 000, Eq. 5)."""

    prompt_tokens: int
    measured_s: float
    prefill_compute_s: float
    predicted_s: float  # C_prefill + T_ring + serialization (physics.ttft_hops)
    serialization_s: float = 0.0  # the prompt's hidden state at each hop's rate, summed over the hops (and chunks)
    bytes_per_hop: int | None = None  # the whole prompt's (every chunk's) bytes over one hop, mean over the hops
    chunks: int = 1  # decode.prefill_chunk: the prompt went in this many pipelined chunks


@dataclass(frozen=True)
class LinkCheck(JsonRecord):
    """Self-check of one hop from the probe frames sent before the first lap."""

    hop: str
    configured_ms: float
    measured_ms_p50: float
    tolerance_ms: float
    ok: bool


@dataclass(frozen=True)
class DilationSummary(JsonRecord):
    """How a run was time-dilated (testbed.launch.dilation, after Gupta et al., NSDI'06).

    The box ran every link delay, jitter, emulated compute and real forward pass `factor` times as long
    (link rates `factor` times lower); every figure of the RunSummary is in the scenario's own time, the
    box's divided by `factor`, so the testbed's fixed costs (wake-ups, sockets, framing) shrink by `factor`.
    """

    factor: float = 1.0
    requested: str = "1"  # "auto" or the number asked for
    needed: float | None = None  # auto: the D that brings the calibrated overhead to target_overhead_pct
    cap: float | None = None  # auto: the largest D allowed (DILATION_MAX, and the run-time budget)
    target_overhead_pct: float | None = None
    overhead_ms: float | None = None  # calibrated: what a lap costs beyond compute and delays, undilated
    compensate: bool = False  # base-path compensation: base_ms subtracted from each dilated delay
    base_ms: tuple[float, ...] = ()  # calibrated one-way latency of each link at zero configured delay
    applied_ms: tuple[float, ...] = ()  # the delay each link got on the box (dilated, compensated)
    reason: str = ""
    lap_ms: float | None = None  # auto: the lap (C + T_ring) the overhead was weighed against
    budget_s: float | None = None  # auto: the run-time budget of the dilated decode (--budget-s)

    @property
    def capped(self) -> bool:
        """Auto wanted a larger D than the budget (or DILATION_MAX) allowed."""
        return self.needed is not None and self.needed > self.factor

    @property
    def expected_error_pct(self) -> float | None:
        """What the calibrated overhead left after dividing by D does to the measured rate, % (negative: slower):
        -(O / D) / (lap + O / D). Not folded into any prediction: shown beside the measured error."""
        if self.overhead_ms is None or not self.lap_ms:
            return None
        left = self.overhead_ms / self.factor
        return -100.0 * left / (self.lap_ms + left)









@dataclass(frozen=True)
class AgentUsage(JsonRecord):
    """One agent's CPU and memory over the run (from its run command to its end), as it reported them."""

    stage: int
    name: str
    box_wall_s: float  # on the box's clock (under time dilation D, D times the scenario's)
    cpu_s: float
    max_rss_mb: float
    # the process's own memory at its end (private pages: USS), where RSS also counts the pages an agent shares with
    # the fork server it was forked from (torch, transformers, the byte models); None where not measured
    uss_mb: float | None = None

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time: 1.0 is one core busy all the time."""
        return self.cpu_s / self.box_wall_s if self.box_wall_s > 0 else 0.0


def mode_parts() -> dict[str, type]:
    """The modes' parts of RunSummary: each registered mode's summary_field -> its record type (modes may share one)."""
    types: dict[str, type] = {}
    for info in MODES.values():
        if info.summary_field is not None and types.setdefault(info.summary_field, info.summary) is not info.summary:
            raise ValueError(f"two modes give the summary field {info.summary_field!r} different types")
    return types


@dataclass(frozen=True)
class RunFigures(JsonRecord):
    """The fields of every run's RunSummary; RunSummary adds a field for each decode mode's part (below)."""

    scenario: str
    description: str
    shaper: str
    shaper_reason: str
    phase: str
    mode: str
    stages: int
    stage_names: tuple[str, ...]
    hops_ms: tuple[float, ...]  # configured
    tokens: int
    laps: int
    wall_s: float
    compute_s: float | None  # mean C per decode lap, emulated padding included
    compute_real_s: float | None
    t_ring_s: float  # configured
    t_ring_measured_s: float | None
    measured_tok_s: float | None
    predicted_tok_s: float | None  # the wall, or the speculative rate in speculative mode
    error_pct: float | None
    lap_residual_ms: float | None  # entry-node framing per lap
    per_hop: tuple[HopSummary, ...]
    per_stage: tuple[StageSummary, ...]
    overhead_ms_per_hop: float | None
    ttft: TtftSummary | None = None
    self_check: tuple[LinkCheck, ...] | None = None
    # (each decode mode's own part comes here in the JSON: RunSummary's fields past these)
    history: tuple[tuple[float, float], ...] = ()  # (seconds since start, recent decode rate)
    metrics_url: str | None = None
    text: str = ""
    token_ids: tuple[int, ...] = ()
    generated_tokens: int | None = None
    shaper_facts: dict = field(default_factory=dict)  # what the backend set up and read back (Shaper.describe())
    dilation: DilationSummary | None = None  # None: not dilated (factor 1)
    agents: tuple[AgentUsage, ...] = ()  # every agent's CPU and memory over the run
    wire: WireConfig = WireConfig()  # how the hidden states travelled (codec)
    serialization_s: float = 0.0  # per decode lap: every hop's bytes at its rate (part of the prediction)
    extra: dict = field(default_factory=dict)  # figures a caller adds (bench, sweep), never read back by the testbed
    # [[network.schedule]]: (at_s, what, happened yet) in the scenario's time; schedule_elapsed_s since the origin
    schedule: tuple[tuple[float, str, bool], ...] = ()
    schedule_elapsed_s: float | None = None

    @property
    def parts(self) -> dict[str, JsonRecord]:
        """The modes' parts this run made, by field (summary.spec, summary.streams, ...: None where it made none)."""
        return {name: getattr(self, name) for name in _own_fields(type(self)) if getattr(self, name) is not None}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: each mode's part a field of its own (null where the run made none), after self_check."""
        out: dict[str, Any] = {}
        for name in field_names(RunFigures):
            out[name] = to_plain(getattr(self, name))
            if name == _PARTS_AFTER:
                out.update({part: to_plain(getattr(self, part)) for part in _own_fields(type(self))})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        """A RunSummary with every registered mode's field (a test may register a mode: summary_type())."""
        if not isinstance(data, dict):
            raise ValueError(f"RunSummary: expected an object, got {type(data).__name__}")
        return record_from_dict(summary_type(), data, what="RunSummary")

    @property
    def is_speculative(self) -> bool:
        """Its predicted rate is the speculative one (ModeInfo.spec_headline), not the wall."""
        info = MODES.get(self.mode)
        return info is not None and info.spec_headline

    @property
    def wall_predicted_tok_s(self) -> float | None:
        """The plain wall 1/(C + T_ring) as the summarizer predicted it, in either mode (None until known)."""
        for part in self.parts.values():  # a part that predicts more than the wall says what the wall was
            if hasattr(part, "plain_predicted_tok_s"):
                return part.plain_predicted_tok_s
        return None if self.is_speculative else self.predicted_tok_s


_PARTS_AFTER = "self_check"  # where the modes' fields always stood in the JSON


@functools.cache
def _own_fields(cls: type) -> tuple[str, ...]:
    return tuple(name for name in field_names(cls) if name not in field_names(RunFigures))


def _with_parts(base: type, parts: dict[str, type]) -> type:
    """`base` with a field for each mode's part: its summary_field, of its record type or None (the default)."""
    cls = dataclasses.make_dataclass(
        "RunSummary", [(name, record | None, field(default=None)) for name, record in parts.items()], bases=(base,),
        frozen=True, namespace={"__doc__": "Everything measured in one run next to its prediction (DESIGN.md section 4 names the "
                              "fields): RunFigures' fields, then each registered decode mode's part, by its card's "
                              "summary_field (summary.spec, summary.streams, ...; None where the run made none)."})
    cls.__module__ = __name__  # as a class written here (help(), pickle)
    return cls


# The registered modes' parts are fields of the class, built from their cards: a reader, dataclasses.fields() and
# help() see summary.spec as the record type its mode declares. The ground floor names no mode: the cards do.
RunSummary = _with_parts(RunFigures, mode_parts())


@functools.cache
def _summary_type(parts: tuple[tuple[str, type], ...]) -> type:
    known = set(field_names(RunSummary))
    missing = {name: record for name, record in parts if name not in known}
    return _with_parts(RunSummary, missing) if missing else RunSummary


def summary_type() -> type:
    """RunSummary as the registry stands now: with a field for a mode registered since import (a test's), too."""
    return _summary_type(tuple(mode_parts().items()))
