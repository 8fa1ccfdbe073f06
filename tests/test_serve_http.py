"""The OpenAI-compatible endpoint on a real ring: `testbed run geo-ring --http` on the relay (userspace shaper), driven
by the official `openai` client (fidelity: real processes, real sockets; no timing assertions).

One run (the `served` fixture) answers four of the checks: the API key refuses a request without it (401); then 36
streaming clients at once on the --http cap of 16 (they queue, and endpoint.serve_s passes while they run: the run
lets them end): a completion at temperature 0 is the target's own greedy continuation of its prompt; a client that
goes away mid-stream has its request recorded aborted with fewer tokens while the requests beside it decode what the
model alone decodes; 32 more all complete. The records are the run's JSON summary (--json),
matched to the responses by id ("cmpl-<index>" is RequestRecord.index). A second run is stopped by Ctrl-C with a
request in flight: the client's stream ends, the CLI exits 130 without a traceback, and no process it started is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

import openai
import pytest
import trio

from agents.zoo.configs import BYTES
from tests.procutil import running
from tests.test_prometheus_server import free_port
from tests.test_streams import greedy_reference

pytestmark = pytest.mark.fidelity

API_KEY: Final = "sk-geo-ring-http-test"
MODEL: Final = "target"
START_TIMEOUT_S: Final = 90  # the ring up and the endpoint listening (about 10 s on a quiet box)
END_TIMEOUT_S: Final = 90  # serve_s over, the requests in the ring ended, the summary written
CLIENT_TIMEOUT_S: Final = 60  # any one client's whole conversation
# Box seconds the first run takes requests: every request is sent within the first, and the last of the 36 (three
# waves of the cap, about 4 s each) end well after serve_s has passed: the run lets them end and answers them whole.
SERVE_S: Final = 5
ENDPOINT_LINE: Final = "OpenAI-compatible endpoint: "
GREEDY_PROMPT: Final = "def add(a, b):\n    return "
GREEDY_TOKENS: Final = 12
NEIGHBOUR_PROMPTS: Final = ("The ring", "import numpy as np\n")
ABORTED_TOKENS: Final = 40  # asked for; the client leaves after ABORT_AFTER_CHUNKS
ABORT_AFTER_CHUNKS: Final = 3
CONCURRENT: Final = 32
CONCURRENT_TOKENS: Final = 8


@dataclass
class Cli:
    """`python -m testbed run ...` in its own process group (a terminal's foreground job: Ctrl-C reaches it all), its
    output read line by line on a thread (a full pipe would block it), the processes it started as last seen."""

    argv: list[str]
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    url: str | None = None
    listening: threading.Event = field(default_factory=threading.Event)
    descendants: set[int] = field(default_factory=set)

    def start(self) -> Cli:
        def foreground_job() -> None:
            os.setpgid(0, 0)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # a suite started in a script's background inherits SIG_IGN

        self.proc = subprocess.Popen([sys.executable, "-m", "testbed", *self.argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=foreground_job)
        threading.Thread(target=self._read, name="cli-reader", daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(ENDPOINT_LINE):
                self.url = line.removeprefix(ENDPOINT_LINE).split()[0]
                self.listening.set()
        self.listening.set()  # it ended: whoever waits stops waiting

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_listening(self) -> str:
        self.listening.wait(START_TIMEOUT_S)
        assert self.url is not None, f"no endpoint within {START_TIMEOUT_S} s:\n{self.output[-3000:]}"
        self.note_descendants()
        return self.url

    def note_descendants(self) -> None:
        """Every process below the CLI now (its fork server, agents, relay), added to those seen before."""
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (ValueError, OSError):
                continue
        frontier = {self.proc.pid}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier} - self.descendants
            self.descendants |= frontier

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def left(self) -> list[int]:
        return sorted(pid for pid in self.descendants if running(pid))

    def stop(self) -> None:
        """Whatever path got here: the CLI and everything it started gone (Ctrl-C first, then SIGKILL)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.note_descendants()
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in self.left():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdout.close()


def cli_argv(port: int, *extra: str) -> list[str]:
    return ["run", "geo-ring", "--shaper", "userspace", "--no-dashboard", "--metrics-port", "0",
            "--http", f"127.0.0.1:{port}", "--set", "decode.temperature=0", *extra]


def client(url: str, api_key: str | None = API_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=api_key or "sk-not-the-key", max_retries=0,
                              timeout=CLIENT_TIMEOUT_S)


@dataclass
class Streamed:
    """A streamed completion as the client saw it."""

    id: str = ""
    text: str = ""
    chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None


async def stream(api: openai.AsyncOpenAI, prompt: str, max_tokens: int, leave_after: int | None = None,
                 got: Streamed | None = None) -> Streamed:
    """One streamed completion, read to its end (or left after `leave_after` chunks: the connection closed), into
    `got` as it comes."""
    got = Streamed() if got is None else got
    try:
        response = await api.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                temperature=0)
        async with response:
            async for chunk in response:
                got.id, got.chunks = chunk.id, got.chunks + 1
                for choice in chunk.choices:
                    got.text += choice.text
                    got.finish_reason = choice.finish_reason or got.finish_reason
                if leave_after is not None and got.chunks >= leave_after:
                    break
    except openai.OpenAIError as exc:
        got.error = f"{type(exc).__name__}: {exc}"
    return got


@dataclass
class Served:
    exit_code: int
    output: str
    unauthorized: list[int]  # the HTTP status of each request made without the key
    models: list[str]
    greedy: Streamed
    neighbours: list[Streamed]
    left: Streamed
    concurrent: list[Streamed]
    records: dict[int, dict]  # the run's request records (JSON summary), by index
    references: dict[str, list[int]]  # prompt -> the target's greedy tokens, alone, without a ring


async def drive(url: str) -> dict:
    """Every client of the first run: the key's refusals, then all at once (the cap is 16: they queue, and serve_s
    passes while they run) the greedy stream, a client that leaves, two neighbours and CONCURRENT more."""
    out: dict = {"unauthorized": []}
    async with client(url, api_key=None) as stranger:
        for call in (stranger.models.list(),
                     stranger.completions.create(model=MODEL, prompt="hi", max_tokens=2)):
            try:
                await call
                out["unauthorized"].append(200)
            except openai.APIStatusError as exc:
                out["unauthorized"].append(exc.status_code)
    async with client(url) as api:
        out["models"] = [model.id for model in (await api.models.list()).data]
        results: dict[str, Streamed] = {}

        async def into(key: str, *args) -> None:
            results[key] = await stream(api, *args)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(into, "greedy", GREEDY_PROMPT, GREEDY_TOKENS)
            nursery.start_soon(into, "left", NEIGHBOUR_PROMPTS[0], ABORTED_TOKENS, ABORT_AFTER_CHUNKS)
            for i, prompt in enumerate(NEIGHBOUR_PROMPTS):
                nursery.start_soon(into, f"neighbour{i}", prompt, GREEDY_TOKENS)
            for i in range(CONCURRENT):
                nursery.start_soon(into, f"concurrent{i}", f"request {i}: ", CONCURRENT_TOKENS)
    out["greedy"], out["left"] = results["greedy"], results["left"]
    out["neighbours"] = [results[f"neighbour{i}"] for i in range(len(NEIGHBOUR_PROMPTS))]
    out["concurrent"] = [results[f"concurrent{i}"] for i in range(CONCURRENT)]
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    summary_path = tmp_path_factory.mktemp("serve-http") / "summary.json"
    cli = Cli(cli_argv(free_port(), "--api-key", API_KEY, "--set", f"endpoint.serve_s={SERVE_S}",
                       "--json", str(summary_path))).start()
    try:
        prompts = (GREEDY_PROMPT, *NEIGHBOUR_PROMPTS)  # while the ring starts
        references = {p: greedy_reference(BYTES.encode(p), GREEDY_TOKENS) for p in prompts}
        url = cli.wait_listening()
        out = trio.run(drive, url)
        exit_code = cli.wait(END_TIMEOUT_S)
    finally:
        cli.stop()
    assert exit_code == 0, cli.output[-3000:]
    summary = json.loads(summary_path.read_text())
    records = {r["index"]: r for r in summary["serve"]["records"]}
    return Served(exit_code, cli.output, records=records, references=references, **out)


def record_of(served: Served, got: Streamed) -> dict:
    assert got.id.startswith("cmpl-"), got
    return served.records[int(got.id.removeprefix("cmpl-"))]


def test_without_the_api_key_every_route_answers_401(served):
    assert served.unauthorized == [401, 401]
    assert served.models == [MODEL]


def test_a_streamed_completion_is_the_models_own_greedy_continuation(served):
    got, reference = served.greedy, served.references[GREEDY_PROMPT]
    assert got.error is None and got.finish_reason == "length", got
    assert got.text == BYTES.decode(reference)
    record = record_of(served, got)
    assert record["ids"] == reference and not record["aborted"]


def test_a_client_that_leaves_mid_stream_has_its_request_aborted_and_the_others_are_unchanged(served):
    left = served.left
    assert left.error is None and left.chunks == ABORT_AFTER_CHUNKS, left
    record = record_of(served, left)
    assert record["aborted"] and ABORT_AFTER_CHUNKS <= record["output_tokens"] < ABORTED_TOKENS, record
    assert record["ids"] == served.references[NEIGHBOUR_PROMPTS[0]][:record["output_tokens"]]
    for prompt, got in zip(NEIGHBOUR_PROMPTS, served.neighbours):
        reference = served.references[prompt]
        assert got.error is None and got.text == BYTES.decode(reference), got
        assert record_of(served, got)["ids"] == reference


def test_concurrent_streaming_clients_all_complete(served):
    # a client cut off with its request's last tokens unsent: the run ended (serve_s over, the ring empty) before the
    # endpoint's responses had written what the ring had sampled
    errors = [(got.id, got.chunks, got.error) for got in served.concurrent if got.error]
    assert errors == [], f"{len(errors)} of {CONCURRENT} clients failed ((id, chunks, error)): {errors}"
    assert all(got.finish_reason == "length" for got in served.concurrent)
    records = [record_of(served, got) for got in served.concurrent]
    assert len({r["index"] for r in records}) == CONCURRENT
    assert all(not r["aborted"] and r["output_tokens"] == CONCURRENT_TOKENS for r in records)


def test_ctrl_c_ends_the_run_with_a_request_in_flight_and_leaves_no_process():
    cli = Cli(cli_argv(free_port())).start()  # endpoint.serve_s 0: it serves until stopped
    got = Streamed()

    async def interrupt_mid_stream(url: str) -> None:
        async with client(url) as api, trio.open_nursery() as nursery:
            nursery.start_soon(partial(stream, api, GREEDY_PROMPT, 200, got=got))
            with trio.fail_after(CLIENT_TIMEOUT_S):
                while got.chunks == 0 and got.error is None:
                    await trio.sleep(0.05)
                cli.note_descendants()
                os.killpg(cli.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
                await trio.to_thread.run_sync(cli.wait, END_TIMEOUT_S)
                # the run is over: the stream has ended (or its connection closed); fail_after catches a hang

    try:
        trio.run(interrupt_mid_stream, cli.wait_listening())
    finally:
        cli.stop()
    assert cli.proc.returncode == 130, cli.output[-3000:]
    assert "interrupted" in cli.output and "Traceback" not in cli.output, cli.output[-3000:]
    assert 0 < got.chunks and (got.error is not None or got.finish_reason is not None), got  # it ended, cut short
    assert cli.descendants and cli.left() == [], cli.left()
