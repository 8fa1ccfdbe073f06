"""The decode modes' typed per-lap facts (LapRecord.facts): LapFacts, and a class per kind of lap a mode reports."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.core.jsonrecord import JsonRecord, field_names, record_from_dict


@dataclass(frozen=True)
class LapFacts(JsonRecord):
    """What a decode mode knows about one of its laps beyond the stamps, typed: a mode declares a subclass for each
    lap it reports (a speculation round, a tree round, a DSD request: testbed.core.facts), and a subclass registers
    by its class name, so a lap read back from JSON gets its facts back as that class. On the wire and in the lap
    log they are the lap's "extra" object: the fields, and "facts", the class name. A field whose name ends in
    "_s" is a duration in seconds (time_scaled scales it with the stamps)."""

    TYPES: ClassVar[dict[str, type[LapFacts]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        LapFacts.TYPES[cls.__name__] = cls

    def draft_time_s(self) -> float:
        """The entry's drafting in this lap before its frame left (it precedes the first hop); 0 if none."""
        return 0.0

    def time_scaled(self, factor: float) -> LapFacts:
        return dataclasses.replace(self, **{name: getattr(self, name) * factor for name in field_names(type(self))
                                            if name.endswith("_s") and getattr(self, name) is not None})

    def to_extra(self) -> dict[str, Any]:
        return {"facts": type(self).__name__, **self.to_dict()}

    @staticmethod
    def from_extra(data: dict[str, Any], what: str = "LapRecord.extra") -> LapFacts:
        """A lap's "extra" object -> its facts, as the class it names; an unknown or missing name is an error."""
        if not isinstance(data, dict):
            raise ValueError(f"{what}: expected an object, got {type(data).__name__}")
        name = data.get("facts")
        if name not in LapFacts.TYPES:
            raise ValueError(f"{what}: facts {name!r} is not one of {', '.join(sorted(LapFacts.TYPES))}")
        return record_from_dict(LapFacts.TYPES[name], {k: v for k, v in data.items() if k != "facts"},
                                what=f"{what} ({name})")


@dataclass(frozen=True)
class PrefillChunk(LapFacts):
    """A chunk of a chunked prefill (agents.prefill): the `chunk`-th of `chunks`."""

    chunk: int
    chunks: int


@dataclass(frozen=True)
class SpecRound(LapFacts):
    """A speculation round at the entry (agents.modes.speculative): K drafted in `draft_s` (emulated cost; the
    draft's own forward passes took `draft_real_s`), `accepted` of them kept, and sum_i sum_x min(q_i, p_i)."""

    k: int
    accepted: int
    draft_s: float
    draft_real_s: float
    overlap_sum: float
    draft: str  # the draft model's kind: "trained" or "calibrated"
    alpha_hat: float | None = None  # the K chooser's estimate after this round
    k_auto: bool = False  # K chosen each round (decode.k = "auto", no sweep)

    def draft_time_s(self) -> float:
        return self.draft_s


@dataclass(frozen=True)
class TreeRound(LapFacts):
    """A tree speculation round (agents.modes.tree): a tree of `tree_n` drafted nodes, `accepted` on the path kept."""

    tree_n: int
    accepted: int
    draft_s: float
    draft_real_s: float
    draft_steps: int
    depth: int
    policy: str

    def draft_time_s(self) -> float:
        return self.draft_s


@dataclass(frozen=True)
class TpToken(LapFacts):
    """A token of tensor-parallel decoding (agents.tp): compute per segment, the head, and the all-reduces' wait."""

    segment_s: float
    head_s: float
    comm_s: float
    collectives: int
    messages: int
    ranks: int


@dataclass(frozen=True)
class DsdVerify(LapFacts):
    """The cloud's verify (or prompt) pass for one edge client (agents.modes.dsd): its wait behind other clients'
    passes, K, the batch it ran in, and sum min(q, p) over its drafts where the round had any."""

    client: int
    queue_s: float
    k: int
    batch: int = 1
    overlap_sum: float | None = None


@dataclass(frozen=True)
class DsdRound(LapFacts):
    """An edge client's round (agents.modes.dsd): K drafted, `accepted` kept; `ready`: the drafts it began with,
    drafted while the last round was verified (pipelined); `wait_s` send to verdict-in-hand, `verdict_s` send to
    the verdict's arrival; `hit`: the guess was right and the next round is drafted."""

    k: int
    accepted: int
    draft_s: float
    draft_real_s: float
    ready: int
    overlap_sum: float
    wait_s: float
    verdict_s: float
    hit: bool
    client: int
    draft: str

    def draft_time_s(self) -> float:
        return self.draft_s


@dataclass(frozen=True)
class DsdRequest(LapFacts):
    """An edge client's whole request: `rounds` rounds from its prompt to its last token."""

    client: int
    rounds: int
