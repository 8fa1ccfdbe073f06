"""Bench section 4: the launcher's CPU time per lap (control line -> LapRecord -> run log) and per scrape, at two
run-log sizes, which must be the same (O(1) per lap)."""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.table import Table

from testbed.scenario.config import load_scenario


LAUNCHER_LOG_SIZES = (100, 10_000)  # laps already in the run log when the launcher's per-lap cost is measured

LAUNCHER_MEASURED_LAPS = 100


def synthetic_lap_line(scenario, lap: int) -> bytes:
    """A control line as the entry agent sends it: one decode lap of `scenario`, with plausible stamps."""
    from testbed.core.channel import encode_line
    from testbed.core.records import HeadTiming, LapRecord, Stamp

    t = lap * 0.05
    stamps = tuple(Stamp(i, t + i * 0.01, t + i * 0.01, t + i * 0.01 + 0.001, t + i * 0.01 + 0.004,
                         t + i * 0.01 + 0.004, 612) for i in range(scenario.n_stages))
    record = LapRecord(lap, "decode", "plain", 1, 1, t, t + 0.05, stamps, t + 0.049, HeadTiming(t + 0.049, t + 0.0495,
                                                                                                   t + 0.05), (65,))
    return encode_line({"event": "lap", "record": record.to_dict()})


def launcher_cost_per_lap_us(log_size: int) -> tuple[float, float]:
    """CPU time the launcher spends per lap (control line -> LapRecord -> run log) with `log_size` laps already
    logged, and one Prometheus scrape of the collector at that size; both in microseconds."""
    from prometheus_client import CollectorRegistry, generate_latest

    from testbed.launch.collector import RunCollector
    from testbed.core.records import LapRecord
    from testbed.launch.runlog import RunLog

    scenario = load_scenario("geo-ring")
    log = RunLog(scenario)
    lines = [synthetic_lap_line(scenario, i) for i in range(log_size + LAUNCHER_MEASURED_LAPS)]
    for line in lines[:log_size]:
        log.add_lap(LapRecord.from_dict(json.loads(line)["record"]))
    start = time.process_time()
    for line in lines[log_size:]:
        log.add_lap(LapRecord.from_dict(json.loads(line)["record"]))
    per_lap = (time.process_time() - start) / LAUNCHER_MEASURED_LAPS
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    generate_latest(registry)  # warm-up: the first scrape pays one-time imports
    start = time.process_time()
    generate_latest(registry)
    return per_lap * 1e6, (time.process_time() - start) * 1e6


def launcher_cost_table(console: Console) -> list[dict]:
    rows = []
    table = Table(title="4. launcher CPU time per lap (control line -> LapRecord -> run log), and one scrape")
    for col in ("laps already logged", "us per lap", "us per scrape"):
        table.add_column(col, justify="right")
    for size in LAUNCHER_LOG_SIZES:
        per_lap_us, scrape_us = launcher_cost_per_lap_us(size)
        rows.append({"laps_logged": size, "cpu_us_per_lap": per_lap_us, "cpu_us_per_scrape": scrape_us})
        table.add_row(f"{size:,}", f"{per_lap_us:.1f}", f"{scrape_us:.0f}")
    ratio = rows[-1]["cpu_us_per_lap"] / rows[0]["cpu_us_per_lap"]
    table.caption = f"per-lap cost at {LAUNCHER_LOG_SIZES[-1]:,} / at {LAUNCHER_LOG_SIZES[0]} laps = {ratio:.2f}x (O(1): ~1x)"
    console.print(table)
    return rows
