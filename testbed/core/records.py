"""Typed records that cross a process boundary: links, stage stamps, laps; each with to_json/from_json."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable

import agents.modes  # noqa: F401  (every mode's facts registered: a lap read back gets its own class)
from testbed.core.facts import LapFacts
from testbed.core.jsonrecord import JsonRecord, field_names, record_from_dict, to_plain

Address = tuple[str, int]
__all__ = ["Address", "JsonRecord", "LapFacts", "record_from_dict"]  # re-exported: records are read from here


@dataclass(frozen=True)
class LinkSpec(JsonRecord):
    """One directed link src -> dst of the emulated WAN.

    Any latency matrix is a set of these; a ring is the special case dst = (src + 1) % N.
    """

    src: int
    dst: int
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float = 0.0  # 0 means unlimited
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    @property
    def rate_bytes_s(self) -> float:
        """The link rate in bytes per second; math.inf when unlimited (rate_mbit = 0)."""
        return mbit_to_bytes_s(self.rate_mbit)


BYTES_PER_MBIT = 1e6 / 8  # a rate of 1 Mbit/s (10^6 bits) in bytes per second


def mbit_to_bytes_s(rate_mbit: float) -> float:
    """Mbit/s -> bytes/s; 0 (unlimited) -> math.inf."""
    return rate_mbit * BYTES_PER_MBIT if rate_mbit > 0 else math.inf


# Defaults of the network, each used by the scenario, the shapers and the agents from here.
LOSS_RTO_MS = 200.0  # a lost frame arrives this much later: Linux's minimum TCP retransmission timeout (TCP_RTO_MIN)
LAP_TIMEOUT_S = 120.0  # no frame within this long: a peer or a link is gone (the slowest ring + RTOs is far below)


@dataclass(frozen=True)
class Stamp(JsonRecord):
    """What one stage did with a frame, on the box's monotonic clock (seconds)."""

    stage: int
    recv: float
    compute_start: float
    real_end: float  # the real forward pass ended here
    compute_end: float  # emulated compute (padding) ended here
    send: float
    sent_bytes: int = 0
    batch: int = 1  # frames computed in the same forward pass as this one (continuous batching), this one included


@dataclass(frozen=True)
class HeadTiming(JsonRecord):
    """The entry node's head (LM head + sampler + padding) at the end of a lap."""

    start: float
    real_end: float
    end: float


@dataclass(frozen=True)
class LapRecord(JsonRecord):
    """One traversal of the ring as the entry node saw it: every stage's stamp plus the return arrival.

    `kind` is the lap's role ("prefill", "decode", "probe") and `mode` the decode mode that ran it; `facts` the
    mode's own typed facts of the lap (LapFacts: a speculation round, a prefill chunk), read back by that mode's
    summarizer; in JSON they are the "extra" object.
    """

    lap: int
    kind: str
    mode: str
    n_tok: int  # positions computed in this lap
    tokens: int  # tokens it produced
    start: float
    end: float
    stamps: tuple[Stamp, ...]
    return_recv: float
    head: HeadTiming | None = None
    ids: tuple[int, ...] = ()
    facts: LapFacts | None = None
    stream: int = 0  # which of the decode.streams sequences in flight this lap carried

    def to_dict(self) -> dict[str, Any]:
        data = {name: to_plain(getattr(self, name)) for name in field_names(LapRecord) if name != "facts"}
        data["extra"] = self.facts.to_extra() if self.facts is not None else {}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LapRecord:
        if not isinstance(data, dict) or "facts" in data:
            raise ValueError(f"LapRecord: expected an object with its facts under \"extra\", got {str(data)[:80]}")
        extra = data.get("extra")
        facts = LapFacts.from_extra(extra) if extra else None
        return record_from_dict(cls, {**{k: v for k, v in data.items() if k != "extra"}, "facts": facts})

    def __post_init__(self) -> None:
        if not isinstance(self.stamps, tuple):  # a frame's stamps (agents.process.wire.Stamps, packed): the record's own
            object.__setattr__(self, "stamps", tuple(self.stamps))

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def draft_s(self) -> float:
        """The entry's drafting before the lap's frame left (LapFacts.draft_time_s): 0 for a lap that drafted none."""
        return self.facts.draft_time_s() if self.facts is not None else 0.0

    def hop_latencies_s(self) -> list[float]:
        """One-way latency of ring hop i (stage i -> i+1; the last closes the ring): send stamp to receive stamp."""
        n = len(self.stamps)
        if n < 2:
            return []
        return [(self.stamps[i + 1].recv if i + 1 < n else self.return_recv) - self.stamps[i].send for i in range(n)]

    @property
    def ring_s(self) -> float:
        return sum(self.hop_latencies_s())

    def hop_bytes(self) -> list[int]:
        return [s.sent_bytes for s in self.stamps] if len(self.stamps) > 1 else []

    def stage_compute_s(self) -> list[float]:
        """Per-stage compute of this lap, emulated padding included; the entry's head counts to stage 0."""
        head = (self.head.end - self.head.start) if self.head is not None else 0.0
        return [s.compute_end - s.compute_start + (head if i == 0 else 0.0) for i, s in enumerate(self.stamps)]

    def stage_queue_s(self) -> list[float]:
        """Per-stage queueing: how long the frame waited at each stage before its forward pass started.

        At the entry (stage 0) that is the wait of the returning frame before the head: end - return_recv
        for a mode whose laps end where the entry takes the frame up (the streams mode); 0 otherwise.
        """
        waits = [max(0.0, s.compute_start - s.recv) for s in self.stamps]
        if waits and self.head is None:
            waits[0] = max(0.0, self.end - self.return_recv) if len(self.stamps) > 1 else 0.0
        return waits

    def stage_real_s(self) -> list[float]:
        """Per-stage real forward-pass time of this lap (the entry's front and head)."""
        head = (self.head.real_end - self.head.start) if self.head is not None else 0.0
        return [s.real_end - s.compute_start + (head if i == 0 else 0.0) for i, s in enumerate(self.stamps)]

    @property
    def compute_s(self) -> float:
        return sum(self.stage_compute_s())

    def time_scaled(self, factor: float) -> "LapRecord":
        """This lap on a clock running `factor` times as fast: every stamp and duration multiplied by it.

        A run under time dilation D is recorded on the box's clock; time_scaled(1 / D) gives it back in the
        scenario's own time (testbed.launch.dilation).
        """
        if factor == 1.0:
            return self

        def stamp(s: Stamp) -> Stamp:
            return dataclasses.replace(s, recv=s.recv * factor, compute_start=s.compute_start * factor,
                                       real_end=s.real_end * factor, compute_end=s.compute_end * factor,
                                       send=s.send * factor)

        head = None if self.head is None else HeadTiming(self.head.start * factor, self.head.real_end * factor,
                                                          self.head.end * factor)
        facts = self.facts.time_scaled(factor) if self.facts is not None else None
        return dataclasses.replace(self, start=self.start * factor, end=self.end * factor,
                                   stamps=tuple(stamp(s) for s in self.stamps), return_recv=self.return_recv * factor,
                                   head=head, facts=facts)


def alike_runs(laps: Iterable[LapRecord]) -> list[list[LapRecord]]:
    """Consecutive laps with one stamps tuple, start, end, return and head (one BATCH frame's streams: expand_laps)
    as runs: whatever is figured from those is figured once a run (a run log adds such laps together)."""
    runs: list[list[LapRecord]] = []
    for lap in laps:
        last = runs[-1][0] if runs else None
        if last is not None and last.stamps is lap.stamps and (last.start, last.end, last.return_recv, last.head) == (
                lap.start, lap.end, lap.return_recv, lap.head):
            runs[-1].append(lap)
        else:
            runs.append([lap])
    return runs


def expand_laps(first: LapRecord, laps: Any, streams: Any, ids: Any) -> list[LapRecord]:
    """The laps of one BATCH frame's streams (agents.process.ring.RingClient.report_laps): `first`, and each lap's lap, stream
    and ids; they share first's stamps (one tuple, not one per stream)."""
    if not (isinstance(laps, list) and isinstance(streams, list) and isinstance(ids, list)
            and len(laps) == len(streams) == len(ids) > 0 and all(isinstance(row, list) for row in ids)):
        raise ValueError(f"the laps of a batch need lists laps, streams and ids of one length, got {str(laps)[:40]}")
    return [dataclasses.replace(first, lap=int(lap), stream=int(stream), ids=tuple(map(int, row)))
            for lap, stream, row in zip(laps, streams, ids)]
