"""bench, section 7: what an agent costs to start and to hold, forked from the fork server against a fresh process.

One 16-stage ring on the relay, started both ways back to back (`Launcher(fork_server=...)`): each agent's ready
time (from the launcher's request to its "listening" event; for the fork server, after the server itself is
ready, whose preload is shown on its own), and, a few laps in, each agent's unique memory (USS: private clean +
private dirty pages of /proc/PID/smaps_rollup) and proportional share (PSS), next to its RSS, which counts every
shared page in full and so cannot show what sharing saves.
"""

from __future__ import annotations

import time

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from testbed.scenario.config import scenario_from_dict

AGENT_STAGES = 16
READY_TARGET_MS = 100.0  # issue 29: a forked agent ready within 100 ms of the request (p50 over a 16-stage ring)
USS_TARGET_MB = 60.0  # issue 29: each additional agent adds at most this much unique memory
LAPS_BEFORE_SAMPLING = 3


def agent_ring(n_stages: int = AGENT_STAGES):
    return scenario_from_dict({
        "name": f"ring{n_stages}", "model": "target-deep",
        "stages": [{"name": f"s{i}", "compute_ms": 2.0} for i in range(n_stages)],
        "network": {"hops_ms": [1.0] * n_stages}, "decode": {"tokens": 12}}, "<bench>")


def memory_mb(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of `pid` in MB, from /proc/PID/smaps_rollup (kB)."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = float(rest.split()[0]) / 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"],
            "uss": fields.get("Private_Clean", 0.0) + fields.get("Private_Dirty", 0.0)}


async def one_start(fork_server: bool) -> dict:
    """Run the ring once: ready times, memory a few laps in, and the server's preload (fork server only)."""
    from netem.userspace import UserspaceShaper
    from testbed.launch.launcher import Launcher, new_run_id
    from testbed.launch.runlog import RunLog

    scenario = agent_ring()
    shaper = UserspaceShaper(list(scenario.links), scenario.n_stages, new_run_id())
    launcher = Launcher(scenario, shaper, RunLog(scenario), log=lambda m: None, fork_server=fork_server)
    sampled: dict = {}
    started = time.monotonic()

    async def sample() -> None:
        while len(launcher.runlog.laps) < LAPS_BEFORE_SAMPLING:
            await trio.sleep(0.02)
        sampled["agents"] = [memory_mb(handle.process.pid) for handle in launcher.agents]
        if launcher.forks is not None:
            sampled["server"] = memory_mb(launcher.forks.process.pid)
            sampled["preload_s"] = float(launcher.forks.info.get("preload_s", float("nan")))
        sampled["all_ready_s"] = time.monotonic() - started

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        await launcher.run()
    ready_ms = [1e3 * launcher.ready_s[stage] for stage in sorted(launcher.ready_s)]
    return {"fork_server": fork_server, "ready_ms_p50": float(np.percentile(ready_ms, 50)),
            "ready_ms_max": max(ready_ms), "run_s": time.monotonic() - started, **sampled}


def agents_table(console: Console) -> list[dict]:
    rows = [trio.run(one_start, True), trio.run(one_start, False)]
    table = Table(title=f"7. agents: a {AGENT_STAGES}-stage ring started from the fork server and as fresh processes "
                        f"(ready: request -> listening; memory a few laps in, per agent)")
    for col in ("agents", "server preload s", "ready p50 ms", "ready max ms", f"lap {LAPS_BEFORE_SAMPLING} at s", "USS MB mean",
                "PSS MB mean", "RSS MB mean", "server USS MB", f"ready <= {READY_TARGET_MS:g} ms",
                f"USS <= {USS_TARGET_MB:g} MB"):
        table.add_column(col, justify="right")
    for row in rows:
        agents = row["agents"]
        for key in ("uss", "pss", "rss"):
            row[f"{key}_mb_mean"] = float(np.mean([a[key] for a in agents]))
        forked = row["fork_server"]
        table.add_row("forked" if forked else "fresh processes", f"{row['preload_s']:.2f}" if forked else "-",
                      f"{row['ready_ms_p50']:.1f}", f"{row['ready_ms_max']:.1f}", f"{row['all_ready_s']:.1f}",
                      f"{row['uss_mb_mean']:.0f}", f"{row['pss_mb_mean']:.0f}", f"{row['rss_mb_mean']:.0f}",
                      f"{row['server']['uss']:.0f}" if forked else "-",
                      "yes" if row["ready_ms_p50"] <= READY_TARGET_MS else "NO",
                      "yes" if row["uss_mb_mean"] <= USS_TARGET_MB else "NO")
    console.print(table)
    return rows
