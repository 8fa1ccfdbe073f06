"""A ring's weights as real bytes over the emulated links: an origin serves a checkpoint's files, every node fetches
the files it needs through its own link, and the time to a ready ring is measured.

    origin (node N) --- link N -> i: delay, rate (the files) ---> node i  (python -m agents.weights.fetch)
                    <-- link i -> N: delay (its requests, ACKs) --

The origin is `python -m agents.weights.origin` (HTTP, Range requests) where node N lives, each fetcher
`python -m agents.weights.fetch` where node i lives (a network namespace on netem: Shaper.agent_command_prefix).
The fetchers start together (their --go) and say when they began and ended on the box's monotonic clock, which
every namespace shares. Real bytes need real sockets: the relay or netem; the virtual backend's figures are the
weights study's simulation.

`predict_node_s` is the closed form of one node's fetch, protocol round trips included (testbed.core.tcp for the
bytes under each transport).

A scenario's [weights] (testbed.scenario.weights) makes this a run's first phase (first_phase, before the agents
start): on simulated time each stage's time to ready is the weights study's closed form (predict_ring_s), and the
agents load the model's own weights; on the relay or netem the scenario's model cut by stage crosses the links as
real bytes (measured_phase), and each stage's agent serves from what its node fetched and verified
(testbed.launch.weights_dirs), kept until the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import trio
from prometheus_client.core import GaugeMetricFamily, Metric

from agents.weights import manifest
from testbed.core import tcp
from testbed.core.channel import LineReader
from testbed.core.distribution import streams_ready_s
from testbed.core.errors import ConfigError, ShapingError
from testbed.core.jsonrecord import JsonRecord
from testbed.core.process import stop_process
from testbed.core.records import LOSS_RTO_MS, LinkSpec, mbit_to_bytes_s
from testbed.deploy.rules import StageShare, emulated_split, resident_bytes
from testbed.launch.weights_dirs import Fetched, stage_dirs
from testbed.scenario.config import Scenario

START_TIMEOUT_S = 120.0  # a process importing trio, starlette and hypercorn inside user-mode-linux: tens of seconds
STOP_GRACE_S = 2.0
HTTP_HEADER_BYTES = 300  # a request's or a response's headers, about
FIRST_RECEIVE_WINDOW = 65_535  # Linux's first advertised window of a new connection (netem.base.Shaper.warm_windows)
SOCKET_BUFFER_BYTES = 256 * 2**20  # netem.plan's tuned buffers


@dataclass(frozen=True)
class Route:
    """The origin's path to one node: one-way delay, and the rate the node receives at (its downlink)."""

    delay_ms: float
    rate_mbit: float = 0.0


@dataclass
class NodeFetch:
    node: int
    began: float
    ended: float
    fetched_bytes: int
    reports: list[dict] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.ended - self.began


@dataclass
class Distribution:
    backend: str
    transport: str
    nodes: list[NodeFetch]

    @property
    def ready_s(self) -> float:
        """From the first node's start to the last node's last verified byte: the ring can load."""
        return max(n.ended for n in self.nodes) - min(n.began for n in self.nodes)


def route_links(routes: list[Route]) -> list[LinkSpec]:
    """Node i's two links with the origin (node len(routes)): the files' way and the requests' way."""
    origin = len(routes)
    links = [LinkSpec(origin, i, r.delay_ms, rate_mbit=r.rate_mbit, seed=i) for i, r in enumerate(routes)]
    return links + [LinkSpec(i, origin, r.delay_ms, seed=origin + i) for i, r in enumerate(routes)]


def predict_node_s(route: Route, sizes: list[int], streams: int, transport: str, kernel_tcp: bool,
                   manifest_bytes: int, chunk_bytes: int) -> float:
    """One node's fetch, from its first request to its last verified byte.

    The manifest: a connection (one round trip where the handshake crosses the link, `kernel_tcp`: netem, whose
    connections are the kernel's own; the relay's are local), a request and its answer. Then file after file: its
    chunks in at most `streams` ranges at once, each on its own connection (the new ones: one more handshake), a
    request, and the ranges' bytes sharing the link:

    - "kernel": each range a cold TCP flow; P alike cold flows side by side are one flow with P times the initial
      window and the cap (cold_transfer_s);
    - "tuned" on the kernel's own TCP: the congestion window is open, but a new connection's receive window starts at
      64 KiB (Linux caps the first one there, whatever initrwnd says: netem.base) and doubles each round trip;
    - "tuned" on the relay: the link's rate from the first byte.
    """
    rtt = 2 * route.delay_ms / 1e3
    rate = mbit_to_bytes_s(route.rate_mbit)
    if transport == "kernel":
        params = tcp.TcpParams(rtt, rate)
    else:
        params = tcp.TcpParams(rtt, rate, initial_window=FIRST_RECEIVE_WINDOW, window_cap=SOCKET_BUFFER_BYTES)
    total = (rtt if kernel_tcp else 0.0) + rtt + manifest_bytes / rate
    opened = 1
    for size in sizes:
        ranges = max(1, min(streams, math.ceil(size / chunk_bytes)))
        fresh = ranges > opened
        total += (rtt if kernel_tcp and fresh else 0.0) + rtt / 2
        opened = max(opened, ranges)
        body = size + ranges * HTTP_HEADER_BYTES
        if transport == "kernel" or (kernel_tcp and fresh):  # `ranges` alike flows side by side: one, windows x P
            together = dataclasses.replace(params, initial_window=ranges * params.initial_window,
                                           window_cap=ranges * params.window_cap)
            total += tcp.cold_transfer_s(body, together, rtt / 2)
        else:
            total += body / rate + rtt / 2
    return total


async def _start(stack: contextlib.AsyncExitStack, argv: list[str]) -> tuple[trio.Process, LineReader]:
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    stack.push_async_callback(stop_process, process, STOP_GRACE_S)
    return process, LineReader(process.stdout)


async def _line(lines: LineReader, timeout_s: float, what: str) -> dict:
    with trio.move_on_after(timeout_s):
        answer = await lines.receive_json()
        if answer is None:
            raise ShapingError(f"{what} exited without answering")
        if "error" in answer:
            raise ShapingError(f"{what}: {answer['error']}")
        return answer
    raise ShapingError(f"{what} did not answer within {timeout_s:g} s")


async def distribute(routes: list[Route], files: list[list[str]], origin_root: Path, dest_root: Path, *,
                     shaper_kind: str = "userspace", transport: str = "tuned", streams: int = 8,
                     dilation: float = 1.0, timeout_s: float = 600.0,
                     log: Callable[[str], None] = lambda line: None) -> Distribution:
    """Every node i fetches files[i] from an origin serving origin_root, over route i, into dest_root/node<i>.

    `dilation` D runs every delay (and the minimum RTO) D times longer and every rate D times slower, and reports
    the times divided by D (testbed.launch.dilation's remedy: the box's own cost per byte, the relay's and the
    fetchers' in Python, shrinks D-fold against the link's); a transfer's rounds and windows are unchanged by it."""
    from netem.base import ShaperOptions
    from netem.select import choose_shaper

    if not dilation >= 1:
        raise ConfigError(f"expected a dilation >= 1, got {dilation!r}", key="dilation")
    origin = len(routes)
    box = [Route(r.delay_ms * dilation, r.rate_mbit / dilation) for r in routes]
    shaper = choose_shaper(shaper_kind, route_links(box), origin + 1, os.urandom(3).hex(),  # as launcher.new_run_id
                           options=ShaperOptions(loss_rto_ms=LOSS_RTO_MS * dilation, transport=transport))
    if shaper.in_process:
        raise ConfigError("real bytes cross real sockets: use the relay or netem (the weights study simulates the "
                          "virtual backend's)", key="--shaper")
    log(f"shaper: {shaper.reason}")
    python = [sys.executable, "-m"]
    async with shaper, contextlib.AsyncExitStack() as stack:
        _, said = await _start(stack, [*shaper.agent_command_prefix(origin), *python, "agents.weights.origin",
                                       str(origin_root), "--host", shaper.agent_listen_host(origin), "--until-eof"])
        port = (await _line(said, START_TIMEOUT_S, "the origin"))["port"]
        listen = {i: ("127.0.0.1", 9) for i in range(origin)} | {origin: (shaper.agent_listen_host(origin), port)}
        peers = await shaper.connect(listen)  # nodes listen on nothing: the links towards them carry answers only
        fetchers = []
        for i, names in enumerate(files):
            host, node_port = peers[(i, origin)]
            fetchers.append(await _start(stack, [
                *shaper.agent_command_prefix(i), *python, "agents.weights.fetch", f"http://{host}:{node_port}",
                str(dest_root / f"node{i}"), "--names", ",".join(names), "--streams", str(streams), "--go"]))
        for i, (_, lines) in enumerate(fetchers):
            await _line(lines, START_TIMEOUT_S, f"node {i}'s fetcher")
        for process, _ in fetchers:
            await process.stdin.send_all(b"go\n")
        nodes = []
        for i, (_, lines) in enumerate(fetchers):
            done = await _line(lines, timeout_s, f"node {i}'s fetch")
            nodes.append(NodeFetch(i, done["began"] / dilation, done["ended"] / dilation,
                                   sum(r["fetched_bytes"] for r in done["reports"]), done["reports"]))
            log(f"node {i}: {nodes[-1].fetched_bytes:,} bytes in {nodes[-1].seconds:.3f} s")
    return Distribution(shaper.name, transport, nodes)


# --- [weights]: the run's first phase ----------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightsPhase(JsonRecord):
    """A run's [weights] phase: each stage's shard from the origin, its time to ready beside the closed form.

    On simulated time (the virtual backend) a stage's time is the closed form's (the weights study's prediction
    for the streams strategies); on the relay or netem it is measured, real bytes hash-verified."""

    backend: str
    how: str  # "modelled" (simulated time) or "measured" (real bytes)
    origin: str
    strategy: str
    streams: int
    transport: str
    stages: tuple[str, ...]
    shard_bytes: tuple[int, ...]
    ready_s: tuple[float, ...]  # per stage: from the first request to its last verified byte
    predicted_s: tuple[float, ...]
    dilation: float = 1.0

    @property
    def ring_ready_s(self) -> float:
        return max(self.ready_s, default=0.0)

    def lines(self) -> list[str]:
        """What the run prints: the ring's time to ready beside its prediction, then each stage's."""
        streams = "one stream" if self.streams == 1 else f"{self.streams} streams"
        head = (f"weights: ring ready in {self.ring_ready_s:.3f} s {self.how} (predicted {max(self.predicted_s):.3f} "
                f"s), {sum(self.shard_bytes):,} bytes from {self.origin}, {streams} a node, {self.transport} TCP")
        return [head] + [f"weights: {name}: {n:,} bytes ready in {t:.3f} s (predicted {p:.3f} s)"
                         for name, n, t, p in zip(self.stages, self.shard_bytes, self.ready_s, self.predicted_s)]


def origin_one_way_s(scenario: Scenario, back: bool = False) -> list[float]:
    """The one-way delay from the origin to each stage (`back`: from each stage to the origin); within one region
    weights.local_ms (testbed.scenario.weights has checked that every stage has a region)."""
    cfg, matrix = scenario.weights, scenario.regions
    return [cfg.local_ms / 1e3 if st.region == cfg.origin else
            (matrix.latency(st.region, cfg.origin) if back else matrix.latency(cfg.origin, st.region)) / 1e3
            for st in scenario.stages]


def shard_bytes(scenario: Scenario) -> list[int]:
    """Each stage's shard: its share of the [geometry] (the weights study's shards), else of the model's checkpoint
    (the bytes the relay moves)."""
    if scenario.geometry is None:
        return [sum(len_ for _, _, len_ in spans) for spans in checkpoint_spans(scenario)]
    return [n_bytes for _, n_bytes in geometry_shards(scenario)]


def geometry_shards(scenario: Scenario) -> list[tuple[StageShare, int]]:
    """Each stage's share of the scenario's [geometry] (its layers split as the scenario splits them; a separate
    head's agent holds the head's matrix) and its resident bytes."""
    geometry, stages = scenario.geometry, list(scenario.stages)
    assert geometry is not None
    head_stage = {"entry": 0, "last": len(stages) - 1}.get(scenario.placement.head)
    split = emulated_split(geometry, stages, head_stage, scenario.source)
    shares = [StageShare(0, True) if st.is_head else share for st, share in zip(stages, split, strict=True)]
    return [(share, round(resident_bytes(geometry, share, entry=i == 0 and not st.is_head)))
            for i, (st, share) in enumerate(zip(stages, shares))]


def predict_ring_s(scenario: Scenario, sizes: list[int]) -> list[float]:
    """Each stage's ready time when every node pulls its shard from the origin over P streams (the weights study's
    prediction for its streams strategies): the fluid schedule of each node's cap (its downlink, or P windows over
    its round trip under "kernel") on the origin's uplink, slow start's lag on each stream's first share, and the last
    chunk's one-way delay."""
    cfg = scenario.weights
    p, kernel = cfg.stream_count, scenario.transport == "kernel"
    down, up = mbit_to_bytes_s(cfg.down_mbit), mbit_to_bytes_s(cfg.origin_up_mbit)
    one_way = origin_one_way_s(scenario)
    rtts = [there + back for there, back in zip(one_way, origin_one_way_s(scenario, back=True))]

    def params(i: int, rate: float) -> tcp.TcpParams:  # the kernel's windows, or none ("tuned")
        return tcp.TcpParams(rtts[i], rate) if kernel else tcp.TcpParams(rtts[i], rate, math.inf, math.inf)

    return streams_ready_s(sizes, [down] * len(sizes), up, p, params, one_way)[1]


def modelled_phase(scenario: Scenario, backend: str) -> WeightsPhase:
    """The phase on simulated time: each stage's time to ready is the closed form's."""
    cfg, sizes = scenario.weights, shard_bytes(scenario)
    predicted = tuple(predict_ring_s(scenario, sizes))
    return WeightsPhase(backend, "modelled", cfg.origin, cfg.strategy, cfg.stream_count, scenario.transport,
                        tuple(st.name for st in scenario.stages), tuple(sizes), predicted, predicted)


def stage_extras(scenario: Scenario) -> list[bool]:
    """The stages that also load the embeddings, the final norm and the head, as the launcher's agents do: the
    entry, a separate head, and a last stage that samples (placement.head = "last")."""
    last = scenario.n_stages - 1
    return [i == 0 or st.is_head or (scenario.placement.head == "last" and i == last)
            for i, st in enumerate(scenario.stages)]


def checkpoint_spans(scenario: Scenario) -> list[list[tuple[Path, str, int]]]:
    """Per stage, the (file, tensor, bytes) it loads of the scenario's model (agents.weights.stages.stage_spans)."""
    from agents.weights.stages import stage_spans
    from agents.zoo.configs import model_config

    ranges = scenario.layer_ranges(model_config(scenario.model).n_layer)
    return stage_spans(scenario.model, ranges, stage_extras(scenario))


def cut_checkpoint(scenario: Scenario, out: Path) -> list[list[str]]:
    """The scenario's model cut by stage into `out` (a Hugging Face checkpoint by agents.weights.shards, a byte
    model by agents.weights.stages); per stage, the files its node needs."""
    from agents.hf.checkpoint import is_hf
    from agents.zoo.configs import model_config

    ranges = scenario.layer_ranges(model_config(scenario.model).n_layer)
    if is_hf(scenario.model):
        from agents.weights.shards import shard_by_stage  # safetensors.torch: torch, for real bytes only

        return shard_by_stage(Path(scenario.model.removeprefix("hf:")), out, ranges, stage_extras(scenario))
    from agents.weights.stages import cut_byte_model

    return cut_byte_model(scenario.model, ranges, stage_extras(scenario), out)


async def measured_phase(scenario: Scenario, shaper_kind: str, dilation: float, log: Callable[[str], None],
                         scratch: Path) -> tuple[WeightsPhase, Fetched]:
    """The phase with real bytes: the model cut by stage into scratch/origin, served by an origin and fetched by each
    node over its own link from the origin into scratch/nodes/node<i> (distribute: every chunk SHA-256-verified),
    each node's time beside predict_node_s."""
    cfg = scenario.weights
    routes = [Route(one_way * 1e3, cfg.down_mbit) for one_way in origin_one_way_s(scenario)]
    origin = scratch / "origin"
    files = await trio.to_thread.run_sync(cut_checkpoint, scenario, origin)
    sizes = [[(origin / name).stat().st_size for name in names] for names in files]
    entries = await trio.to_thread.run_sync(manifest.build, origin)
    done = await distribute(routes, files, origin, scratch / "nodes", shaper_kind=shaper_kind,
                            transport=scenario.transport, streams=cfg.stream_count, dilation=dilation, log=log)
    predicted = tuple(predict_node_s(route, size, cfg.stream_count, scenario.transport, shaper_kind == "netem",
                                     len(manifest.dumps(entries)), manifest.CHUNK_BYTES)
                      for route, size in zip(routes, sizes))
    phase = WeightsPhase(done.backend, "measured", cfg.origin, cfg.strategy, cfg.stream_count, scenario.transport,
                         tuple(st.name for st in scenario.stages), tuple(sum(s) for s in sizes),
                         tuple(n.seconds for n in done.nodes), predicted, dilation)
    return phase, Fetched(scratch, files, entries)


@contextlib.asynccontextmanager
async def first_phase(scenario: Scenario, shaper, dilation: float, log: Callable[[str], None]
                      ) -> AsyncIterator[tuple[WeightsPhase | None, tuple[str, ...]]]:
    """[weights] before the agents start: (the phase, each stage's directory of verified weights for its agent) for
    as long as the context lasts, then the fetched files are gone (on every exit path). No [weights]: (None, ()).
    On a simulated backend the phase is modelled and moves no bytes: its agents keep the model's own weights (no
    directories). On the relay or netem it is measured with real bytes, and each stage's agent loads what its
    node fetched (stage_dirs). Its lines printed."""
    if scenario.weights is None or shaper.in_process:
        phase = None if scenario.weights is None else modelled_phase(scenario, shaper.name)
        for line in phase.lines() if phase else ():
            log(line)
        yield phase, ()
        return
    with tempfile.TemporaryDirectory(prefix="geo-ring-weights-") as scratch:
        phase, fetched = await measured_phase(scenario, shaper.name, dilation, log, Path(scratch))
        for line in phase.lines():
            log(line)
        dirs = await trio.to_thread.run_sync(stage_dirs, scenario, fetched)
        if any(dirs):
            log(f"weights: each stage serves from its verified shard, under {scratch} until the run ends")
        yield phase, dirs


def weights_metrics(phase: WeightsPhase | None) -> Iterator[Metric]:
    """testbed_weights_ready_seconds{stage, kind}: each stage's time to ready, kind=measured (real bytes) or modelled
    (simulated time), and kind=predicted (the closed form); testbed_weights_shard_bytes{stage}."""
    if phase is None:
        return
    ready = GaugeMetricFamily("testbed_weights_ready_seconds", "[weights]: a stage's time from its first request to "
                              "the last verified byte of its shard", labels=["stage", "kind"])
    shard = GaugeMetricFamily("testbed_weights_shard_bytes", "[weights]: the bytes of a stage's shard",
                              labels=["stage"])
    for name, n, t, p in zip(phase.stages, phase.shard_bytes, phase.ready_s, phase.predicted_s):
        ready.add_metric([name, phase.how], t)
        ready.add_metric([name, "predicted"], p)
        shard.add_metric([name], n)
    yield from (ready, shard)
