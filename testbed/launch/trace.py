"""A timeline of every lap as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

    python -m testbed run geo-ring --trace results/geo-ring.trace.json

One track per stage and one per directed link (a stream of its own on each when several are in flight), built
from the stamps every lap carries, in scenario time (microseconds from the run's first lap):

- on a stage: `queue` (arrived, waiting for the stage: recv -> compute_start), `compute` (compute_start ->
  compute_end; args real_ms, the real forward pass, the rest is emulated padding), `frame` (compute_end -> send:
  encoding the frame); on the entry also what came before its stamp (`draft` in a speculative round, else
  `wait`) and `head` (the return's arrival -> the lap's end: LM head, sampling, padding);
- on a link: `hop` (the sender's send stamp -> the receiver's recv stamp, exactly the hop latency the summary
  measures), with `serialize` inside it where the link has a rate (the frame's bytes at that rate).

Per lap the stage and link spans tile the lap: they add up to its duration (tests/test_trace checks it, and that
each hop span is that hop's latency). A lap's spans carry `seq` (its order in the trace), lap, stream, kind, mode
and phase as arguments. Laps that overlap on one track (chunked prefill's chunks) nest badly in the viewers;
every span is still in the file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from testbed.scenario.config import Scenario
from testbed.core.errors import ConfigError
from testbed.core.records import LapRecord

TILING_CATEGORIES = ("stage", "link")  # the spans that tile a lap; "serialization" lies inside a hop


class TraceWriter:
    """Writes laps to a trace file as they arrive; `close()` ends the JSON (call it on every exit path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = path.open("w", encoding="utf-8")
        self._file.write('{"displayTimeUnit": "ms", "otherData": {"source": "geo-ring"}, "traceEvents": [\n')
        self._first = True
        self.origin: float | None = None  # scenario time of the first lap's start: the trace's zero
        self.seq = 0
        self._named: set[tuple[int, int]] = set()

    def add(self, record: LapRecord, scenario: Scenario, phase: str = "") -> None:
        if self._file is None:
            raise ValueError(f"trace {self.path} is closed")
        if self.origin is None:
            self.origin = record.start
        events = lap_events(record, scenario, self.origin, {"seq": self.seq, "phase": phase})
        self.seq += 1
        for event in events:
            track = (event["pid"], event["tid"])
            if track not in self._named:
                self._named.add(track)
                self._write_all(track_names(track, scenario))
        self._write_all(events)

    def _write_all(self, events: list[dict[str, Any]]) -> None:
        assert self._file is not None
        for event in events:
            self._file.write(("" if self._first else ",\n") + json.dumps(event, separators=(",", ":")))
            self._first = False

    def close(self) -> None:
        if self._file is not None:
            self._file.write("\n]}\n")
            self._file.close()
            self._file = None


_CURRENT: list[TraceWriter] = []  # the trace that run logs made inside `tracing(path)` write to


@contextlib.contextmanager
def tracing(path: Path | str | None) -> Iterator[TraceWriter | None]:
    """Every run log made inside writes its laps to the trace at `path` (None: no trace); the file is a whole
    JSON document however the block ends (an error, Ctrl-C)."""
    if path is None:
        yield None
        return
    writer = TraceWriter(Path(path))
    _CURRENT.append(writer)
    try:
        yield writer
    finally:
        _CURRENT.remove(writer)
        writer.close()


def current() -> TraceWriter | None:
    """The trace of the innermost `tracing` block, if any."""
    return _CURRENT[-1] if _CURRENT else None


def stage_pid(stage: int) -> int:
    return 1 + stage


def link_pid(scenario: Scenario, src: int, dst: int) -> int:
    """A link's track group: after the stages, in the scenario's link order (an unknown pair after those)."""
    pairs = [(link.src, link.dst) for link in scenario.links]
    index = pairs.index((src, dst)) if (src, dst) in pairs else len(pairs) + src
    return 1 + scenario.n_agents + index


def track_names(track: tuple[int, int], scenario: Scenario) -> list[dict[str, Any]]:
    """The metadata events that name a track (its process: a stage or a link; its thread: the stream)."""
    pid, tid = track
    stages = scenario.n_agents
    if pid <= stages:
        stage = pid - 1
        name = f"stage {stage}" + (f" {scenario.stages[stage].name}" if stage < len(scenario.stages) else "")
    else:
        index = pid - 1 - stages
        link = scenario.links[index] if index < len(scenario.links) else None
        name = f"link {link.src}->{link.dst}" if link is not None else f"link from {index - len(scenario.links)}"
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": pid}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"stream {tid}"}}]


def lap_events(record: LapRecord, scenario: Scenario, origin: float, args: dict[str, Any]) -> list[dict[str, Any]]:
    """The complete ("X") events of one lap: stage spans and hop spans that tile it, and serializations."""
    lap_args = {**args, "lap": record.lap, "stream": record.stream, "kind": record.kind, "mode": record.mode}
    tid = record.stream
    events: list[dict[str, Any]] = []

    def span(name: str, category: str, pid: int, begin: float, end: float, **extra: Any) -> None:
        if end > begin:
            events.append({"ph": "X", "name": name, "cat": category, "pid": pid, "tid": tid,
                           "ts": (begin - origin) * 1e6, "dur": (end - begin) * 1e6, "args": {**lap_args, **extra}})

    stamps = record.stamps
    if not stamps:
        return events
    entry = stamps[0].stage
    span("draft" if record.draft_s else "wait", "stage", stage_pid(entry), record.start, stamps[0].recv)
    rates = {(link.src, link.dst): link.rate_bytes_s for link in scenario.links}
    for i, (stamp, hop_s) in enumerate(zip(stamps, record.hop_latencies_s())):
        pid = stage_pid(stamp.stage)
        span("queue", "stage", pid, stamp.recv, stamp.compute_start)
        span("compute", "stage", pid, stamp.compute_start, stamp.compute_end,
             real_ms=(stamp.real_end - stamp.compute_start) * 1e3, batch=stamp.batch)
        span("frame", "stage", pid, stamp.compute_end, stamp.send)
        dst = stamps[i + 1].stage if i + 1 < len(stamps) else entry
        link = link_pid(scenario, stamp.stage, dst)
        span("hop", "link", link, stamp.send, stamp.send + hop_s, bytes=stamp.sent_bytes)
        rate = rates.get((stamp.stage, dst), float("inf"))
        if rate != float("inf") and stamp.sent_bytes:
            span("serialize", "serialization", link, stamp.send, stamp.send + min(hop_s, stamp.sent_bytes / rate),
                 bytes=stamp.sent_bytes)
    span("head", "stage", stage_pid(entry), record.return_recv, record.end)
    return events


def read_trace(path: Path | str) -> list[dict[str, Any]]:
    """The events of a trace file (ConfigError naming the file when it is not one)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not a readable trace: {exc}", source=str(path)) from exc
    return trace_events(data, str(path))


def trace_events(data: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError("a trace is an object with a traceEvents list", source=source)
    return data["traceEvents"]


def laps_of(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The complete events of each lap, by its seq."""
    laps: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("ph") == "X":
            laps.setdefault(event["args"]["seq"], []).append(event)
    return laps
