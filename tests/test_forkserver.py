"""The fork server (agents.forkserver): agents forked from one process that loaded the weights, sharing them, and
every exit path still reported and clean: a killed agent, a killed fork server, a killed launcher.

The kernel backend's forked agents (setns into their namespaces) are exercised by the netem tier
(tests/test_netem_cleanup.py and every netem ring, which start their agents the same way).
"""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import trio

from agents.forkserver import UNKNOWN_STATUS
from agents.forkserver.client import ForkServer
from netem.userspace import UserspaceShaper
from tests.procutil import cmdline, parent_of, running
from tests.ringutil import ring_scenario
from testbed.core.errors import AgentFailed, leaf_errors
from testbed.launch.launcher import Launcher, new_run_id
from testbed.launch.runlog import RunLog
from testbed.studies.bench.agents import memory_mb

pytestmark = pytest.mark.fidelity
RUN_TIMEOUT_S = 120
GONE_TIMEOUT_S = 15.0


def launcher_for(scenario, **kwargs) -> Launcher:
    shaper = UserspaceShaper(list(scenario.links), scenario.n_stages, new_run_id())
    return Launcher(scenario, shaper, RunLog(scenario), log=lambda m: None, **kwargs)


async def run_until_laps(launcher: Launcher, laps: int, then) -> BaseException | None:
    """Run `launcher`, call then() once `laps` laps are in; the run's error (None: it ended normally)."""
    async def watch() -> None:
        while len(launcher.runlog.laps) < laps:
            await trio.sleep(0.02)
        then()

    try:
        with trio.fail_after(RUN_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await launcher.run()
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return exc
    return None


async def test_agents_are_forked_by_one_server_share_its_weights_and_carry_their_titles():
    scenario = ring_scenario([1.0, 1.0, 1.0], compute_ms=2.0, tokens=30)
    launcher = launcher_for(scenario)
    seen: dict = {}

    def look() -> None:
        server = launcher.forks.process.pid
        seen["server"] = server
        seen["parents"] = [parent_of(h.process.pid) for h in launcher.agents]
        seen["titles"] = [cmdline(h.process.pid) for h in launcher.agents]
        seen["server_title"] = cmdline(server)
        seen["memory"] = [memory_mb(h.process.pid) for h in launcher.agents]

    assert await run_until_laps(launcher, 3, look) is None
    assert seen["parents"] == [seen["server"]] * 3
    run_id = launcher.shaper.run_id
    assert seen["titles"] == [f"geo-ring agent {i} s{i} (run {run_id})" for i in range(3)]
    assert seen["server_title"] == f"geo-ring fork server (run {run_id})"
    for memory in seen["memory"]:  # torch and the weights are the server's pages, shared: most of RSS is not unique
        assert memory["uss"] < 0.5 * memory["rss"], memory
    assert [h.process.poll() for h in launcher.agents] == [0, 0, 0]
    assert not running(seen["server"])
    assert sorted(launcher.ready_s) == [0, 1, 2]


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "fresh-process"])
async def test_a_killed_agent_is_reported_by_its_signal_either_way(fork_server):
    scenario = ring_scenario([1.0, 1.0, 1.0], compute_ms=2.0, tokens=100_000)
    launcher = launcher_for(scenario, fork_server=fork_server)
    error = await run_until_laps(launcher, 5, lambda: launcher.agents[1].process.kill())
    failures = [str(e) for e in leaf_errors(error) if isinstance(e, AgentFailed)]
    assert failures == ["agent 1 (s1) failed: killed by signal 9"]
    statuses = [h.process.poll() for h in launcher.agents]
    assert statuses[1] == -signal.SIGKILL and None not in statuses  # every agent reaped, its status known
    assert (launcher.forks is not None) == fork_server
    if fork_server:
        assert not running(launcher.forks.process.pid)


async def test_a_killed_fork_server_fails_the_run_by_name_and_its_orphans_are_stopped():
    scenario = ring_scenario([1.0, 1.0, 1.0], compute_ms=2.0, tokens=100_000)
    launcher = launcher_for(scenario)
    pids: list[int] = []

    def kill_server() -> None:
        pids.extend(h.process.pid for h in launcher.agents)
        os.kill(launcher.forks.process.pid, signal.SIGKILL)

    error = await run_until_laps(launcher, 5, kill_server)
    failures = [str(e) for e in leaf_errors(error) if isinstance(e, AgentFailed)]
    assert failures == ["agent fork server failed: died (killed by signal 9)"]
    assert [h.process.poll() for h in launcher.agents] == [UNKNOWN_STATUS] * 3  # init reaped them, not the server
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in pids)
    assert launcher.shaper._process is None  # the relay was stopped too


def test_a_killed_launcher_takes_its_fork_server_and_agents_with_it(tmp_path):
    token = uuid.uuid4().hex[:10]
    scenario = tmp_path / "long.toml"
    scenario.write_text(f'name = "long"\n\n[[stages]]\nname = "a{token}"\ncompute_ms = 2\n\n[[stages]]\n'
                        f'name = "b{token}"\ncompute_ms = 2\n\n[network]\nhops_ms = [2, 2]\n\n'
                        f'[decode]\ntokens = 100000\n')
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(scenario), "--shaper", "userspace",
                             "--no-dashboard", "--metrics-port", "0"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        agents: list[int] = []
        while len(agents) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            out = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout
            agents = [int(p) for p in out.split()]
        assert len(agents) == 2, "the agents did not start"
        servers = {parent_of(pid) for pid in agents}
        assert len(servers) == 1 and servers != {proc.pid}
        assert cmdline(next(iter(servers))).startswith("geo-ring fork server (run ")
    finally:
        proc.kill()
        proc.wait()
    # the agents see EOF on stdin (only the launcher held its write end), the server EOF on its socket
    deadline = time.monotonic() + GONE_TIMEOUT_S
    left = agents + list(servers)
    while any(running(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in left if running(pid)] == []


async def test_a_server_that_has_threads_refuses_to_fork(monkeypatch):
    """numpy's OpenBLAS starts a worker thread at import unless OPENBLAS_NUM_THREADS=1: a child forked then would
    lack it. The server counts its threads and says so instead of forking."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("OpenBLAS starts no worker thread on one CPU")
    monkeypatch.setattr("agents.forkserver.client.SINGLE_THREAD_ENV", {"OPENBLAS_NUM_THREADS": "2"})
    spec = launcher_for(ring_scenario([1.0, 1.0], compute_ms=2.0)).agent_specs(4)[0]
    with trio.fail_after(RUN_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server = await ForkServer.start(nursery, [], timeout_s=RUN_TIMEOUT_S)
            with pytest.raises(AgentFailed, match=r"the fork server has 2 threads; a forked agent would lack 1"):
                await server.spawn(spec.to_json())
            await server.aclose(1.0)
    assert server.process.returncode == 0


async def test_a_run_cancelled_from_outside_still_reaps_every_agent_and_the_server():
    """Cancelled from outside (Ctrl-C in the API, a caller's deadline, another node's failure), the run's nursery is
    cancelled while its teardown waits for the agents' exits, which arrive from the server's reader: that reader
    must outlive the cancellation (a teardown that hung here once)."""
    scenario = ring_scenario([1.0, 1.0, 1.0], compute_ms=2.0, tokens=100_000)
    launcher = launcher_for(scenario)
    with trio.fail_after(RUN_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            async def cancel_after_some_laps() -> None:
                while len(launcher.runlog.laps) < 5:
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()

            nursery.start_soon(cancel_after_some_laps)
            await launcher.run()
    assert None not in [h.process.poll() for h in launcher.agents]
    assert launcher.forks is not None and not running(launcher.forks.process.pid)
