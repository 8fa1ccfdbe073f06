"""Command line: python -m testbed {run,plan,<every study of testbed.studies.STUDIES>,report,clean,scenarios}; a thin
layer over testbed.api."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.markup import escape

from agents.modes import MODES
from testbed import api
from testbed.core.errors import ConfigError, TestbedError, leaf_errors
from testbed.core.summary import RunSummary
from testbed.report.build import main as report_main
from testbed.launch.trace import tracing
from testbed.scenario.config import Scenario, builtin_names, load_scenario
from testbed.studies import STUDIES
from testbed.studies.base import add_run_options, add_trace_option

# the exporter's port unless --metrics-port says otherwise; GEO_RING_METRICS_PORT sets another default (0: any free
# port), for a script or a test suite that runs several commands at once
METRICS_PORT_ENV = "GEO_RING_METRICS_PORT"
DEFAULT_METRICS_PORT = 9464


def default_metrics_port() -> int:
    value = os.environ.get(METRICS_PORT_ENV, "")
    if not value:
        return DEFAULT_METRICS_PORT
    if not value.isdigit() or int(value) > 65535:
        raise ConfigError(f"{value!r}: expected a port number 0-65535", key=METRICS_PORT_ENV)
    return int(value)


def scenario_from_args(args: argparse.Namespace, extra: list[str] | None = None) -> Scenario:
    return api.scenario(args.scenario, tokens=args.tokens, overrides=list(args.overrides) + list(extra or []))


async def _run_live(scenarios: list[Scenario], shaper_kind: str, metrics_port: int | None, console: Console,
                    dashboard: bool, verbose: bool, options: argparse.Namespace, launch=None) -> list[RunSummary]:
    """Run scenarios (phases) one after another under one exporter and one live dashboard.

    launch(scenario, runlog, log) -> a launcher replaces this box's (testbed.hosts.node: one node of several hosts).
    """
    from testbed.launch.collector import RunCollector
    from testbed.launch.launcher import Launcher, prepare
    from testbed.launch.runlog import RunLog
    from testbed.launch.summarize import summarize

    logs: list[RunLog] = []
    url = _serve_metrics(RunCollector(lambda: logs), default_metrics_port() if metrics_port is None else metrics_port,
                         console)
    lap_log = Path(options.lap_log) if getattr(options, "lap_log", None) else None
    if lap_log is not None:
        lap_log.parent.mkdir(parents=True, exist_ok=True)
        lap_log.write_text("")  # phases append to one fresh file
    logs.append(RunLog(scenarios[0], metrics_url=url, lap_log=lap_log))
    summaries = []

    def log(message: str) -> None:
        console.print(message, markup=False, highlight=False)

    async def run_phases() -> None:
        calibrations: dict = {}  # the phases run one ring: it is calibrated once
        for i, scenario in enumerate(scenarios):
            if launch is not None:
                summaries.append(await launch(scenario, logs[-1], log).run())
                continue
            shaper, dilation = await prepare(scenario, shaper_kind, dilation=options.dilation,
                                             compensate=options.compensate, log=log, echo_agent_stderr=verbose,
                                             calibrations=calibrations, budget_s=options.budget_s)
            _print_phase(console, i, len(scenarios), scenario, shaper, dilation, verbose)
            if i > 0:
                logs[-1].close()
                logs.append(RunLog(scenario, metrics_url=url, lap_log=lap_log))
            launcher = Launcher(scenario, shaper, logs[-1], log=log, echo_agent_stderr=verbose, dilation=dilation)
            summaries.append(await launcher.run())
        logs[-1].close()

    if not dashboard:
        await run_phases()
        return summaries
    from dashboards.live import run_dashboard

    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_dashboard(lambda: summarize(logs[-1]), console=console,
                                                              task_status=task_status))
        try:
            await run_phases()
        finally:
            nursery.cancel_scope.cancel()
    return summaries


def _serve_metrics(collector, metrics_port: int, console: Console) -> str:
    """The run's Prometheus exporter on 127.0.0.1:metrics_port (0: any free port); its URL."""
    from testbed.launch.collector import serve

    registry = CollectorRegistry()
    registry.register(collector)
    try:
        host, port = serve(registry, metrics_port)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on 127.0.0.1:{metrics_port}: {exc.strerror}; "
                          f"pick another with --metrics-port (0 = any free port)", key="--metrics-port") from exc
    url = f"http://{host}:{port}/metrics"
    console.print(f"Prometheus metrics: [bold]{url}[/bold]")
    return url


def _print_phase(console: Console, i: int, n: int, scenario: Scenario, shaper, dilation, verbose: bool) -> None:
    """A phase's first line: its mode, the shaper (its reason said once, in the first phase) and the dilation."""
    capped = (f"; capped, the overhead left is {dilation.expected_error_pct:+.2f}% of the rate"
              if dilation and dilation.factor != 1 and dilation.capped and dilation.expected_error_pct is not None
              else "")
    dilated = (f" Dilation: [bold]x{dilation.factor:g}[/bold] ("
               f"{'figures in scenario time' if dilation.factor != 1 else dilation.reason}{capped})." if dilation else "")
    why = f" ({escape(shaper.reason)})" if i == 0 else ""
    console.print(f"Phase {i + 1}/{n}: [bold]{scenario.decode.mode}[/bold] decode. "
                  f"Shaper: [bold]{shaper.name}[/bold]{why}.{dilated}")
    if verbose and shaper.probe and i == 0:
        console.print(f"  probe: {escape(shaper.probe)}")


def print_summary(console: Console, summaries: list[RunSummary]) -> None:
    from dashboards.live import render_summary

    console.print(render_summary(summaries))


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    phases = [p.strip() for p in args.phases.split(",") if p.strip()] if args.phases else []
    for phase in phases:
        if phase not in MODES:
            raise ConfigError(f"expected phases from {', '.join(MODES)}, got {phase!r}", key="--phases")
    if args.http:
        endpoint_overrides(args)
    scenarios = [scenario_from_args(args, [f"decode.mode={phase}"] if phase else []) for phase in phases or [None]]
    # No ensure_models here: it imports torch, ~1.5 s this process does not need; the launcher trains (or its fork
    # server does) if the recipe changed, and says so.
    with tracing(args.trace):
        summaries = trio.run(_run_live, scenarios, args.shaper, args.metrics_port, console, not args.no_dashboard,
                             args.verbose, args)
    print_summary(console, summaries)
    if args.trace:
        console.print(f"Trace (Perfetto, chrome://tracing): {args.trace}")
    if args.json:
        path = Path(args.json)
        for summary in summaries:
            target = path if len(summaries) == 1 else path.with_name(f"{path.stem}-{summary.mode}{path.suffix}")
            write_json(target, summary)
            console.print(f"JSON summary: {target}")
    return 0


HTTP_STREAMS = 16  # the ring's cap on requests in flight behind --http, unless decode.streams is set


def endpoint_overrides(args: argparse.Namespace) -> None:
    """--http [HOST:]PORT and --api-key: the serve mode with its OpenAI-compatible endpoint ([endpoint]), in real
    time (D = 1: its clients live on the box's clock), serving the endpoint's requests only unless [workload] is set."""
    host, _, port = args.http.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65_536:
        raise ConfigError(f"expected [HOST:]PORT with a port in 1-65535, got {args.http!r}", key="--http")
    if args.shaper == "virtual":
        raise ConfigError("the endpoint's clients live in real time: use a real-time backend (relay, userspace, "
                          "netem), not virtual", key="--http")
    given = {override.partition("=")[0].strip() for override in args.overrides}
    extra = [f"endpoint.port={int(port)}", f"endpoint.host={json.dumps(host.strip('[]') or '127.0.0.1')}"]
    extra += [f"endpoint.api_key={json.dumps(args.api_key)}"] if args.api_key else []
    extra += ["decode.mode=\"serve\""] if "decode.mode" not in given else []
    extra += [f"decode.streams={HTTP_STREAMS}"] if "decode.streams" not in given else []
    if not any(key.startswith("workload.") for key in given):
        extra.append("workload.requests=0")
    args.overrides = list(args.overrides) + extra
    if args.dilation == "auto":
        args.dilation = 1.0


def write_json(path: Path, summary: RunSummary) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary.to_json(indent=2) + "\n")


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    """What a run would set up, applied nowhere: the stage layout, then the shaper's commands or link timings."""
    from agents.zoo.configs import model_config
    from netem.base import ShaperOptions
    from netem.select import plan_lines
    from testbed.launch.launcher import new_run_id

    scenario = scenario_from_args(args)
    ranges = scenario.layer_ranges(model_config(scenario.model).n_layer)
    out = [f"# scenario {scenario.name}: {scenario.n_stages} stages, T_ring {scenario.t_ring_s * 1e3:.3f} ms, "
           f"decode {scenario.decode.mode}, model {scenario.model}"]
    if args.dilation == "auto" or args.compensate:
        out.append("# dilation: chosen at run time by a calibration run (delays below are undilated; --dilation D "
                   "shows them dilated)")
    elif args.dilation != 1.0:
        out.append(f"# dilation x{args.dilation:g}: the box runs every delay and compute below; figures are reported "
                   f"in the scenario's time (/ {args.dilation:g})")
        scenario = scenario.dilated(args.dilation)
    out += [f"# stage {i} {st.name}: layers {first}..{last - 1}, compute {st.cost_ms():g} ms emulated"
            + (f" (roofline of {st.devices} x {st.hardware}, a decode step at context 0)" if st.roofline else "")
            for i, (st, (first, last)) in enumerate(zip(scenario.stages, ranges))]
    if (geo := scenario.geometry) is not None:
        out.append(f"# geometry {geo.name}: d_model {geo.d_model} in {geo.dtype}, {geo.layers} layers; a decode frame "
                   f"carries {geo.hidden_bytes(1)} bytes of hidden state on every hop (padded)")
    _backend, lines = plan_lines(args.shaper, list(scenario.links), scenario.n_stages, new_run_id(),
                                 ShaperOptions(loss_rto_ms=scenario.loss_rto_ms, transport=scenario.transport))
    for line in out + lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def cmd_clean(args: argparse.Namespace, console: Console) -> int:
    from netem.clean import clean

    removed = clean(args.prefix)
    console.print("removed: " + (", ".join(removed) if removed else "nothing (no leftovers)"))
    return 0


def cmd_scenarios(args: argparse.Namespace, console: Console) -> int:
    for name in builtin_names():
        sc = load_scenario(name)
        console.print(f"{name:24s} {sc.n_stages} stages, T_ring {sc.t_ring_s * 1e3:7.1f} ms  {sc.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one scenario with a live dashboard and print measured vs predicted")
    add_run_options(run)
    run.add_argument("--json", help="write the JSON summary here")
    run.add_argument("--metrics-port", type=int, default=None,
                     help=f"Prometheus exporter port on 127.0.0.1 (default {DEFAULT_METRICS_PORT}, or "
                          f"${METRICS_PORT_ENV}; 0 = any free)")
    run.add_argument("--phases", help="run these decode modes one after another, e.g. plain,speculative "
                                      "(JSON files get the mode as a suffix)")
    run.add_argument("--no-dashboard", action="store_true", help="no live dashboard, only the final summary")
    run.add_argument("--verbose", action="store_true", help="echo the agents' logs")
    run.add_argument("--http", metavar="[HOST:]PORT",
                     help="serve an OpenAI-compatible endpoint on the entry (/v1/completions, /v1/chat/completions, "
                          "/v1/models; host 127.0.0.1 unless given): the serve mode, at D = 1, until Ctrl-C or "
                          f"endpoint.serve_s (decode.streams {HTTP_STREAMS} unless set)")
    run.add_argument("--api-key", help="with --http: every request needs `Authorization: Bearer KEY` (401 without)")
    run.add_argument("--lap-log", help="stream every lap record here as JSON lines (the run keeps only the last "
                                       "laps in memory; phases share the file, each record names its mode)")
    add_trace_option(run)
    run.set_defaults(func=cmd_run)

    plan = sub.add_parser("plan", help="print what a run would set up (tc commands or relay timings), apply nothing")
    add_run_options(plan)
    plan.set_defaults(func=cmd_plan)

    for study in STUDIES.values():
        if study.command:
            command = study.parser(sub.add_parser(study.name, help=study.help, description=study.help))
            command.set_defaults(func=study.main)

    report = sub.add_parser("report", help="PNG figures and a markdown table from JSON summaries")
    report.add_argument("rest", nargs=argparse.REMAINDER)
    report.set_defaults(func=lambda a, c: report_main(a.rest))

    clean = sub.add_parser("clean", help="remove namespaces/links a killed run left behind (testbed prefix only)")
    clean.add_argument("--prefix", default="gr")
    clean.set_defaults(func=cmd_clean)

    scenarios = sub.add_parser("scenarios", help="list the built-in scenarios")
    scenarios.set_defaults(func=cmd_scenarios)
    return parser


OFF_TTY_WIDTH = 240  # a pipe, a file, CI: tables take the width their content needs (up to this); lines never fold


def make_console() -> Console:
    """The terminal's width on a terminal; off one (rich would assume 80 columns and fold every table and cut its
    title) wide enough for any table, with lines unwrapped, unless COLUMNS says otherwise."""
    console = Console()
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(width=OFF_TTY_WIDTH, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = make_console()
    try:
        return args.func(args, console)
    except BaseException as exc:  # noqa: BLE001 - sorted into our own errors below, anything else re-raised
        leaves = leaf_errors(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            console.print("[bold]interrupted[/bold]: agents and shaping torn down")
            return 130
        if not leaves or not all(isinstance(e, TestbedError) for e in leaves):
            raise
        for e in leaves:
            # one line each, at any terminal width (users and tests grep them); it quotes user input: escaped
            console.print(f"[bold red]error:[/bold red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2 if all(isinstance(e, ConfigError) for e in leaves) else 1

