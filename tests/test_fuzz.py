"""Fuzzing: scenarios and `--set` fail with exit 2 naming the file, the key and what was expected; bad wire frames
close their connection and leave a live agent serving, in bounded memory. Derandomized: CI sees the same cases."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import re
import select
import socket
import subprocess
import sys
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from agents.process import wire
from agents.process.agent import AgentSpec
from agents.modes import MODES
from agents.zoo.train import MODEL_CONFIGS
from testbed import cli
from testbed.core.decode import DecodeConfig, PlacementConfig, SpecConfig, TPConfig, WireConfig
from testbed.core.errors import ConfigError
from testbed.core.records import LinkSpec
from testbed.scenario.config import _TOP_KEYS, load_scenario
from testbed.scenario.network import NETWORK_KEYS as _NETWORK_KEYS
from testbed.scenario.regions import REGION_KEYS
from testbed.scenario.stages import STAGE_KEYS as _STAGE_KEYS, split_layers

ROOT = Path(__file__).resolve().parent.parent


def fuzz(max_examples: int, *suppress: HealthCheck) -> settings:
    return settings(derandomize=True, deadline=None, database=None, max_examples=max_examples,
                    suppress_health_check=[HealthCheck.too_slow, *suppress])


# --- scenarios ---------------------------------------------------------------------------------

BASE_RING = {
    "name": "fuzz", "description": "three stages", "model": "target", "scale": 1.0,
    "stages": [{"name": f"s{i}", "compute_ms": 2.0, "per_token_ms": 0.0, "prefill_ms_per_token": 0.0}
               for i in range(3)],
    "network": {"hops_ms": [5.0, 5.0, 5.0], "jitter_ms": 0.0, "loss_pct": 0.0, "rate_mbit": 0.0,
                "loss_rto_ms": 200.0, "seed": 0, "links": [{"src": 0, "dst": 2, "delay_ms": 3.0}]},
    "decode": {"mode": "plain", "tokens": 8, "k": 4, "streams": 1},
    "wire": {"codec": "f32", "block": 64}, "placement": {"kv": "local", "head": "entry"}, "tp": {"allreduce": "ring"},
}
BASE_REGIONS = {
    "name": "fuzz-regions", "model": "target",
    "regions": {"names": ["x", "y", "z"], "one_way_ms": [[0.0, 4.0, 6.0], [4.0, 0.0, 5.0], [6.0, 5.0, 0.0]],
                "source": "made up"},
    "stages": [{"name": n, "region": n, "compute_ms": 2.0} for n in ("x", "y", "z")],
    "decode": {"tokens": 8},
}
BASES = (BASE_RING, BASE_REGIONS)

# Every key a scenario may have, from the loader's own tables (a new key is fuzzed without touching this file).
SECTIONS = {"decode": DecodeConfig, "wire": WireConfig, "placement": PlacementConfig, "tp": TPConfig,
            "spec": SpecConfig}
KNOWN_PATHS = sorted(
    [(k,) for k in _TOP_KEYS]
    + [("stages", i, k) for i in range(3) for k in _STAGE_KEYS] + [("stages", 0), ("stages", 3)]
    + [("network", k) for k in _NETWORK_KEYS] + [("network", "hops_ms", 1)]
    + [("network", "links", 0, f.name) for f in fields(LinkSpec)] + [("network", "links", 1)]
    + [(section, f.name) for section, cls in SECTIONS.items() for f in fields(cls)]
    + [("regions", k) for k in REGION_KEYS] + [("regions", "names", 1), ("regions", "one_way_ms", 1, 2)],
    key=str)
WORDS = ["", "auto", "x", "s0", "head", *MODES, "pp", "tp", "f16", "int8-block", "ship", "separate", "last",
         "continuous", "calibrated", "topk", "all-to-all", "target-deep", "draft", "[/x]", "[bold]", "\n", "é"]
# No surrogates: TOML cannot carry them. Everything else, control characters included, is fair.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
scalars = st.one_of(
    st.integers(-2**63, 2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 3, 16, 17, 64, 65, 255, 256, 257, 1024, 60_000, 60_001, 100_000, 100_001, 2**31,
                     2**63 - 1, -2**63]),
    st.floats(), st.sampled_from([0.0, -0.0, 1e-7, 0.5, 1.5, 100.5, 60_000.5, 1e300, math.nan, math.inf, -math.inf]),
    st.booleans(), text, st.sampled_from(WORDS))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=3),
                    max_leaves=6)
paths = st.one_of(st.sampled_from(KNOWN_PATHS), st.tuples(st.sampled_from(["stages", "network", *SECTIONS, "regions"]),
                                                          text).map(lambda p: (p[0], p[1] or "?")))
mutations = st.lists(st.tuples(st.sampled_from(["set", "set", "set", "delete"]), paths, junk), min_size=1, max_size=3)


def mutate(raw: dict, op: str, path: tuple, value) -> None:
    node = raw
    for part, after in zip(path[:-1], path[1:]):
        if isinstance(node, dict) and isinstance(part, str):
            node = node.setdefault(part, [] if isinstance(after, int) else {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return
    last = path[-1]
    if isinstance(node, dict) and isinstance(last, str):
        if op == "delete":
            node.pop(last, None)
        else:
            node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last <= len(node):
        if op == "delete" and last < len(node):
            del node[last]
        elif op != "delete":
            node[last:last + 1] = [value]


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else "inf" if value == math.inf else "-inf" if value == -math.inf \
            else repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_string(value: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped, everything else as it is."""
    return '"' + "".join(f"\\u{ord(c):04x}" if c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F else c
                         for c in value) + '"'


def dump_toml(raw: dict) -> str:
    return "".join(f"{toml_string(key)} = {toml_value(value)}\n" for key, value in raw.items())


def plan(argv: list[str]) -> tuple[int, str]:
    """`python -m testbed plan ARGV` in this process: its exit status and what it printed (one line per message)."""
    out = io.StringIO()
    with mock.patch.object(cli, "make_console", lambda: Console(file=out, width=100_000, color_system=None)):
        try:
            rc = cli.main(["plan", *argv, "--shaper", "userspace", "--dilation", "1"])
        except SystemExit as exc:  # argparse: a usage error
            rc = exc.code
    return rc, out.getvalue()


def numbers_in(value) -> list[float]:
    if is_dataclass(value):
        return [x for f in fields(value) for x in numbers_in(getattr(value, f.name))]
    if isinstance(value, list | tuple):
        return [x for item in value for x in numbers_in(item)]
    return [value] if isinstance(value, int | float) else []


def load_error(scenario: str, overrides: list[str]) -> ConfigError | None:
    """What `plan` checks before it prints, as an exception object (the key it names is an attribute); a scenario
    that loads holds finite numbers only (nan and inf are out of every range)."""
    try:
        sc = load_scenario(scenario, overrides)
        split_layers(MODEL_CONFIGS[sc.model].n_layer, sc.stages, sc.source)
    except ConfigError as exc:
        return exc
    assert all(math.isfinite(x) for x in numbers_in(sc)), sc
    return None


def assert_clean(scenario: str, overrides: list[str], source: str) -> None:
    """Valid: exit 0. Invalid: exit 2, one error naming the source, the key and what was expected; no traceback."""
    error = load_error(scenario, overrides)
    rc, out = plan([scenario, *(f"--set={o}" for o in overrides)])
    section = str(error.key).split(".")[0].split("[")[0] if error is not None else ""
    event("loads" if error is None else f"rejected at {section if section in _TOP_KEYS else error.source}")
    if error is None:
        assert rc == 0, out
        return
    assert rc == 2, out
    assert error.source in (source, "--set"), error
    assert error.key or error.source == "--set", f"no key named: {error}"
    # what was expected: "expected ..." for a value of the wrong type or range, a rule ("needs", "must") across keys
    assert len(str(error).removeprefix(f"{error.source}: {error.key}: ").split()) >= 3, error
    assert f"error: {error}" in out


@pytest.fixture(scope="module")
def scenario_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-scenarios")


@fuzz(500)
@given(base=st.sampled_from(BASES), changes=mutations)
@example(base=BASE_RING, changes=[("set", ("stages", 0, "compute_ms"), math.nan)])
@example(base=BASE_RING, changes=[("set", ("scale",), math.inf)])
@example(base=BASE_RING, changes=[("set", ("decode", "mode"), "[/x]")])
# tensor parallelism, all-to-all, [regions] given but the stages name none: the missing links have no regions
@example(base=BASE_REGIONS, changes=[("delete", ("stages", 0, "region"), 0), ("delete", ("stages", 1, "region"), 0),
                                     ("delete", ("stages", 2, "region"), 0), ("set", ("parallel",), "tp"),
                                     ("set", ("tp",), {"allreduce": "all-to-all"})])
def test_scenario_files_fail_cleanly(scenario_dir, base, changes):
    raw = copy.deepcopy(base)
    for op, path, value in changes:
        mutate(raw, op, path, value)
    path = scenario_dir / "fuzz.toml"
    path.write_text(dump_toml(raw))
    assert_clean(str(path), [], str(path))


override_keys = st.one_of(
    st.sampled_from(KNOWN_PATHS).map(lambda p: ".".join(str(part) for part in p)),
    st.sampled_from(KNOWN_PATHS).map(lambda p: ".".join("*" if isinstance(part, int) else part for part in p)),
    st.text(st.sampled_from("abcdkmnst_.*019-"), min_size=1, max_size=16))
override_values = st.one_of(junk.map(toml_value), text, st.sampled_from(["", "[", "[[1]", "{a=", "1979-05-27", "0x10",
                                                                        "1_000", "'x'", '"""x"""', "=", "a=b"]))


@fuzz(300)
@given(scenario=st.sampled_from(["geo-ring", "world-8"]),
       overrides=st.lists(st.tuples(override_keys, override_values).map("=".join), min_size=1, max_size=3),
       malformed=st.one_of(st.just([]), st.just([]), st.just([]), st.lists(text, max_size=1)))
# nesting deeper than tomllib's recursion; rich markup inside the error message
@example(scenario="geo-ring", overrides=["decode.k=" + "[" * 2000 + "]" * 2000], malformed=[])
@example(scenario="geo-ring", overrides=["decode.mode=\"[red]x\""], malformed=[])
@example(scenario="geo-ring", overrides=["stages.*=5"], malformed=[])
def test_set_overrides_fail_cleanly(scenario, overrides, malformed):
    assert_clean(scenario, overrides + malformed, f"<built-in {scenario}>")


def test_the_command_line_exits_2_without_a_traceback(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[[stages]]\nname = "a"\ncompute_ms = nan\n')
    for argv in ([str(path)], ["geo-ring", "--set", 'decode.mode="[/x]"'],
                 ["geo-ring", "--set", "decode.k=" + "[" * 3000]):
        out = subprocess.run([sys.executable, "-m", "testbed", "plan", *argv, "--shaper", "userspace"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "Traceback" not in out.stderr and "error:" in out.stdout


# --- wire frames against a live agent -------------------------------------------------------------

IO_TIMEOUT_S = 10.0
AGENT_START_TIMEOUT_S = 120.0
MAX_BODY_SENT = 16 * 1024  # a header may promise 64 MiB; the fuzzer sends at most this much of it
MEMORY_BOUND_MB = 32  # the agent's peak RSS may not grow by more than this over the whole fuzz run


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for pid {pid}")


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the agent closed its link downstream"
        data += chunk
    return data


class LiveAgent:
    """A real agent process, stage 1 of 2 (a middle stage: it computes and forwards), serving; its downstream
    peer is this test's socket, which is how the test sees that it still serves."""

    def __init__(self, log_path: Path) -> None:
        n_layer = MODEL_CONFIGS["target"].n_layer
        spec = AgentSpec(stage=1, n_stages=2, name="fuzzed", first_layer=n_layer // 2, last_layer=n_layer,
                         compute_ms=0.0, decode=DecodeConfig(), runner=MODES["plain"].runner_path())
        self.downstream_listener = socket.create_server(("127.0.0.1", 0))
        read_fd, write_fd = os.pipe()
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agents.process.agent", "--spec", spec.to_json(), "--control-fd", str(write_fd)],
            stdin=subprocess.PIPE, stderr=self.log, pass_fds=(write_fd,), cwd=ROOT)
        os.close(write_fd)
        self.control = os.fdopen(read_fd, "rb", buffering=0)
        self.port = self.expect("listening", AGENT_START_TIMEOUT_S)["port"]
        self.command({"cmd": "connect", "peers": {"0": list(self.downstream_listener.getsockname())}})
        self.downstream_listener.settimeout(IO_TIMEOUT_S)
        self.downstream, _ = self.downstream_listener.accept()
        self.downstream.settimeout(IO_TIMEOUT_S)
        self.expect("ready", IO_TIMEOUT_S)
        self.command({"cmd": "run"})
        self.probes = 0
        self.check_serving()
        self.baseline_mb = rss_mb(self.process.pid)

    def expect(self, event: str, timeout_s: float) -> dict:
        line = b""
        deadline = time.monotonic() + timeout_s
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self.control], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no {event!r} from the agent within {timeout_s} s: {self.log_path.read_text()}"
            chunk = self.control.read(1)
            assert chunk, f"the agent exited: {self.log_path.read_text()}"
            line += chunk
        message = json.loads(line)
        assert message["event"] == event, message
        return message

    def command(self, command: dict) -> None:
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        self.process.stdin.flush()

    def send_bad(self, data: bytes) -> None:
        """One connection: the bytes, then end of stream; the agent must close it (reading b"" or a reset)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT_S) as sock:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(4096):
                    pass
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before it read everything: closed all the same
            except socket.timeout:
                raise AssertionError(f"the agent left the connection open after {data[:80]!r}...") from None

    def check_serving(self) -> None:
        """Alive, and serving: a PROBE on a fresh connection comes out downstream, stamped by the agent."""
        self.probes += 1
        marker = 1_000_000 + self.probes
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT_S)
        except OSError:
            self.process.wait(timeout=IO_TIMEOUT_S)
        assert self.process.poll() is None, f"the agent died: {self.log_path.read_text()[-3000:]}"
        with sock:
            sock.sendall(wire.encode(wire.Frame(wire.Kind.PROBE, lap=marker)))
            while True:  # a fuzzed frame that was a valid PROBE may come out first
                header = wire.decode_header(recv_exactly(self.downstream, wire.HEADER.size))
                frame = wire.decode_body(header, recv_exactly(self.downstream, header.body_len))
                if frame.kind == wire.Kind.PROBE and frame.lap == marker:
                    break
        assert [s.stage for s in frame.stamps] == [1]

    def close(self) -> None:
        self.process.stdin.close()  # stdin closing tells the agent to exit
        try:
            self.process.wait(timeout=IO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.control.close()
        self.downstream.close()
        self.downstream_listener.close()
        self.log.close()


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    live = LiveAgent(tmp_path_factory.mktemp("fuzz-agent") / "agent.log")
    try:
        yield live
        live.check_serving()
        peak_growth = rss_mb(live.process.pid, "VmHWM") - live.baseline_mb
        assert peak_growth < MEMORY_BOUND_MB, f"the agent's peak RSS grew {peak_growth:.1f} MB"
    finally:
        live.close()
    log = live.log_path.read_text()
    assert "Traceback" not in log and "fatal" not in log, log[-3000:]
    assert "malformed frame" in log  # the agent said why it closed


def header(kind=wire.Kind.PROBE, dtype=wire.DType.NONE, ndim=0, dims=(0, 0, 0, 0), n_stamps=0, block=0,
           payload_len=0, stream=0, lap=0, pos=0, flags=0, magic=wire.MAGIC, version=wire.VERSION, pad_len=0) -> bytes:
    return wire.HEADER.pack(magic, version, kind, dtype, ndim, stream, lap, pos, flags, *dims, n_stamps, block,
                            payload_len, pad_len)


def payload_len_of(dtype: int, ndim: int, dims: tuple[int, ...], block: int) -> int:
    """What an honest sender would put in payload_len for this shape (exact integers), wrapped to u32."""
    n = math.prod(dims[:ndim]) if ndim else 0
    size = {wire.DType.FLOAT32: 4 * n, wire.DType.FLOAT16: 2 * n, wire.DType.INT32: 4 * n,
            wire.DType.INT8_BLOCK: wire.int8_block_bytes(n, block) if block else n}.get(dtype, 0)
    return size & 0xFFFFFFFF


def u(bits: int, *edges: int) -> st.SearchStrategy[int]:
    top = (1 << bits) - 1
    return st.one_of(st.sampled_from(sorted({0, 1, 2, top, top - 1, *edges})), st.integers(0, top))


DIMS = st.one_of(st.sampled_from([0, 1, 2, 3, 128, 256, 1 << 16, wire.MAX_DIM, wire.MAX_DIM + 1]), u(32))


# the deepest checks first: a fuzzer's draws lean to the start of a list
HEADER_FIELDS = ("payload_len", "body", "dims", "n_stamps", "block", "ndim", "dtype", "kind", "version", "magic")


@st.composite
def fuzzed_headers(draw) -> bytes:
    """A frame with one to three of its fields broken (edge values, lying lengths, a body shorter or longer than
    the header says) and the others honest, so that every check of the decoder is reached."""
    broken = draw(st.sets(st.sampled_from(HEADER_FIELDS), min_size=1, max_size=3))
    magic = draw(st.binary(min_size=4, max_size=4)) if "magic" in broken else wire.MAGIC
    version = draw(u(8)) if "version" in broken else wire.VERSION
    kind = draw(u(8)) if "kind" in broken else draw(st.sampled_from(list(wire.Kind)))
    dtype = draw(u(8)) if "dtype" in broken else draw(st.sampled_from(list(wire.DType)))
    ndim = draw(u(8)) if "ndim" in broken else 0 if dtype == wire.DType.NONE else draw(st.integers(1, wire.MAX_NDIM))
    if "dims" in broken:
        dims = tuple(draw(DIMS) for _ in range(4))
    else:
        dims = tuple(draw(st.sampled_from([1, 2, 3, 128])) if i < ndim else 0 for i in range(4))
    block = draw(u(16, 64)) if "block" in broken else 64
    n_stamps = draw(u(16, wire.MAX_STAMPS - 1, wire.MAX_STAMPS, wire.MAX_STAMPS + 1)) if "n_stamps" in broken \
        else draw(st.integers(0, 3))
    honest = payload_len_of(dtype, ndim, dims, block)
    payload_len = draw(st.one_of(st.sampled_from([honest + 1, max(honest - 1, 0)]), u(32, wire.MAX_PAYLOAD_BYTES,
                                                                                     wire.MAX_PAYLOAD_BYTES + 1))) \
        if "payload_len" in broken else honest
    head = header(kind, dtype, ndim, dims, n_stamps, block, payload_len, draw(u(32)), draw(u(64)), draw(u(32)),
                  draw(u(32)), magic, version)
    body_len = min(n_stamps * wire.STAMP.size + payload_len, MAX_BODY_SENT)
    if "body" in broken:
        body_len = draw(st.integers(0, body_len - 1)) if body_len and draw(st.booleans()) \
            else body_len + draw(st.integers(1, 64))
    return head + draw(st.binary(min_size=min(body_len, 64), max_size=min(body_len, 64))) + bytes(max(0, body_len - 64))


def what_the_agent_sees(data: bytes) -> str:
    """How the agent's decoder takes these bytes (the first frame): rejected, cut short, or a whole frame."""
    try:
        head = wire.decode_header(data)
    except wire.WireError as exc:
        return "header rejected: " + re.sub(r"\d+|'.*'|\(.*\)", "N", str(exc))[:40]
    if len(data) < wire.HEADER.size + head.body_len:
        return "cut short"
    wire.decode_body(head, data[wire.HEADER.size:wire.HEADER.size + head.body_len])
    return f"whole {head.kind.name} frame" + (", then more" if len(data) > wire.HEADER.size + head.body_len else "")


def framed(kind: wire.Kind, tensor: np.ndarray | None, **fields) -> wire.Frame:
    """A frame of `kind`; a BATCH frame with a row per row of its tensor (streams 0.., at `pos`), or, where the tensor
    is not [B, 1, C], a HIDDEN frame instead (a BATCH frame of another shape does not encode)."""
    if kind != wire.Kind.BATCH:
        return wire.Frame(kind, tensor=tensor, **fields)
    if tensor is None or tensor.ndim != 3 or tensor.shape[1] != 1 or tensor.shape[0] < 1:
        return wire.Frame(wire.Kind.HIDDEN, tensor=tensor, **fields)
    rows = wire.batch_rows(range(tensor.shape[0]), [fields.get("lap", 0)] * tensor.shape[0],
                           [fields.get("pos", 0) % (1 << 32)] * tensor.shape[0])
    return wire.Frame(kind, tensor=tensor, rows=rows, **fields)


def valid_frames():
    tensors = st.sampled_from([None, (1, 1, 128), (1, 3, 128), (2,), (4, 4), (3, 1, 128)])
    return st.builds(lambda kind, shape, n: wire.encode(framed(
        kind, None if shape is None else np.ones(shape, np.float32), lap=7,
        stamps=tuple(wire.Stamp(i, 1.0, 1.0, 1.0, 1.0, 1.0) for i in range(n)))),
        st.sampled_from(list(wire.Kind)), tensors, st.integers(0, 3))


@st.composite
def truncated_frames(draw) -> bytes:
    data = draw(valid_frames())
    return data[:draw(st.integers(0, len(data) - 1))]


N_EMBD = MODEL_CONFIGS["target"].n_embd


@st.composite
def stage_frames(draw) -> bytes:
    """Well-formed frames of every kind but SHUTDOWN at any position and stream, their tensors fitting a middle stage
    or not (shape, dtype, a tree plan's values): one that fits is computed on and forwarded, the rest refused."""
    kind = draw(st.sampled_from([k for k in wire.Kind if k != wire.Kind.SHUTDOWN]))
    shape = draw(st.one_of(st.none(), st.sampled_from([(1, 1, N_EMBD), (1, 4, N_EMBD), (1, 1, N_EMBD + 1),
                                                        (2, 1, N_EMBD), (1, 0, N_EMBD), (1, 1, 1, N_EMBD)]),
                           st.lists(st.integers(0, 9), min_size=1, max_size=2).map(tuple)))
    tensor = None
    if shape is not None:
        dtype = draw(st.sampled_from([np.float32, np.float16, np.int32]))
        n = math.prod(shape)
        values = draw(st.lists(st.integers(-2, 9), min_size=n, max_size=n)) if n <= 16 else [1] * n
        tensor = np.array(values, dtype).reshape(shape)
    return wire.encode(framed(kind, tensor, stream=draw(st.one_of(st.integers(0, 2), u(32))), lap=draw(u(64)),
                              pos=draw(st.one_of(st.integers(0, 9), u(32)))))


bad_frames = st.one_of(
    st.binary(min_size=1, max_size=300),  # random bytes
    st.binary(max_size=200).map(lambda rest: wire.MAGIC + bytes([wire.VERSION]) + rest),  # past the magic
    truncated_frames(),  # a real frame, cut anywhere (the header included)
    *[fuzzed_headers()] * 3,  # edge values in every field, lying lengths, short and long bodies
    stage_frames(),  # well-formed, fitting the stage or not
)


@fuzz(600, HealthCheck.filter_too_much)
@given(data=bad_frames)
# shape (2^16)^4: its byte count wraps to 0 in int64 arithmetic, which an empty payload then "matched"
@example(data=header(wire.Kind.HIDDEN, wire.DType.FLOAT32, 4, (1 << 16,) * 4))
@example(data=header(wire.Kind.KV, wire.DType.INT8_BLOCK, 3, (1 << 24, 1 << 24, 1 << 16, 0), block=1))
# a PROBE that already carries the most stamps a frame may have: the agent cannot add its own and forward it
@example(data=header(n_stamps=wire.MAX_STAMPS) + bytes(wire.MAX_STAMPS * wire.STAMP.size))
# ... and one stamp fewer: it decodes, but once stamped the next stage's decoder would refuse it
@example(data=header(n_stamps=wire.MAX_STAMPS - 1) + bytes((wire.MAX_STAMPS - 1) * wire.STAMP.size))
@example(data=header(wire.Kind.KV, wire.DType.FLOAT32, 1, (1 << 24, 0, 0, 0),
                     payload_len=wire.MAX_PAYLOAD_BYTES) + bytes(100))  # promises 64 MiB, sends 100 bytes
def test_bad_frames_close_their_connection_and_the_agent_serves_on(agent, data):
    seen = what_the_agent_sees(data)
    # A whole frame is ring traffic: a PROBE is forwarded, a KV dropped, a HIDDEN block that fits the stage computed on
    # and forwarded, anything that does not fit it refused (RingClient.admit); a SHUTDOWN would end the agent, as asked.
    assume(not seen.startswith("whole SHUTDOWN"))
    event(seen)
    agent.send_bad(data)
    agent.check_serving()


DOES_NOT_FIT = {  # well-formed frames a middle stage with nothing cached cannot compute on, and what admit says
    "a block past its cache": (wire.Frame(wire.Kind.HIDDEN, pos=5, tensor=np.ones((1, 1, N_EMBD), np.float32)),
                               "at position 5 does not fit stage 1"),
    "a block wider than the model": (wire.Frame(wire.Kind.HIDDEN, tensor=np.ones((1, 1, N_EMBD + 1), np.float32)),
                                     "float32, not (1, 1, 129)"),
    "a batch of two": (wire.Frame(wire.Kind.HIDDEN, tensor=np.ones((2, 1, N_EMBD), np.float32)), "not (2, 1, 128)"),
    "no tensor": (wire.Frame(wire.Kind.HIDDEN), "not None"),
    "ids instead of a hidden state": (wire.Frame(wire.Kind.HIDDEN, tensor=np.ones((1, 1, N_EMBD), np.int32)),
                                      "float32, not (1, 1, 128)"),
    "more positions than the cache": (wire.Frame(wire.Kind.HIDDEN, tensor=np.ones((1, 257, N_EMBD), np.float32)),
                                      "256 slots"),
    "a stream id past the limit": (wire.Frame(wire.Kind.HIDDEN, stream=1 << 20,
                                              tensor=np.ones((1, 1, N_EMBD), np.float32)), "stream 1048576"),
    "a batch past its cache": (framed(wire.Kind.BATCH, np.ones((2, 1, N_EMBD), np.float32), pos=3),
                               "at position 3 does not fit stage 1"),
    "a batch naming a stream twice": (wire.Frame(wire.Kind.BATCH, tensor=np.ones((2, 1, N_EMBD), np.float32),
                                                 rows=wire.batch_rows([1, 1], [0, 1], [0, 0])), "each once"),
    "a batch wider than the model": (framed(wire.Kind.BATCH, np.ones((2, 1, N_EMBD + 1), np.float32)),
                                     "float32 batches, not (2, 1, 129)"),
    "a token back to a middle stage": (wire.Frame(wire.Kind.TOKEN, tensor=np.ones(1, np.int32)), "TOKEN frame"),
    "an all-reduce message": (wire.Frame(wire.Kind.REDUCE, tensor=np.ones(4, np.float32)), "REDUCE frame"),
    "a tree plan in floats": (wire.Frame(wire.Kind.TREE, tensor=np.ones(3, np.float32)), "tree plan is int32"),
    "a tree with no root": (wire.Frame(wire.Kind.TREE, tensor=np.array([0, 0, 7], np.int32)), "root first"),
    "a tree keeping slots never cached": (wire.Frame(wire.Kind.TREE, pos=4, tensor=np.array([2, 2, 3, -1, 9],
                                                                                            np.int32)), "keeps slots"),
}


def test_well_formed_frames_that_do_not_fit_the_stage_are_refused_and_the_agent_serves_on(tmp_path):
    live = LiveAgent(tmp_path / "agent.log")
    try:
        for name, (frame, said) in DOES_NOT_FIT.items():
            live.send_bad(wire.encode(frame))
            live.check_serving()
            assert said in live.log_path.read_text().splitlines()[-1], (name, live.log_path.read_text()[-500:])
        # a tree plan, then a block with another number of nodes: refused; the tree's own block, and blocks that fit
        # what the stage will have cached, are computed on and forwarded
        def hidden(lap: int, pos: int, n_tok: int) -> bytes:
            return wire.encode(wire.Frame(wire.Kind.HIDDEN, lap=lap, pos=pos, tensor=np.ones((1, n_tok, N_EMBD),
                                                                                             np.float32)))

        live.send_bad(wire.encode(wire.Frame(wire.Kind.TREE, tensor=np.array([0, -1, 0, 3, 3], np.int32)))
                      + hidden(97, 0, 1))
        assert "tree nodes expected: 2" in live.log_path.read_text().splitlines()[-1]
        live.send_bad(hidden(98, 0, 2) + hidden(99, 0, 3) + hidden(100, 3, 1) + hidden(101, 5, 1))
        assert "at position 5 does not fit stage 1: stream 0 has 4 cached" in live.log_path.read_text()
        laps = []
        while len(laps) < 3:
            header = wire.decode_header(recv_exactly(live.downstream, wire.HEADER.size))
            laps.append(wire.decode_body(header, recv_exactly(live.downstream, header.body_len)).lap)
        assert laps == [98, 99, 100]
        live.check_serving()
    finally:
        live.close()
    log = live.log_path.read_text()
    assert "Traceback" not in log and "fatal" not in log, log[-3000:]
