"""Every exit path tears everything down: a crashed agent, Ctrl-C, bad input; a bad frame harms no one."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import trio

from agents.process import wire
from netem.userspace import UserspaceShaper
from tests.ringutil import ring_scenario
from testbed.core.errors import AgentFailed, leaf_errors
from testbed.launch.runlog import RunLog
from testbed.launch.launcher import Launcher, new_run_id

pytestmark = pytest.mark.fidelity
TEARDOWN_LIMIT_S = 2.0


def processes_matching(token: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", token], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def launcher_for(scenario):
    shaper = UserspaceShaper(list(scenario.links), scenario.n_stages, new_run_id())
    return Launcher(scenario, shaper, RunLog(scenario), log=lambda m: None)


async def test_crashed_agent_fails_the_run_and_everything_is_reaped():
    scenario = ring_scenario([2.0, 2.0, 2.0], compute_ms=2.0, tokens=100_000)
    launcher = launcher_for(scenario)

    async def kill_middle_agent_after_some_laps():
        while len(launcher.runlog.laps) < 5:
            await trio.sleep(0.05)
        launcher.agents[1].process.kill()

    with trio.fail_after(120):
        with pytest.raises(BaseException) as info:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_middle_agent_after_some_laps)
                await launcher.run()
        died_at = time.monotonic()
    failures = [e for e in leaf_errors(info.value) if isinstance(e, AgentFailed)]
    assert [str(e) for e in failures] == ["agent 1 (s1) failed: killed by signal 9"]
    assert all(handle.process.poll() is not None for handle in launcher.agents)
    assert launcher.shaper._process is None  # the relay process was stopped and reaped
    assert time.monotonic() - died_at < TEARDOWN_LIMIT_S


async def test_malformed_frame_closes_only_that_connection():
    scenario = ring_scenario([1.0, 1.0, 1.0], compute_ms=2.0, tokens=60)
    launcher = launcher_for(scenario)

    async def send_garbage_to_stage_1():
        while 1 not in launcher.listen or len(launcher.runlog.laps) < 3:
            await trio.sleep(0.02)
        for garbage in (b"NOPE" * 40, wire.HEADER.pack(wire.MAGIC, wire.VERSION, 1, 1, 1, 0, 0, 0, 0,
                                                        1 << 30, 0, 0, 0, 0, 0, 1 << 31, 0)):
            stream = await trio.open_tcp_stream(*launcher.listen[1])
            await stream.send_all(garbage)
            assert await stream.receive_some() == b""  # the agent closed this connection
            await stream.aclose()

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_garbage_to_stage_1)
            summary = await launcher.run()
    assert summary.tokens == 59  # the ring kept decoding
    logs = "\n".join(launcher.agents[1].stderr_tail)
    assert "malformed frame: bad magic" in logs and "has a dimension over" in logs


def test_ctrl_c_tears_down_within_two_seconds(tmp_path):
    token = uuid.uuid4().hex[:10]
    scenario = tmp_path / "long.toml"
    scenario.write_text(f'''name = "long"
[[stages]]
name = "a{token}"
compute_ms = 2
[[stages]]
name = "b{token}"
compute_ms = 2
[network]
hops_ms = [2, 2]
[decode]
tokens = 100000
''')
    # Ctrl-C as a terminal delivers it: a suite started in the background of a script (bash ignores SIGINT in its
    # asynchronous commands: SIG_IGN is inherited, and Python then leaves it ignored) must not make it a no-op
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(scenario), "--shaper", "userspace",
                             "--no-dashboard", "--metrics-port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while len(processes_matching(token)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # let it decode a while
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # say where it hangs (testbed.__main__: SIGUSR1 dumps every thread)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            proc.kill()
            output, _ = proc.communicate()
            pytest.fail(f"the launcher did not exit within 10 s of Ctrl-C; where it was:\n{output[-6000:]}")
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output
    assert elapsed < TEARDOWN_LIMIT_S + 1.0  # + interpreter exit
    assert processes_matching(token) == []


@pytest.mark.parametrize("args, expected", [
    (["run", "no-such-scenario"], "no built-in scenario 'no-such-scenario'"),
    (["run", "geo-ring", "--set", "decode.k=0"], "decode.k: expected an integer in [1, 64], got 0"),
    (["run", "geo-ring", "--set", "network.hops_ms=[1, -2, 3]"], "network.hops_ms[1]"),
    (["run", "geo-ring", "--set", "stages=[]"], "stages: expected a non-empty array"),
    (["run", "geo-ring", "--set", "stages.0.layers=9"], "stages.layers"),
])
def test_bad_input_is_a_clear_error_not_a_traceback(args, expected):
    result = subprocess.run([sys.executable, "-m", "testbed", *args, "--no-dashboard"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    text = " ".join((result.stdout + result.stderr).split())
    assert expected in text and "Traceback" not in text
