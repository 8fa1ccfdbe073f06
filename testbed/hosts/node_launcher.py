"""The launcher of one node of a several-host run (testbed.hosts.node): its own agent; the rest through the store."""

from __future__ import annotations

import collections
import hashlib
import socket
import statistics
import time
from dataclasses import replace

import trio

from netem.base import Shaper
from testbed.hosts.clocksync import (RESYNC_S, ClockProbe, OffsetTrack, clock_violations, hop_bounds_s, serve_clock,
                               to_entry_clock)
from testbed.scenario.config import Scenario
from testbed.core.errors import AgentFailed, LinkBroken, PeerTimeout, TestbedError, leaf_errors
from testbed.core.records import LapRecord
from testbed.core.summary import RunSummary
from testbed.launch.launcher import STARTUP_TIMEOUT_S, READY_TIMEOUT_S, Launcher
from testbed.hosts.rendezvous import HEARTBEAT_S, Heartbeats, NodeInfo, NodeStore, StoreLost
from testbed.launch.runlog import RunLog
from testbed.launch.summarize import summarize

HOP_SAMPLES = 4096  # the last decode laps' hops the entry keeps for the hop table
HEARTBEAT_TIMEOUT_S = 2.0  # a node whose counter has not moved for this long is gone
ATTRIBUTE_S = 2.5  # after a local failure, how long the entry looks for the node that caused it


def digest(scenario: Scenario) -> str:
    """Every node must run the same scenario: a short hash of its resolved form."""
    return hashlib.sha256(repr(scenario).encode()).hexdigest()[:12]


class NodeLauncher(Launcher):
    """The launcher of one node: its own agent only; peers, readiness and failures go through the store."""

    def __init__(self, scenario: Scenario, shaper: Shaper, runlog: RunLog, *, store: NodeStore, stage: int,
                 rank: int, address: str, store_host: str = "", log=None, echo_agent_stderr: bool = False) -> None:
        super().__init__(scenario, shaper, runlog, log=log, echo_agent_stderr=echo_agent_stderr)
        self.store, self.stage, self.rank, self.address = store, stage, rank, address
        self.store_host = store_host  # the rendezvous store's address (torchrun's MASTER_ADDR)
        self.cause: str | None = None  # why this node stopped, once it has (main prints it)
        self.nodes: dict[int, NodeInfo] = {}
        self.tracks: dict[int, OffsetTrack] = {}
        self.hop_samples = [collections.deque(maxlen=HOP_SAMPLES) for _ in range(scenario.n_stages)]
        self.laps_seen = 0
        self.violations = 0
        self.completed = False

    @property
    def is_entry(self) -> bool:
        return self.stage == 0

    def label(self, stage: int) -> str:
        name = self.scenario.stages[stage].name if stage < self.scenario.n_stages else f"edge{stage}"
        info = self.nodes.get(stage)
        return info.label(name) if info else f"node {stage} ({name})"

    def agent_specs(self, n_layers: int):
        # the agent binds this host's address: the other hosts (or their relays) dial it there
        return [replace(spec, listen_host=self.address) for spec in super().agent_specs(n_layers)
                if spec.stage == self.stage]

    def _record(self, event: dict) -> LapRecord:
        record = to_entry_clock(super()._record(event), self.tracks)
        if record.kind not in ("probe", "prefill"):  # a prefill lap carries the prompt's bytes
            hops = record.hop_latencies_s()
            if len(hops) == len(self.hop_samples):
                self.laps_seen += 1
                for i, hop in enumerate(hops):
                    self.hop_samples[i].append(hop)
            self.violations += clock_violations(record, hop_bounds_s(len(self.hop_samples), self.tracks))
        return record

    async def run(self) -> RunSummary | None:
        try:
            await self._train_once()
            await self._run()
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                self.cause = await self._stopped_because()
                if self.cause is None:  # this node is where the run failed: tell the others
                    self.cause = self._failure(exc)
                    await self.store.fail(self.cause)
            raise
        return summarize(self.runlog) if self.is_entry else None

    def _failure(self, exc: BaseException) -> str:
        leaves = leaf_errors(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            return f"{self.label(self.stage)} was stopped (Ctrl-C or SIGTERM)"
        errors = [e for e in leaves if not isinstance(e, trio.Cancelled)]
        if not errors:
            return f"{self.label(self.stage)} was stopped"
        message = "; ".join(str(e) for e in errors)
        return message if message.startswith(("node ", "agent node ")) else f"{self.label(self.stage)}: {message}"

    async def _stopped_because(self) -> str | None:
        """Another node's failure note, or the store's host when the store is gone; None: nothing from elsewhere."""
        try:
            with trio.move_on_after(1.0):
                return await self.store.get("failed") if await self.store.has("failed") else None
        except StoreLost:
            host = next((s for s, info in self.nodes.items() if info.address == self.store_host), None)
            who = self.label(host) if host is not None else f"the rendezvous host {self.store_host}"
            return (f"{who}: stopped answering (the rendezvous store on its host is gone: its torchrun was stopped "
                    f"or the host failed)")
        return None

    async def _run_agents(self, nursery: trio.Nursery, specs) -> None:
        sc, me = self.scenario, self.stage
        everyone = list(range(sc.n_agents))
        # beating and watched from the start: a node that dies as the ring starts is named within HEARTBEAT_TIMEOUT_S
        nursery.start_soon(self._heartbeat)
        nursery.start_soon(self._watch, [s for s in everyone if s != me])
        self.runlog.phase = "starting agent"
        handle = await self._start_agent(nursery, specs[0])
        port = (await self._expect("listening", {me}, STARTUP_TIMEOUT_S))[me]["port"]
        clock_listeners = await trio.open_tcp_listeners(0, host=self.address)
        await nursery.start(trio.serve_listeners, serve_clock, clock_listeners)
        mine = NodeInfo(me, self.rank, socket.gethostname(), self.address, port,
                        clock_listeners[0].socket.getsockname()[1], digest(sc))
        await self.store.set(f"node/{me}", mine.to_json())
        self.runlog.phase = "waiting for the other nodes"
        await self.store.wait_for([f"node/{s}" for s in everyone], STARTUP_TIMEOUT_S, "nodes")
        for s in everyone:
            self.nodes[s] = NodeInfo.from_json(await self.store.get(f"node/{s}"))
            if self.nodes[s].digest != mine.digest:
                raise TestbedError(f"{self.label(s)} runs another scenario (digest {self.nodes[s].digest}, here "
                                   f"{mine.digest}): give every node the same scenario and --set options")
        self.runlog.phase = "connecting"
        peers = await self.shaper.connect({s: (info.address, info.agent_port) for s, info in self.nodes.items()})
        out = {str(dst): list(address) for (src, dst), address in peers.items() if src == me}
        await self._command(handle, {"cmd": "connect", "peers": out})
        await self._expect("ready", {me}, READY_TIMEOUT_S)
        if self.shaper.name == "none" and me < sc.n_stages and sc.n_stages > 1:
            await self._probe_successor()
        await self.store.set(f"ready/{me}", "1")
        await self.store.wait_for([f"ready/{s}" for s in everyone], READY_TIMEOUT_S, "ready nodes")
        if not self.is_entry:
            await self._command(handle, {"cmd": "run"})
            # no common clock: each node counts its links' schedule from its own start (within the store's latency)
            await self.shaper.start_schedule(time.monotonic(), nursery)
            await self._serve(handle)
            return
        await self._measure_clocks(everyone[1:])
        if self.shaper.name == "none" and sc.n_stages > 1:
            self.runlog.scenario = await self._measured_scenario()
        nursery.start_soon(self._resync)
        self.runlog.shaper_facts = self.facts()
        await self._command(handle, {"cmd": "run"})
        self.runlog.phase = sc.decode.mode
        self.runlog.schedule_origin = time.monotonic()
        await self.shaper.start_schedule(self.runlog.schedule_origin, nursery)
        try:
            while True:
                stage, event = await self.events.receive()
                self._check_fatal(stage, event)
                if self._handle(stage, event):
                    break
        except AgentFailed as exc:
            raise await self._attribute(exc) from exc
        self.completed = True
        self.runlog.shaper_facts = self.facts()
        await self.store.set("done", "1")
        handle.finished = True
        with trio.move_on_after(10.0):
            await handle.process.wait()

    async def _serve(self, handle) -> None:
        """A stage other than the entry: serve until the agent passes the shutdown on and exits."""
        while True:
            stage, event = await self.events.receive()
            self._check_fatal(stage, event)  # the launcher's supervisor: "exit" is a failure, "exited" normal
            if event["event"] == "exited":
                break
        self.completed = True
        await self.store.set(f"finished/{self.stage}", "1")

    async def _heartbeat(self) -> None:
        while True:
            await self.store.bump(f"alive/{self.stage}")
            await trio.sleep(HEARTBEAT_S)

    async def _watch(self, others: list[int]) -> None:
        """Stop on another node's failure note or on a node whose heartbeat stopped (unless it finished)."""
        beats = Heartbeats(self.store, others)
        while not self.completed:
            try:
                failed = await self.store.has("failed")
            except StoreLost:
                raise TestbedError(await self._stopped_because()) from None
            if failed:
                raise TestbedError(await self.store.get("failed"))
            for stage in await beats.stale(HEARTBEAT_TIMEOUT_S):
                if not await self.store.has(f"finished/{stage}") and not await self.store.has("done"):
                    raise AgentFailed(self.label(stage), f"stopped answering: no heartbeat in the rendezvous store "
                                                         f"for {HEARTBEAT_TIMEOUT_S:g} s (its process or host is gone)")
            await trio.sleep(HEARTBEAT_S)

    async def _attribute(self, exc: AgentFailed) -> TestbedError:
        """The entry's agent failed (a peer closed, a lap timed out): find the node behind it, if any."""
        beats = Heartbeats(self.store, [s for s in self.nodes if s != self.stage])
        with trio.move_on_after(ATTRIBUTE_S):
            while True:
                try:
                    if await self.store.has("failed"):
                        return TestbedError(f"{await self.store.get('failed')} (here: {exc})")
                    stale = await beats.stale(HEARTBEAT_TIMEOUT_S / 2)
                except StoreLost:
                    break
                if stale:
                    return AgentFailed(self.label(stale[0]), f"stopped answering (no heartbeat); here: {exc}")
                await trio.sleep(HEARTBEAT_S)
        return exc

    async def _probe_successor(self) -> None:
        """Unshaped: the real hop to the next stage is what the run should be predicted with (min RTT / 2)."""
        nxt = self.nodes[(self.stage + 1) % self.scenario.n_stages]
        probe = ClockProbe((nxt.address, nxt.clock_port))
        try:
            rtt = (await probe.measure()).rtt_min_s
        except (LinkBroken, PeerTimeout) as exc:
            raise AgentFailed(self.label(nxt.stage), f"its clock server did not answer: {exc}") from exc
        finally:
            await probe.aclose()
        await self.store.set(f"rtt/{self.stage}", repr(rtt))

    async def _measured_scenario(self) -> Scenario:
        """The scenario with each ring hop's delay the real network's (its min round trip / 2): what the run's
        prediction uses when nothing shapes the links; the scenario's own hops are reported as expected."""
        sc = self.scenario
        one_way = {s: float(await self.store.get(f"rtt/{s}")) / 2 * 1e3 for s in range(sc.n_stages)}
        links = tuple(replace(link, delay_ms=one_way[link.src], jitter_ms=0.0, loss_pct=0.0, rate_mbit=0.0)
                      if i < sc.n_stages else link for i, link in enumerate(sc.links))
        return replace(sc, links=links, schedule=())

    async def _measure_clocks(self, stages: list[int]) -> None:
        for s in stages:
            probe = ClockProbe((self.nodes[s].address, self.nodes[s].clock_port))
            try:
                self.tracks[s] = OffsetTrack(s, [await probe.measure()])
            except (LinkBroken, PeerTimeout) as exc:
                raise AgentFailed(self.label(s), f"its clock server did not answer: {exc}") from exc
            finally:
                await probe.aclose()

    async def _resync(self) -> None:
        """Re-estimate every offset through the run; say when one moved beyond its bounds."""
        probes = {s: ClockProbe((self.nodes[s].address, self.nodes[s].clock_port)) for s in self.tracks}
        try:
            while True:
                await trio.sleep(RESYNC_S)
                for s, probe in probes.items():
                    try:
                        new = await probe.measure()
                    except (LinkBroken, PeerTimeout):
                        continue  # the heartbeat decides whether the node is gone
                    if not self.tracks[s].add(new):
                        self.log(f"warning: {self.label(s)}: its clock offset moved to {new.offset_s * 1e3:.3f} ms "
                                 f"(+-{new.bound_s * 1e3:.3f}), outside the earlier estimates' bounds")
        finally:
            with trio.CancelScope(shield=True):
                for probe in probes.values():
                    await probe.aclose()

    def facts(self) -> dict:
        """The shaper's facts plus the nodes, their clock offsets and the hops' measured one-way latency."""
        bounds = hop_bounds_s(len(self.hop_samples), self.tracks)

        def stat(samples, fn) -> float | None:
            return fn(samples) * 1e3 if samples else None

        hops = [{"hop": f"{i}->{(i + 1) % len(self.hop_samples)}", "expected_ms": link.delay_ms,
                 "p50_ms": stat(self.hop_samples[i], statistics.median),
                 "mean_ms": stat(self.hop_samples[i], statistics.fmean),
                 "min_ms": stat(self.hop_samples[i], min), "bound_ms": bounds[i] * 1e3}
                for i, link in enumerate(self.scenario.ring)]
        nodes = [{**vars(info), **(self.tracks[s].to_dict() if s in self.tracks else
                                   {"offset_ms": 0.0, "bound_ms": 0.0, "reference": True})}
                 for s, info in sorted(self.nodes.items())]
        return {**self.shaper.describe(), "nodes": nodes, "hops": hops, "clock_violations": self.violations,
                "laps": self.laps_seen}


