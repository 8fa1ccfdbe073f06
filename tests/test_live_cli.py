"""The CLI as a user sees it: the live dashboard under a pseudo-terminal, and Prometheus scraping a real run.

All three tests read one run (the `live_run` fixture): geo-ring at scale 0.1, a plain then a speculative
phase, dilated x2, under a pseudo-terminal with its dashboard, scraped by a real Prometheus where one is
installed: one CLI run (two ring startups) and one Prometheus, where each test used to start its own run
(four ring startups) and each Prometheus test its own Prometheus.
"""

import json
import os
import pty
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.test_prometheus_server import free_port, query, start_prometheus, stop_prometheus

pytestmark = pytest.mark.fidelity
RUN_TIMEOUT_S = 180
READER_JOIN_TIMEOUT_S = 10.0
PROMETHEUS_MISSING = "prometheus is not installed (apt-get install prometheus)"
HAVE_PROMETHEUS = shutil.which("prometheus") is not None
DILATION = 2
# One count for both phases (--tokens): enough plain decode for several 5 s rate windows wholly inside it
# (~14 s at x2), and enough speculative rounds (~70, ~6 s) that the 30-draft check lands well before the end.
SCRAPED_TOKENS = 200
DASHBOARD_ONLY_TOKENS = 40  # without Prometheus only the dashboard reads the run: a few seconds of each phase
PHASES = ("plain", "speculative")
POLL_S = 0.5
PLAIN_TOKENS = 'testbed_tokens_total{kind="plain"}'
# rate() over a 5 s window wholly inside the plain phase's decoding: the counter had counted tokens 5 s
# earlier and still grew between the last two scrapes (not the ramp before it, nor the decay after it).
# The counter grows in the box's seconds; times the dilation it is the scenario's rate.
STEADY_PLAIN_RATE = (f"(rate({PLAIN_TOKENS}[5s]) * scalar(testbed_time_dilation))"
                     f" and on() ({PLAIN_TOKENS} offset 5s > 0) and on() (idelta({PLAIN_TOKENS}[3s]) > 0)")


@dataclass
class LiveRun:
    name: str  # the scenario's name, which the dashboard's header shows in every frame
    exit_code: int
    text: str  # everything the CLI wrote to its terminal
    json_dir: Path
    plain_rates: list[float]  # the scenario's plain token rate from Prometheus, each over a steady 5 s window
    empty: list[str] | None  # Grafana expressions without data well into the speculative phase (None: not checked)
    last: dict[str, dict[str, float]]  # p50/p99 -> hop -> the last scraped exact quantile, ms; window -> hop -> laps
    lap_log: Path  # every lap of both phases (--lap-log)


def read_terminal(fd: int, chunks: list[bytes]) -> None:
    """Drain the pseudo-terminal (a full one would block the CLI) until it closes."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return
        if not chunk:
            return
        chunks.append(chunk)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> LiveRun:
    """`testbed run geo-ring --phases plain,speculative --dilation 2` under a pseudo-terminal, watched live."""
    from tests.test_grafana import expressions, load_dashboard

    tmp_path = tmp_path_factory.mktemp("live")
    name = f"live-{os.getpid()}"
    port = free_port()
    tokens = SCRAPED_TOKENS if HAVE_PROMETHEUS else DASHBOARD_ONLY_TOKENS
    argv = [sys.executable, "-m", "testbed", "run", "geo-ring", "--set", f'name="{name}"', "--set", "scale=0.1",
            "--tokens", str(tokens), "--phases", ",".join(PHASES), "--shaper", "userspace",
            "--metrics-port", str(port), "--json", str(tmp_path / "geo.json"), "--dilation", str(DILATION),
            "--lap-log", str(tmp_path / "laps.jsonl")]
    pid, fd = pty.fork()
    if pid == 0:  # child: the CLI, attached to the pseudo-terminal
        os.environ.update(COLUMNS="100", LINES="30", TERM="xterm-256color")
        os.execv(sys.executable, argv)
    chunks: list[bytes] = []
    reader = threading.Thread(target=read_terminal, args=(fd, chunks), name="terminal-reader", daemon=True)
    reader.start()
    status: int | None = None

    def running() -> bool:
        nonlocal status
        if status is None:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wait_status
        return status is None

    prom = None
    rates: list[float] = []
    empty: list[str] | None = None
    last: dict[str, dict[str, float]] = {}
    try:
        if HAVE_PROMETHEUS:
            prom, base_url = start_prometheus([f"127.0.0.1:{port}"], tmp_path)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while running() and time.monotonic() < deadline:
            time.sleep(POLL_S)
            if prom is None:
                continue
            rates += [float(r["value"][1]) for r in query(base_url, STEADY_PLAIN_RATE)]
            drafts = query(base_url, "testbed_spec_decode_num_drafts_total")
            if empty is None and drafts and float(drafts[0]["value"][1]) >= 30:  # well into the speculative phase
                empty = [f"{title}: {expr}" for title, expr in expressions(load_dashboard())
                         if not query(base_url, expr)]
        if prom is not None and not running():  # the last scrape's gauges: one collect made them all
            last = {q: {r["metric"]["hop"]: float(r["value"][1]) * 1e3
                        for r in query(base_url, f"last_over_time(testbed_hop_latency_{q}_seconds[1m])")}
                    for q in ("p50", "p99")}
            last["window"] = {r["metric"]["hop"]: float(r["value"][1])
                              for r in query(base_url, "last_over_time(testbed_hop_latency_window_laps[1m])")}
    finally:
        if prom is not None:
            stop_prometheus(prom)
        if running():  # past the deadline, or a query failed
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        reader.join(timeout=READER_JOIN_TIMEOUT_S)
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    return LiveRun(name, os.waitstatus_to_exitcode(status), text, tmp_path, rates, empty, last, tmp_path / "laps.jsonl")


def test_dashboard_refreshes_under_a_pseudo_terminal(live_run):
    text = live_run.text
    assert live_run.exit_code == 0, text[-3000:]
    # rich Live redraws in place: each refresh moves the cursor back up over the previous frame and
    # draws the whole dashboard again, header (with the scenario name) included
    frames = text.count(live_run.name) - len(PHASES)  # minus the final summary table's row of each phase
    assert frames >= 3 and "\x1b[1A" in text, text[-3000:]  # a first frame and at least two refreshes
    assert "tok/s" in text
    assert "measured vs predicted" in text  # the final summary table


@pytest.mark.skipif(not HAVE_PROMETHEUS, reason=PROMETHEUS_MISSING)
def test_prometheus_scrapes_a_running_testbed(live_run):
    assert live_run.exit_code == 0, live_run.text[-3000:]
    summary = json.loads((live_run.json_dir / "geo-plain.json").read_text())
    measured = summary["measured_tok_s"]
    assert summary["dilation"]["factor"] == DILATION
    rates = live_run.plain_rates
    assert len(rates) >= 3, (rates, live_run.text[-3000:])
    # Prometheus's rate() over the steady middle of the run agrees with the testbed's own figure
    middle = sorted(rates)[len(rates) // 2]
    assert middle == pytest.approx(measured, rel=0.15), (rates, measured)


@pytest.mark.skipif(not HAVE_PROMETHEUS, reason=PROMETHEUS_MISSING)
def test_grafana_hop_latency_quantiles_match_the_runs_own_figures(live_run):
    """Every Grafana expression has data during a run; its exact hop p50/p99 are those of the laps it had (issue 17).

    The last scrape came up to a second before the run's end: its gauges are the quantiles of the speculative phase's
    first `testbed_hop_latency_window_laps` decode laps, and the run's JSON those of all of them (one late slow lap
    moves a p99 over ~70 laps by ms), each recomputed here from the lap log."""
    from testbed.core.lapstats import DECODE_KINDS
    from testbed.launch.runlog import read_lap_log

    assert live_run.exit_code == 0, live_run.text[-3000:]
    assert live_run.empty == [], live_run.empty  # None: the speculative phase was never scraped
    summary = json.loads((live_run.json_dir / "geo-speculative.json").read_text())
    laps = read_lap_log(live_run.lap_log)
    hops = [lap.hop_latencies_s() for lap in laps
            if lap.mode == "speculative" and lap.kind in DECODE_KINDS and len(lap.stamps) > 1]
    last = live_run.last
    for i, hop in enumerate(summary["per_hop"]):
        samples = np.array([h[i] for h in hops]) * 1e3
        n = int(last["window"][hop["hop"]])
        assert 0 < n <= len(samples), (n, len(samples))
        for q, name in ((50, "p50"), (99, "p99")):
            assert last[name][hop["hop"]] == pytest.approx(np.percentile(samples[:n], q), rel=1e-9), (hop, n, last)
            assert hop[f"measured_ms_{name}"] == pytest.approx(np.percentile(samples, q), rel=1e-9), hop
