"""The CLI as a user sees it: the live dashboard under a pseudo-terminal, and Prometheus scraping a real run."""

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time

import pytest

from tests.test_prometheus_server import free_port, query, start_prometheus, stop_prometheus

pytestmark = pytest.mark.slow
RUN_TIMEOUT_S = 180

SCENARIO = '''name = "live-{token}"
[[stages]]
name = "a"
compute_ms = 3
[[stages]]
name = "b"
compute_ms = 3
[[stages]]
name = "c"
compute_ms = 3
[network]
hops_ms = [5, 5, 6]
[decode]
tokens = {tokens}
'''


def write_scenario(tmp_path, tokens):
    path = tmp_path / "live.toml"
    path.write_text(SCENARIO.format(token=os.getpid(), tokens=tokens))
    return path


def test_dashboard_refreshes_under_a_pseudo_terminal(tmp_path):
    scenario = write_scenario(tmp_path, tokens=120)  # ~3 s of decoding at ~40 tok/s
    pid, fd = pty.fork()
    if pid == 0:  # child: the CLI, attached to the pseudo-terminal
        os.environ.update(COLUMNS="100", LINES="30", TERM="xterm-256color")
        os.execv(sys.executable, [sys.executable, "-m", "testbed", "run", str(scenario), "--shaper", "userspace",
                                  "--metrics-port", "0", "--dilation", "1"])
    output = b""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = output.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-3000:]
    # rich Live redraws in place: each refresh moves the cursor back up over the previous frame and
    # draws the whole dashboard again, header (with the scenario name) included
    frames = text.count(f"live-{os.getpid()}") - 1  # minus the final summary table's row
    assert frames >= 3 and "\x1b[1A" in text, text[-3000:]  # a first frame and at least two refreshes
    assert "tok/s" in text
    assert "measured vs predicted" in text  # the final summary table


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed (apt-get install prometheus)")
def test_prometheus_scrapes_a_running_testbed(tmp_path):
    scenario = write_scenario(tmp_path, tokens=350)  # ~17 s at ~40 tok/s, dilated x2
    port = free_port()
    out = tmp_path / "summary.json"
    run = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(scenario), "--shaper", "userspace",
                            "--no-dashboard", "--metrics-port", str(port), "--json", str(out), "--dilation", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prom, base_url = start_prometheus([f"127.0.0.1:{port}"], tmp_path)
    try:
        rates = []
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while run.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            # the counter grows in the box's seconds; times the dilation it is the scenario's rate
            result = query(base_url, 'rate(testbed_tokens_total{kind="plain"}[5s]) * scalar(testbed_time_dilation)')
            if result and float(result[0]["value"][1]) > 0:
                rates.append(float(result[0]["value"][1]))
        output, _ = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        run.kill()
        stop_prometheus(prom)
    assert run.returncode == 0, output
    summary = json.loads(out.read_text())
    measured = summary["measured_tok_s"]
    assert summary["dilation"]["factor"] == 2
    assert len(rates) >= 3, (rates, output)
    # Prometheus's rate() over the steady middle of the run agrees with the testbed's own figure
    middle = sorted(rates)[len(rates) // 2]
    assert middle == pytest.approx(measured, rel=0.15), (rates, measured)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed (apt-get install prometheus)")
def test_grafana_hop_latency_quantiles_match_the_runs_own_figures(tmp_path):
    """Every Grafana expression has data during a run; its hop p50/p99 agree with the run's JSON (issue 17)."""
    from tests.test_grafana import expressions, load_dashboard

    port = free_port()
    out = tmp_path / "geo.json"
    run = subprocess.Popen([sys.executable, "-m", "testbed", "run", "geo-ring", "--shaper", "userspace",
                            "--set", "scale=0.1", "--tokens", "500", "--phases", "plain,speculative",
                            "--no-dashboard", "--metrics-port", str(port), "--json", str(out), "--dilation", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prom, base_url = start_prometheus([f"127.0.0.1:{port}"], tmp_path)
    empty: list[str] | None = None
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while run.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            drafts = query(base_url, "testbed_spec_decode_num_drafts_total")
            if empty is None and drafts and float(drafts[0]["value"][1]) >= 30:  # well into the speculative phase
                empty = [f"{title}: {expr}" for title, expr in expressions(load_dashboard()) if not query(base_url, expr)]
        output, _ = run.communicate(timeout=RUN_TIMEOUT_S)
        last = {name: {r["metric"]["hop"]: float(r["value"][1]) * 1e3
                       for r in query(base_url, f"last_over_time(testbed_hop_latency_{name}_seconds[1m])")}
                for name in ("p50", "p99")}
    finally:
        run.kill()
        stop_prometheus(prom)
    assert run.returncode == 0, output
    assert empty == [], empty  # None: the speculative phase was never scraped
    summary = json.loads((tmp_path / "geo-speculative.json").read_text())
    for hop in summary["per_hop"]:
        assert last["p50"][hop["hop"]] == pytest.approx(hop["measured_ms_p50"], abs=0.5), (hop, last)
        assert last["p99"][hop["hop"]] == pytest.approx(hop["measured_ms_p99"], abs=2.0), (hop, last)
