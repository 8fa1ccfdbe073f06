"""The launcher: shaper + one supervised agent process per stage, lap records into the run log, summary out."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from typing import Callable

import trio

from agents.forkserver.client import ForkServer
from agents.modes import MODES
from agents.process.spec import AgentSpec
from netem.base import Shaper
from testbed.core.channel import encode_line, read_lines
from testbed.core.errors import AgentFailed, PeerTimeout
from testbed.core.process import stop_process
from testbed.core.records import LapRecord, expand_laps
from testbed.core.summary import AgentUsage, DilationSummary, RunSummary
from testbed.launch.agents import AgentHandle
from testbed.launch.budget import run_budget
from testbed.launch.dilation import BUDGET_S, box_scenario, resolve as resolve_dilation, undilated_on_simulated_time
from testbed.launch.runlog import RunLog
from testbed.launch.summarize import self_check, simulated_rate, summarize
from testbed.launch.weights import first_phase
from testbed.scenario.config import Scenario

STARTUP_TIMEOUT_S = 300.0  # agents import torch and load weights; inside user-mode-linux that is slow
READY_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 10.0
STOP_GRACE_S = 0.8  # Ctrl-C / failure: every child is gone within ~2 x this
FORK_SERVER_ENV = "GEO_RING_FORK_SERVER"  # "0": start every agent as a fresh process (python -m agents.process.agent)


class Launcher:
    """Runs one scenario. `runlog` fills while `run()` is in progress (the dashboard and exporter read it)."""

    def __init__(self, scenario: Scenario, shaper: Shaper, runlog: RunLog, *, log: Callable[[str], None] | None = None,
                 echo_agent_stderr: bool = False, dilation: DilationSummary | None = None,
                 fork_server: bool | None = None) -> None:
        self.scenario = scenario
        # Agents forked from one process that imported torch and loaded the weights (agents.forkserver), unless
        # fork_server=False or GEO_RING_FORK_SERVER=0: then each is a fresh `python -m agents.process.agent`.
        self.fork_server = os.environ.get(FORK_SERVER_ENV, "1") != "0" if fork_server is None else fork_server
        self.forks: ForkServer | None = None
        self.requested_at: dict[int, float] = {}  # stage -> when the launcher asked for its agent
        self.ready_s: dict[int, float] = {}  # stage -> request to "listening" (bench section 7)
        # Under time dilation the agents and the shaper run `physical`; lap records come back in scenario time.
        self.dilation = dilation or DilationSummary()
        self.physical = box_scenario(scenario, dilation)
        runlog.dilation = dilation
        self.shaper = shaper
        self.runlog = runlog
        self.log = log or (lambda message: print(message, file=sys.stderr))
        self.echo_agent_stderr = echo_agent_stderr
        self.agents: list[AgentHandle] = []
        self.listen: dict[int, tuple[str, int]] = {}  # each agent's listener, once known
        self.stage_weights: tuple[str, ...] = ()  # [weights] on real bytes: each stage's verified shard (its spec's)
        self.events_send, self.events = trio.open_memory_channel[tuple[int, dict]](1024)
        self.clock = shaper.clock  # the box's, or simulated time (netem.virtual)
        if shaper.in_process:  # simulated: the run log's readers (another thread) see its last moment
            self._seen_s = 0.0
            runlog.now = lambda: self._seen_s

    def agent_specs(self, n_layers: int) -> list[AgentSpec]:
        sc = self.physical
        ranges = sc.layer_ranges(n_layers)
        mode = MODES[sc.decode.mode]
        tree_slots = max((sc.decode.settings(own).cache_slots() for own in mode.settings), default=0)
        stages = [AgentSpec(stage=i, n_stages=sc.n_stages, name=st.name, first_layer=first, last_layer=last,
                            compute_ms=st.compute_ms, decode=sc.decode, runner=mode.runner_path(), model=sc.model,
                            listen_host=self.shaper.agent_listen_host(i), dilation=self.dilation.factor,
                            per_token_ms=st.per_token_ms, prefill_ms_per_token=st.prefill_ms_per_token, wire=sc.wire,
                            roofline=st.roofline, kv_ship=sc.placement.kv == "ship", is_head=st.is_head, tp=sc.tp,
                            head_on_last=sc.placement.head == "last" and i == sc.n_stages - 1,
                            lap_timeout_s=sc.lap_timeout_s, every_agent=mode.every_agent, tree_slots=tree_slots,
                            kv_positions=sc.kv_positions, warm_windows=self.shaper.warm_windows,
                            weights=self.stage_weights[i] if self.stage_weights else "")
                  for i, (st, (first, last)) in enumerate(zip(sc.stages, ranges))]
        edges = [AgentSpec(stage=i, n_stages=sc.n_stages, name=f"edge{i - sc.n_stages}", first_layer=0, last_layer=0,
                           compute_ms=0.0, decode=sc.decode, runner=mode.runner_path("EdgeClient"), model=sc.model,
                           listen_host=self.shaper.agent_listen_host(i), dilation=self.dilation.factor, wire=sc.wire,
                           spec=sc.spec, lap_timeout_s=sc.lap_timeout_s)
                 for i in range(sc.n_stages, sc.n_agents)]  # edge clients (agents.modes.dsd)
        return stages + edges

    async def _spawn(self, nursery: trio.Nursery, spec: AgentSpec) -> tuple[trio.Process, trio.abc.ReceiveStream]:
        """Start agent `spec`: (its process, its control stream). On a simulated backend the "process" is a Trio
        task in this one (agents.process.inprocess.TaskAgent), on the shaper's transport and clock."""
        if self.shaper.in_process:
            from agents.process.inprocess import TaskAgent

            agent = TaskAgent(spec, self.shaper.transport, self.shaper.clock)
            nursery.start_soon(agent.run)
            return agent, agent.control  # type: ignore[return-value]
        if self.forks is not None:
            title = f"geo-ring agent {spec.stage} {spec.name} (run {self.shaper.run_id})"
            self.requested_at[spec.stage] = self.clock.now()  # after the server's own start
            return await self.forks.spawn(spec.to_json(), netns=self.shaper.agent_netns(spec.stage), title=title)
        self.requested_at[spec.stage] = self.clock.now()
        read_fd, write_fd = os.pipe()
        argv = self.shaper.agent_command_prefix(spec.stage) + [
            sys.executable, "-m", "agents.process.agent", "--spec", spec.to_json(), "--control-fd", str(write_fd)]
        try:
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
                process_group=0)  # Ctrl-C reaches the launcher only; it stops the agents itself
        except OSError as exc:
            os.close(read_fd)
            raise AgentFailed(spec.name, f"cannot start: {exc}") from exc
        finally:
            os.close(write_fd)
        return process, trio.lowlevel.FdStream(read_fd)

    async def _start_fork_server(self, nursery: trio.Nursery) -> None:
        """The fork server (real-time agents, unless fork_server=False): started once, before the agents are asked
        for all at once."""
        if self.fork_server and not self.shaper.in_process and self.forks is None:
            # What the first lap's self-check imports lazily (np.median imports numpy.ma: 0.1-0.25 s here), imported
            # while the server preloads rather than while the laps come in.
            nursery.start_soon(trio.to_thread.run_sync, importlib.import_module, "numpy.ma")
            self.forks = await ForkServer.start(nursery, self._preload(), timeout_s=STARTUP_TIMEOUT_S,
                                                run_id=self.shaper.run_id, on_stderr=self._echo_server, log=self.log)

    def _echo_server(self, line: str) -> None:
        if self.echo_agent_stderr:
            self.log(f"[fork server] {line}")

    def _preload(self) -> list[str]:
        """The models the fork server loads for every agent to share: the scenario's and a drafter's."""
        sc = self.physical  # a drafter: "trained" (the byte draft), "calibrated" (the byte target) or an hf: path
        return sorted({sc.model, "draft", {"trained": "draft", "calibrated": "target"}.get(sc.decode.draft, sc.decode.draft)})

    async def _start_agent(self, nursery: trio.Nursery, spec: AgentSpec) -> AgentHandle:
        process, control = await self._spawn(nursery, spec)
        handle = AgentHandle(spec.stage, spec.name, process, control)
        self.agents.append(handle)

        def on_control(line: str) -> None:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                handle.stderr_tail.append(f"(bad control line) {line}")
                return
            if event.get("event") == "listening" and handle.stage in self.requested_at:
                self.ready_s[handle.stage] = self.clock.now() - self.requested_at[handle.stage]
            if event.get("event") == "finished":  # set here, before supervise() can see the exit
                handle.finished = True
                return
            if event.get("event") == "usage":  # may come after the entry's "done": kept here, not queued
                self.runlog.agent_usage[handle.stage] = AgentUsage(
                    handle.stage, handle.name, float(event["wall_s"]), float(event["cpu_s"]),
                    float(event["max_rss_mb"]), event.get("uss_mb"))
                return
            self.events_send.send_nowait((handle.stage, event))

        def on_stderr(line: str) -> None:
            handle.stderr_tail.append(line)
            if self.echo_agent_stderr:
                self.log(line)

        async def supervise() -> None:
            async with trio.open_nursery() as inner:
                inner.start_soon(read_lines, handle.control, on_control)
                inner.start_soon(read_lines, process.stderr, on_stderr)
                status = await process.wait()
            ended = "exit" if not handle.finished or status != 0 else "exited"  # "exited": a normal end
            await self.events_send.send((handle.stage, {"event": ended, "status": status}))

        nursery.start_soon(supervise)
        return handle

    async def _expect(self, event_name: str, stages: set[int], timeout_s: float) -> dict[int, dict]:
        """Wait for `event_name` from every stage in `stages`; anything fatal on the way raises AgentFailed."""
        got: dict[int, dict] = {}
        try:
            with trio.fail_after(timeout_s):
                while set(got) != stages:
                    stage, event = await self.events.receive()
                    self._check_fatal(stage, event)
                    if event["event"] == event_name:
                        got[stage] = event
                    else:
                        self._handle(stage, event)
        except trio.TooSlowError as exc:
            missing = ", ".join(self._agent(s).name for s in sorted(stages - set(got)))
            raise PeerTimeout(f"agents {missing} did not report '{event_name}' within {timeout_s:.0f} s") from exc
        return got

    def _agent(self, stage: int) -> AgentHandle:
        return next(handle for handle in self.agents if handle.stage == stage)

    def _check_fatal(self, stage: int, event: dict) -> None:
        handle = self._agent(stage)
        if event["event"] == "error":
            raise AgentFailed(f"{stage} ({handle.name})", event.get("message", "unknown error") + self._links_down())
        if event["event"] == "exit":
            status = event["status"]
            how = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
            raise AgentFailed(f"{stage} ({handle.name})", handle.cause(how))

    def _links_down(self) -> str:
        """'; link 1->2 is down ...' for every link the schedule has down now (a timeout's likely cause)."""
        origin = getattr(self.runlog, "schedule_origin", None)
        if origin is None:
            return ""
        t = self.clock.now() - origin
        down = [e for e in self.physical.schedule if e.down_s and e.at_s <= t < e.at_s + e.down_s]
        return "".join(f"; link {e.link} is down by the schedule (from {e.at_s / self.dilation.factor:g} s for "
                       f"{e.down_s / self.dilation.factor:g} s)" for e in down)

    def _handle(self, stage: int, event: dict) -> bool:
        """Apply a run-time event; True when the run is complete."""
        self._seen_s = self.clock.now()
        kind = event["event"]
        if kind in ("lap", "laps"):  # laps: one BATCH frame's streams (RingClient.report_laps)
            if not self.runlog.laps:
                self._warn_off_links()
            self.runlog.add_laps(expand_laps(self._record(event), *(event.get(k) for k in ("laps", "streams", "ids")))
                                 if kind == "laps" else [self._record(event)])
        elif kind == "probe":
            self.runlog.add_probe(self._record(event))
        elif kind == "notice":  # what an agent's user must read (the serve mode's endpoint address)
            self.log(str(event.get("message", "")))
        elif kind == "done":
            self.runlog.generated_tokens = int(event["tokens"])
            return True
        return False

    def _record(self, event: dict) -> LapRecord:
        """A lap record from an agent, in the scenario's time (the box's divided by the dilation)."""
        return LapRecord.from_dict(event["record"]).time_scaled(1.0 / self.dilation.factor)

    def _warn_off_links(self) -> None:
        for check in self_check(self.runlog) or ():
            if not check.ok:
                self.log(f"warning: link {check.hop} measured {check.measured_ms_p50:.3f} ms one-way before "
                         f"the first lap, configured {check.configured_ms:.3f} ms "
                         f"(tolerance {check.tolerance_ms:.3f} ms)")

    async def run(self) -> RunSummary:
        """Start everything, run the scenario, tear everything down (on every exit path). Returns the summary.

        On a simulated backend (netem.virtual) the run happens on its own simulated clock (testbed.core.virtual_time),
        in a worker thread: the caller's dashboard and exporter read the run log in real time meanwhile; its end logs
        the simulated tokens it made per wall second (summarize.simulated_rate).
        """
        await self._train_once()
        # [weights] first; on real bytes its fetched shards stay until the agents are gone (first_phase removes them)
        async with first_phase(self.scenario, self.shaper, self.dilation.factor, self.log) as (phase, dirs):
            self.runlog.weights, self.stage_weights = phase, dirs
            if not self.shaper.in_process:
                await self._run()
                return summarize(self.runlog)
            from testbed.core import virtual_time

            started = time.perf_counter()
            await virtual_time.run(self._run)
        summary = summarize(self.runlog)
        first, last = self.runlog.span
        self.log(simulated_rate(summary, time.perf_counter() - started, last - first if last >= first else None))
        return summary

    async def _train_once(self) -> None:
        """Train (only if the recipe changed since the weights shipped) once, not in every agent; in real time,
        before a simulated run starts. The fork server sees to it itself: this process never imports torch then."""
        if self.fork_server and not self.shaper.in_process:
            return
        from agents.zoo.train import ensure_trained, needs_training

        if needs_training():
            self.log("training the tiny models first (the recipe changed since the weights were shipped; minutes on "
                     "a small VM)")
        await trio.to_thread.run_sync(ensure_trained)

    async def _run(self) -> None:
        from agents.zoo.configs import model_config

        specs = self.agent_specs(model_config(self.scenario.model).n_layer)  # "target-deep": 16 layers
        self.runlog.shaper, self.runlog.shaper_reason = self.shaper.name, self.shaper.reason
        try:
            async with self.shaper:
                async with trio.open_nursery() as nursery:
                    try:
                        await self._run_agents(nursery, specs)
                        self.runlog.propagation = await self.shaper.realized_propagation()
                    finally:
                        await self._stop_agents()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop_agents()
        self.runlog.phase = "done"

    async def _run_agents(self, nursery: trio.Nursery, specs: list[AgentSpec]) -> None:
        sc = self.scenario
        self.runlog.phase = "starting agents"
        await self._start_fork_server(nursery)
        for spec in specs:  # in order, one at a time (asked for all at once, a killed node's run hung in CI)
            await self._start_agent(nursery, spec)
        everyone = set(range(sc.n_agents))
        listening = await self._expect("listening", everyone, STARTUP_TIMEOUT_S)
        host_of = {i: ("127.0.0.1" if specs[i].listen_host in ("0.0.0.0", "") else specs[i].listen_host)
                   for i in everyone}
        listen = self.listen = {i: (host_of[i], listening[i]["port"]) for i in everyone}
        self.runlog.phase = "connecting"
        peers = await self.shaper.connect(listen)
        self.runlog.shaper_facts = self.shaper.describe()
        for handle in self.agents:
            # every directed link of the scenario out of this stage, as the shaper wired it
            out = {str(dst): list(address) for (src, dst), address in peers.items() if src == handle.stage}
            await self._command(handle, {"cmd": "connect", "peers": out})
        await self._expect("ready", everyone, READY_TIMEOUT_S)
        self.runlog.phase = sc.decode.mode
        for handle in reversed(self.agents):  # the entry last: everyone else is serving when it starts
            await self._command(handle, {"cmd": "run"})
        self.runlog.schedule_origin = self.clock.now()  # the link schedule counts from here (testbed.scenario.schedule)
        self.runlog.schedule_changes = self.shaper.schedule_changes  # filled as the changes land
        await self.shaper.start_schedule(self.runlog.schedule_origin, nursery)
        while True:
            stage, event = await self.events.receive()
            self._check_fatal(stage, event)
            if self._handle(stage, event):
                break
        for handle in self.agents:
            handle.finished = True
        with trio.move_on_after(EXIT_TIMEOUT_S):
            for handle in self.agents:
                await handle.process.wait()

    async def _command(self, handle: AgentHandle, command: dict) -> None:
        try:
            await handle.process.stdin.send_all(encode_line(command))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise AgentFailed(f"{handle.stage} ({handle.name})", handle.cause("stopped reading commands")) from exc

    async def _stop_agents(self) -> None:
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for handle in self.agents:
                    handle.finished = True
                    if handle.process.poll() is None or handle.process.stdin is not None:
                        nursery.start_soon(stop_process, handle.process, STOP_GRACE_S)
            for handle in self.agents:
                await trio.aclose_forcefully(handle.control)
            if self.forks is not None:  # its agents are gone: it exits on EOF
                await self.forks.aclose(STOP_GRACE_S)


def new_run_id() -> str:
    return os.urandom(3).hex()  # six hex digits: namespaces, devices and fork-server sockets carry it


async def prepare(scenario: Scenario, shaper_kind: str = "auto", *, dilation: float | str = 1.0,
                  compensate: bool = False, log: Callable[[str], None], echo_agent_stderr: bool = False,
                  calibrations: dict | None = None, budget_s: float = BUDGET_S
                  ) -> tuple[Shaper, DilationSummary | None]:
    """The shaper for `scenario`'s links as the box runs them, and the time dilation (None: not dilated).

    dilation: a factor >= 1 or "auto" (testbed.launch.dilation); auto and compensate run a short calibration
    first, kept in `calibrations` (pass one dict to phases of one ring so that they calibrate once).
    """
    from netem.base import ShaperOptions
    from netem.select import BACKENDS, choose_shaper

    async def calibrate(calibration: Scenario) -> RunSummary:
        return await run_scenario(calibration, shaper_kind, log=log, echo_agent_stderr=echo_agent_stderr)

    backend = BACKENDS.get(shaper_kind)
    if backend is not None and backend.simulated:  # exact: there is no overhead for dilation to divide
        dilation, compensate = undilated_on_simulated_time(scenario, shaper_kind, dilation, compensate, log)
    chosen = await resolve_dilation(scenario, dilation, compensate=compensate, log=log, run=calibrate,
                                    cache=calibrations, budget_s=budget_s)
    physical = box_scenario(scenario, chosen)
    shaper = choose_shaper(shaper_kind, list(physical.links), scenario.n_agents, new_run_id(),
                           options=ShaperOptions(loss_rto_ms=physical.loss_rto_ms, schedule=physical.schedule,
                                                 transport=physical.transport))
    return shaper, (chosen if chosen.requested != "1" or chosen.compensate else None)


async def run_scenario(scenario: Scenario, shaper_kind: str = "auto", *, runlog: RunLog | None = None,
                       log: Callable[[str], None] | None = None, echo_agent_stderr: bool = False,
                       dilation: float | str = 1.0, compensate: bool = False,
                       calibrations: dict | None = None, budget_s: float = BUDGET_S) -> RunSummary:
    """Choose the shaper (and the dilation) and run one scenario (testbed.api.run wraps this); inside a study's
    budget (testbed.launch.budget) its share of it and the study's calibrations."""
    log = log or (lambda message: print(message, file=sys.stderr))
    budget_s, calibrations, counted = run_budget(budget_s, calibrations)
    shaper, chosen = await prepare(scenario, shaper_kind, dilation=dilation, compensate=compensate, log=log,
                                   echo_agent_stderr=echo_agent_stderr, calibrations=calibrations, budget_s=budget_s)
    launcher = Launcher(scenario, shaper, runlog or RunLog(scenario), log=log, echo_agent_stderr=echo_agent_stderr,
                        dilation=chosen)
    return counted(await launcher.run())
