"""bench, section 6: the soak: 10,000 laps of a fast (scaled) ring, the launcher's, the relay's and every agent's RSS
sampled from /proc, the live dashboard's and a Prometheus scrape's cost timed: memory flat, rate stable.

The launcher runs here, in this process, as `python -m testbed run` runs it: a summary for the dashboard and a
scrape every DASHBOARD_INTERVAL_S. RSS is fitted against laps after a warm-up (allocators settle, caches fill, and
the run log's window of recent laps fills: runlog.LAP_WINDOW). From there the launcher keeps running totals and a
token id per lap, so its RSS is flat: what one record costs is measured on its own (while the window fills, the
records are the launcher's growth by design), and the launcher's gc-tracked objects are counted beyond the records,
so that neither is a leak mistaken for the records' growth nor the other way round.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import os
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import trio
from rich.console import Console

from testbed.scenario.config import Scenario, load_scenario
from testbed.core.errors import TestbedError
from testbed.core.records import LapRecord

if TYPE_CHECKING:
    from testbed.launch.runlog import RunLog

SOAK_LAPS = 10_000
SOAK_LAPS_QUICK = 1_000
SOAK_SCALE = 0.01  # the geo ring at 1/100: hops 1.3 / 0.4 / 1.1 ms, 11 ms of emulated compute per stage -> 0.11 ms
SAMPLE_INTERVAL_S = 0.2
DASHBOARD_INTERVAL_S = 0.5  # dashboards.live.DEFAULT_INTERVAL_S: the live dashboard summarizes the run this often
WARMUP_FRACTION = 0.1  # memory slopes are fitted over the laps after this share of the run (and the window's fill)
WINDOW_FILL_MARGIN = 1.1  # the warm-up lasts at least this many run log windows (prefill laps share the window)
FOOTPRINT_END = 0.95  # the launcher's heap is counted after the warm-up and at this share of the run
PER_RECORD_SAMPLE = 200  # lap records measured to find what one retains
RUN_TIMEOUT_S = 1800.0
LAUNCHER = "launcher"


@dataclass(frozen=True)
class Sample:
    """One look at the run: its counters so far and every process's resident memory."""

    at_s: float
    laps: int  # decode laps so far
    tokens: int
    wall_s: float  # sum of decode-lap durations so far: tokens / wall_s is the run's measured rate
    rss_mb: dict[str, float]  # process -> VmRSS


@dataclass(frozen=True)
class ProcessMemory:
    name: str
    start_mb: float  # at the first decode lap
    warm_mb: float  # at the end of the warm-up (SoakResult.warm_laps)
    middle_mb: float
    end_mb: float  # at FOOTPRINT_END of the run (after it, the final summary and teardown)
    slope_mb_per_1000: float  # least-squares fit of RSS against laps, from the warm-up to FOOTPRINT_END


@dataclass(frozen=True)
class SoakResult:
    laps: int
    tokens: int
    run_s: float
    warm_laps: int  # the end of the warm-up: memory is fitted from here to FOOTPRINT_END of the run
    end_laps: int
    predicted_tok_s: float | None
    first_tenth_tok_s: float
    last_tenth_tok_s: float
    tenth_tok_s: tuple[float, ...]  # the rate in each tenth of the run, in order
    lap_ms_drift_per_1000: float  # least-squares slope of the mean lap time against laps: a per-lap cost that grows
    lap_ms_drift_stderr: float  # its standard error, from the tenths (the box's noise moves a tenth's rate 10-20%)
    memory: tuple[ProcessMemory, ...]
    lap_log_mb_per_1000: float  # what the run log's lap records and token ids retain, per 1000 laps
    launcher_objects_per_1000: float  # gc-tracked objects the launcher gained beyond its lap records, per 1000 laps
    summarize_ms: tuple[float, float]  # one dashboard summary a tenth into the run / near its end (CPU time)
    scrape_ms: tuple[float, float]  # one Prometheus scrape, likewise

    def process(self, name: str) -> ProcessMemory:
        return next(m for m in self.memory if m.name == name)

    @property
    def launcher_growth_mb(self) -> float:
        """What the launcher's RSS grew by between warm_laps and end_laps."""
        launcher = self.process(LAUNCHER)
        return launcher.end_mb - launcher.warm_mb

    @property
    def launcher_unexplained_mb_per_1000(self) -> float:
        """The launcher's RSS growth beyond what its lap log retains (the allocator's share, or a leak)."""
        return self.process(LAUNCHER).slope_mb_per_1000 - self.lap_log_mb_per_1000

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"launcher_unexplained_mb_per_1000": self.launcher_unexplained_mb_per_1000,
                                           "launcher_growth_mb": self.launcher_growth_mb}


def soak_scenario(laps: int) -> Scenario:
    """The geo ring, scaled down to a fast ring, plain decode for `laps` tokens (one lap each)."""
    return load_scenario("geo-ring", [f"scale={SOAK_SCALE}", "decode.mode=\"plain\"", f"decode.tokens={laps}"])


def rss_mb(pid: int) -> float | None:
    """VmRSS of a process, None once it is gone (a zombie has none)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


FORK_SERVER = "fork server"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:  # fields after "(comm)": state, ppid, ...
                found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class RecordCost:
    """What the launcher keeps for one lap: its LapRecord (and the two list slots it and its token id take)."""

    bytes: int  # traced by tracemalloc while records are rebuilt from JSON as the launcher builds them
    tracked: int  # gc-tracked objects: what len(gc.get_objects()) counts

    @classmethod
    def of(cls, records: list[LapRecord]) -> "RecordCost":
        lines = [json.dumps(r.to_dict()) for r in records]
        gc.collect()
        before = len(gc.get_objects())
        tracemalloc.start()
        rebuilt = [LapRecord.from_dict(json.loads(line)).time_scaled(1.0) for line in lines]
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        gc.collect()
        tracked = len(gc.get_objects()) - before - 1  # less the list holding them
        size -= sys.getsizeof(rebuilt)
        return cls(size // len(rebuilt) + 2 * 8, round(tracked / len(rebuilt)))


def tracked_in(samples: list[Sample], costs: list) -> int:
    return sum(gc.is_tracked(s) + gc.is_tracked(s.rss_mb) for s in samples) + sum(map(gc.is_tracked, costs))


@dataclass(frozen=True)
class Footprint:
    """The launcher's Python heap at one moment, after a full collection. Cheap in memory (the count's list of
    references is all it allocates): walking the whole run log here would lift the RSS being measured."""

    laps: int
    lap_records: int  # len(runlog.laps): the window's records
    objects: int  # every gc-tracked object in the process
    own: int  # of them, this soak's own samples

    @classmethod
    def now(cls, runlog: "RunLog", samples: list[Sample], costs: list) -> "Footprint":
        gc.collect()
        return cls(runlog.decode_laps, len(runlog.laps), len(gc.get_objects()), tracked_in(samples, costs))


def beyond_the_lap_log(warm: Footprint, end: Footprint, per_record: RecordCost) -> float:
    """gc-tracked objects the launcher gained between two footprints beyond its lap records and the soak's samples
    (every other part of the run log is bounded, and holds floats, which the collector does not track)."""
    records = (end.lap_records - warm.lap_records) * per_record.tracked
    return (end.objects - warm.objects) - records - (end.own - warm.own)


def fit_slope(samples: list[Sample], name: str) -> float:
    points = [(s.laps, s.rss_mb[name]) for s in samples if name in s.rss_mb]
    if len(points) < 3:
        return float("nan")
    laps, mb = np.array(points).T
    return float(np.polyfit(laps, mb, 1)[0]) * 1000


def nearest(samples: list[Sample], laps: float) -> Sample:
    return min(samples, key=lambda s: abs(s.laps - laps))


def per_1000(amount: float, laps: int) -> float:
    return amount / laps * 1000 if laps > 0 else float("nan")


def rate_between(a: Sample, b: Sample) -> float:
    return (b.tokens - a.tokens) / (b.wall_s - a.wall_s) if b.wall_s > a.wall_s else float("nan")


def stretches(running: list[Sample], laps: int, blocks: int = 10) -> list[tuple[Sample, Sample]]:
    """The run cut into `blocks` stretches of about laps / blocks laps: (first sample, last sample) of each."""
    bounds = [running[0], *(nearest(running, laps * i / blocks) for i in range(1, blocks)), running[-1]]
    return list(zip(bounds, bounds[1:]))


def lap_time_drift(running: list[Sample], blocks: int = 10) -> tuple[float, float]:
    """Slope of the mean lap time (ms) against laps, per 1000 laps, and its standard error, fitted over `blocks`
    stretches of the run: the box's noise comes in phases of seconds (steal bursts), so a fit over every sample
    would understate the error many times over (a 10,000-lap soak here: +0.11 +- 0.01 by samples, while a
    6,000-lap run fitted the same way gave -0.41 +- 0.04)."""
    points = [((a.laps + b.laps) / 2, (b.wall_s - a.wall_s) / (b.laps - a.laps) * 1e3)
              for a, b in stretches(running, running[-1].laps, blocks) if b.laps > a.laps]
    if len(points) < 4:
        return float("nan"), float("nan")
    laps, lap_ms = np.array(points).T
    (slope, _), cov = np.polyfit(laps, lap_ms, 1, cov=True)
    return float(slope) * 1000, float(np.sqrt(cov[0, 0])) * 1000


def analyse(samples: list[Sample], costs: list[tuple[int, float, float]], laps: int, run_s: float,
            predicted_tok_s: float | None, per_record: RecordCost, warm: Footprint, end: Footprint) -> SoakResult:
    """per_record: what one lap record retains (it and its token id); warm, end: the footprints, whose laps bound
    the window every memory slope is fitted over."""
    running = [s for s in samples if s.laps >= 1]
    names = sorted({name for s in running for name in s.rss_mb}, key=lambda n: (n != LAUNCHER, n))
    memory = []
    for name in names:
        have = [s for s in running if name in s.rss_mb]
        window = [s for s in have if warm.laps <= s.laps < end.laps]
        memory.append(ProcessMemory(name, have[0].rss_mb[name], window[0].rss_mb[name] if window else float("nan"),
                                    nearest(have, laps / 2).rss_mb[name],
                                    window[-1].rss_mb[name] if window else float("nan"), fit_slope(window, name)))
    first, last = running[0], running[-1]

    def cost_near(fraction: float, column: int) -> float:
        return min(costs, key=lambda c: abs(c[0] - fraction * laps))[column] * 1e3 if costs else float("nan")

    grown = end.laps - warm.laps
    records_per_lap = (end.lap_records - warm.lap_records) / grown if grown else float("nan")
    return SoakResult(laps, last.tokens, run_s, warm.laps, end.laps, predicted_tok_s,
                      rate_between(first, nearest(running, laps / 10)),
                      rate_between(nearest(running, laps * 0.9), last),
                      tuple(rate_between(a, b) for a, b in stretches(running, laps)),
                      *lap_time_drift(running), tuple(memory), per_record.bytes * records_per_lap * 1000 / 2**20,
                      per_1000(beyond_the_lap_log(warm, end, per_record), grown),
                      (cost_near(0.1, 1), cost_near(0.95, 1)), (cost_near(0.1, 2), cost_near(0.95, 2)))


def warmup_laps(laps: int, warmup_fraction: float, window_laps: int) -> float:
    """Where the fitted stretch starts: after warmup_fraction of the run and the run log's window filled (unless
    the window takes half the run: then the records' growth is measured as such)."""
    filled = WINDOW_FILL_MARGIN * window_laps
    return max(warmup_fraction * laps, filled) if filled < 0.5 * laps else warmup_fraction * laps


def run_pids(launcher) -> dict[str, int]:
    """The processes of a run by name: this launcher, its agents, the fork server, the relay."""
    me = os.getpid()
    pids = {LAUNCHER: me} | {handle.name: handle.process.pid for handle in launcher.agents}
    if launcher.forks is not None:  # the agents' parent (agents.forkserver): its pages are theirs too
        pids[FORK_SERVER] = launcher.forks.process.pid
    for child in children_of(me):
        if child not in pids.values() and "relay" not in pids:
            pids["relay"] = child
    return pids


async def soak(laps: int = SOAK_LAPS, *, warmup_fraction: float = WARMUP_FRACTION, window_laps: int | None = None,
               log: Callable[[str], None] = lambda message: None) -> SoakResult:
    """Run the soak ring for `laps` decode laps in this process and measure it (userspace relay, no dilation).

    window_laps: the run log's window (default runlog.LAP_WINDOW)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from testbed.launch.collector import RunCollector
    from testbed.launch.launcher import Launcher, prepare
    from testbed.launch.runlog import LAP_WINDOW, RunLog
    from testbed.launch.summarize import summarize

    window_laps = window_laps or LAP_WINDOW
    warm_at = warmup_laps(laps, warmup_fraction, window_laps)
    scenario = soak_scenario(laps)
    shaper, dilation = await prepare(scenario, "userspace", dilation=1.0, log=log)
    runlog = RunLog(scenario, window_laps=window_laps)
    launcher = Launcher(scenario, shaper, runlog, log=log, dilation=dilation)
    samples: list[Sample] = []
    costs: list[tuple[int, float, float]] = []  # (laps, summarize CPU s, scrape CPU s)
    # after the warm-up, then near the end, both while the ring runs (after it, its tasks and buffers are gone)
    footprints: list[Footprint] = []

    async def sample_memory() -> None:
        while True:
            rss = {name: mb for name, pid in run_pids(launcher).items() if (mb := rss_mb(pid)) is not None}
            samples.append(Sample(time.monotonic(), runlog.decode_laps, runlog.decode_tokens, runlog.decode_wall_s,
                                  rss))
            await trio.sleep(SAMPLE_INTERVAL_S)

    async def dashboard_and_scrape() -> None:
        registry = CollectorRegistry()
        registry.register(RunCollector(lambda: [runlog]))
        while True:
            if runlog.decode_laps:
                started = time.process_time()
                summarize(runlog)
                summarized = time.process_time()
                generate_latest(registry)
                costs.append((runlog.decode_laps, summarized - started, time.process_time() - summarized))
            if len(footprints) < 2 and runlog.decode_laps >= (warm_at, FOOTPRINT_END * laps)[len(footprints)]:
                footprints.append(Footprint.now(runlog, samples, costs))
            await trio.sleep(DASHBOARD_INTERVAL_S)

    started = time.monotonic()
    with trio.fail_after(RUN_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_memory)
            nursery.start_soon(dashboard_and_scrape)
            summary = await launcher.run()
            nursery.cancel_scope.cancel()
    run_s = time.monotonic() - started
    if len(footprints) < 2:
        raise TestbedError(f"the soak ended after {runlog.decode_laps} decode laps of {laps}")
    per_record = RecordCost.of(list(itertools.islice(reversed(runlog.laps), PER_RECORD_SAMPLE)))
    return analyse(samples, costs, summary.laps, run_s, summary.predicted_tok_s, per_record, *footprints)


def soak_line(console: Console, quick: bool) -> dict:
    """The bench's soak line: RSS at start / middle / end and its slope per process, the rate at both ends."""
    laps = SOAK_LAPS_QUICK if quick else SOAK_LAPS
    console.print(f"6. soak: {laps:,} laps of the geo ring scaled by {SOAK_SCALE:g} (userspace relay, the dashboard's "
                  f"summary and a scrape every {DASHBOARD_INTERVAL_S:g} s)...")
    result = trio.run(lambda: soak(laps))
    for line in soak_report(result):
        console.print(line, markup=False, highlight=False)
    return result.to_dict()


def soak_report(r: SoakResult) -> list[str]:
    memory = "; ".join(f"{m.name} {m.start_mb:.0f}/{m.middle_mb:.0f}/{m.end_mb:.0f} MB ({m.slope_mb_per_1000:+.3f})"
                       for m in r.memory)
    predicted = f" (predicted {r.predicted_tok_s:.1f})" if r.predicted_tok_s else ""
    tenths = " ".join(f"{rate:.0f}" for rate in r.tenth_tok_s)
    lap_ms = r.run_s / r.laps * 1e3 if r.laps else float("nan")
    return [f"soak: {r.laps:,} laps in {r.run_s:.0f} s; rate {r.first_tenth_tok_s:.1f} tok/s in the first tenth, "
            f"{r.last_tenth_tok_s:.1f} in the last{predicted}; RSS start/middle/end (slope MB per 1000 laps): {memory}",
            f"soak: launcher RSS {r.process(LAUNCHER).warm_mb:.1f} -> {r.process(LAUNCHER).end_mb:.1f} MB from lap "
            f"{r.warm_laps:,} to lap {r.end_laps:,} ({r.launcher_growth_mb:+.2f} MB); "
            f"the run log's lap records retain {r.lap_log_mb_per_1000:.3f} MB per 1000 laps; beyond them the "
            f"launcher grew {r.launcher_unexplained_mb_per_1000:+.3f} MB and {r.launcher_objects_per_1000:+.0f} "
            f"objects per 1000 laps; CPU of one dashboard summary {r.summarize_ms[0]:.1f} -> {r.summarize_ms[1]:.1f} "
            f"ms, "
            f"of one scrape {r.scrape_ms[0]:.1f} -> {r.scrape_ms[1]:.1f} ms (a tenth in -> the end)",
            f"soak: rate by tenth of the run {tenths} tok/s; lap time drift over the tenths "
            f"{r.lap_ms_drift_per_1000:+.3f} +- {r.lap_ms_drift_stderr:.3f} ms per 1000 laps (a lap ~{lap_ms:.1f} ms: a per-lap cost growing with the "
            f"laps shows here as a steady slope, the box's noise as scatter)"]
