"""The report's timeline: a few laps of a `--trace` file (testbed.launch.trace) drawn as rows of stages and links, time
across, so the pipeline bubble, a batch's convoy or a tree's fat frame can be seen; and its report.md lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.core.errors import ConfigError
from testbed.studies.style import FIGURE_DPI, new_figure
from testbed.launch.trace import laps_of, trace_events

TIMELINE_LAPS: Final = 4  # laps drawn: the first ones past the prompt's
SPAN_COLOURS: Final = {"compute": "tab:blue", "queue": "tab:orange", "frame": "tab:purple", "head": "tab:green",
                       "draft": "tab:olive", "wait": "tab:gray", "hop": "tab:cyan", "serialize": "tab:red"}


@dataclass(frozen=True)
class Timeline:
    """One trace file: its complete events by lap and its tracks' names."""

    source: str
    laps: dict[int, list[dict[str, Any]]]
    names: dict[tuple[int, int], str]  # (pid, tid) -> "stage 1 dublin" or "link 0->1 · stream 2"

    @property
    def tracks(self) -> int:
        return len(self.names)


def parse_timeline(data: Any, source: str) -> Timeline:
    """A trace object (ConfigError naming the source when a complete event lacks what the timeline reads)."""
    events = trace_events(data, source)
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    for i, event in enumerate(events):
        if event.get("ph") == "X" and not {"pid", "tid", "ts", "dur", "args"} <= event.keys():
            raise ConfigError(f"traceEvents[{i}] is a complete event without pid, tid, ts, dur and args",
                              source=source)
    laps = laps_of(events)
    streams = {e["tid"] for lap in laps.values() for e in lap}
    names = {}
    for lap in laps.values():
        for e in lap:
            name = processes.get(e["pid"], f"track {e['pid']}")
            names[e["pid"], e["tid"]] = name + (f" · stream {e['tid']}" if len(streams) > 1 else "")
    return Timeline(source, laps, names)


def drawn_laps(timeline: Timeline) -> list[int]:
    """The laps the figure shows: the first TIMELINE_LAPS that are not a prompt's (else the first ones)."""
    order = sorted(timeline.laps)
    decode = [seq for seq in order if timeline.laps[seq][0]["args"].get("kind") != "prefill"]
    return (decode or order)[:TIMELINE_LAPS]


def plot_timeline(timelines: Sequence[Timeline], path: Path) -> None:
    """The first timeline's drawn laps: one row per track, a bar per span, coloured by what it is."""
    timeline = timelines[0]
    spans = [e for seq in drawn_laps(timeline) for e in timeline.laps[seq]]
    tracks = sorted({(e["pid"], e["tid"]) for e in spans})
    row = {track: i for i, track in enumerate(tracks)}
    t0 = min(e["ts"] for e in spans)
    figure = new_figure((11, 1.2 + 0.42 * len(tracks)))
    ax = figure.subplots()
    seen: set[str] = set()
    for e in spans:
        inner = e["name"] == "serialize"  # drawn inside its hop
        y = row[e["pid"], e["tid"]]
        ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)],
                       (y - (0.18 if inner else 0.38), 0.36 if inner else 0.76),
                       color=SPAN_COLOURS.get(e["name"], "black"), label=None if e["name"] in seen else e["name"])
        seen.add(e["name"])
    ax.set_yticks(range(len(tracks)), [timeline.names[t] for t in tracks])
    ax.invert_yaxis()
    ax.set_xlabel("ms (scenario time) from the first drawn lap")
    ax.set_title(f"{len(drawn_laps(timeline))} laps of {Path(timeline.source).name}")
    ax.legend(loc="upper right", fontsize="small", ncols=4)
    figure.savefig(path, dpi=FIGURE_DPI)


def timeline_markdown(timelines: Sequence[Timeline]) -> list[str]:
    lines = ["| trace | laps | tracks |", "|---|---:|---:|"]
    lines += [f"| {t.source} | {len(t.laps)} | {t.tracks} |" for t in timelines]
    return lines + ["", "Open a trace in Perfetto (ui.perfetto.dev) or chrome://tracing; timeline.png draws "
                        f"{TIMELINE_LAPS} laps of the first one."]
