"""python -m testbed serve: at what request rate does the ring still meet its latency targets (issue 54, item 6).

The scenario serves a seeded open-loop workload (the serve mode, agents.modes.serve) once per request rate: every
rate is one run, on virtual time unless --shaper says otherwise. A row holds vLLM's figures of that run's requests
(p50 and p99 TTFT, TPOT and E2EL, throughput, goodput, SLO attainment for --goodput) beside the queueing model's
prediction (agents.modes.serve.queueing) and the model's own error per percentile against the run.

- The rates: --rates, or by default fractions of the model's knee (KNEE_FRACTIONS): the rate at which the cap
  binds, c / E[S] (queueing.knee_rate), below which every request is admitted at once.
- --search: the highest rate whose attainment (the share of requests meeting every --goodput target) is at least
  --attainment (testbed.studies.serve.search). It starts at the knee, doubles (or halves) until the bracket holds
  a rate that meets the target and one that misses it (SEARCH_STEPS_OUT times at most), then bisects the bracket to
  SEARCH_TOLERANCE: a few runs. Every run of the search is a row too, so the attainment curve shows where it looked.
- --compare: issue 54 item 7, a row each (testbed.studies.serve.compare). The geo ring against the same ring
  co-located (every hop's delay 0, as the tp study's scaled_links at 0): the highest rate each serves within the
  SLO. Regional-first placement: no such ordering exists in the testbed (testbed/scenario/placement.py places the
  head, the KV and the draft; the place study searches ring orders by T_ring), so the row says so, and where the
  scenario has [regions] it serves the place study's best order beside the scenario's own at PLACEMENT_LOAD of the
  knee. Speculation on vs off (decode.speculate): the highest rate each serves within the SLO.

Every rate runs the same seed: the same request lengths and the same arrival pattern stretched (common random
numbers, agents.modes.serve.workload), so two rows differ by their rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table

from agents.modes.serve.settings import ServeSettings
from agents.modes.serve.slo import Goodput, per_request_lines
from agents.modes.serve.summary import cap_of, prefill_s, ring_model
from agents.modes.serve.workload import check_fits
from testbed.core.errors import ConfigError
from testbed.scenario.config import Scenario
from testbed.scenario.validate import listed
from testbed.studies.base import (dilation_cell, ensure_models_on, log_to, make_scenario, plan_runs, print_tables,
                                  results_path, write_json)
from testbed.studies.serve.compare import compare_backend, compare_colocated, compare_placement, compare_speculation
from testbed.studies.serve.result import Comparison, ServeResult, ServeRow
from testbed.studies.serve.search import Server, knee_of, rounded, search
from testbed.studies.style import DASH

DEFAULT_SCENARIO = "geo-ring"
DEFAULT_CAP = 16  # requests in the ring at once when the scenario is not a serve scenario of its own
ATTAINMENT_PCT = 90.0  # DistServe's: the share of requests that must meet every target
KNEE_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.5)  # the default rates, as fractions of the model's knee
IDLE_GAPS = 5.0  # below this many arrivals per lap timeout, an idle gap may outlast it (Poisson: e^-5 a gap)

WORKLOAD_FLAGS = {"--arrival": "workload.arrival", "--burstiness": "workload.burstiness",
                  "--requests": "workload.requests", "--duration": "workload.duration_s",
                  "--prompt-tokens": "workload.prompt_tokens", "--output-tokens": "workload.output_tokens",
                  "--max-concurrency": "workload.max_concurrency", "--seed": "workload.seed",
                  "--goodput": "workload.goodput", "--streams": "decode.streams"}


def dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def parse_goodput(value: str | list[str] | None) -> Goodput | None:
    """--goodput "ttft:MS tpot:MS e2el:MS" (also unquoted, or comma-separated); None where not given."""
    if value is None or value == []:
        return None
    text = " ".join(value) if isinstance(value, list | tuple) else str(value)
    try:
        return Goodput.parse(text.replace(",", " "))
    except ValueError as exc:
        raise ConfigError(str(exc).removeprefix("goodput: "), key="--goodput") from exc


def parse_rates(text: str | None) -> list[float] | None:
    if text is None:
        return None
    return sorted(set(listed(str(text), "--rates", "comma-separated request rates > 0 (req/s), e.g. 0.5,1,2,4",
                             float, lambda rate: math.isfinite(rate) and rate > 0)))


def workload_overrides(args: argparse.Namespace) -> list[str]:
    """The --set items the workload's flags make (a flag not given leaves the scenario's own value)."""
    if args.requests is not None and args.duration is not None:
        raise ConfigError("give --requests or --duration, not both", key="--duration")
    items = []
    for flag, key in WORKLOAD_FLAGS.items():
        value = getattr(args, dest(flag))
        if value is None or flag == "--goodput":
            continue
        if flag == "--arrival" and value == "trace":
            raise ConfigError("a rate sweep draws its arrivals at each rate; replay a trace with `testbed run "
                              "--set decode.mode=serve --set workload.arrival=trace`", key="--arrival")
        items.append(f"{key}={json.dumps(value) if isinstance(value, str) else value}")
    if args.duration is not None:
        items.append("workload.requests=0")
    return items


def serving_scenario(args: argparse.Namespace, goodput: Goodput | None) -> Scenario:
    """The scenario in the serve mode with the workload's flags applied; a bad value names its flag."""
    overrides = list(args.overrides) + ["decode.mode=serve"]
    if args.streams is None and make_scenario(args.scenario, overrides=list(args.overrides)).decode.streams == 1:
        overrides.append(f"decode.streams={DEFAULT_CAP}")  # a server of one request at a time is no server
    overrides += workload_overrides(args)
    if goodput is not None:
        overrides.append(f'workload.goodput="{goodput}"')
    try:
        scenario = make_scenario(args.scenario, overrides=overrides)
    except ConfigError as exc:
        flag = next((f for f, key in WORKLOAD_FLAGS.items() if key == exc.key and getattr(args, dest(f)) is not None),
                    None)
        if flag is None:
            raise
        raise ConfigError(str(exc).rpartition(f"{exc.key}: ")[2], key=flag) from exc
    if scenario.decode.settings(ServeSettings).arrival == "trace":
        raise ConfigError("the scenario's workload replays a trace: a rate sweep needs arrivals drawn at a rate "
                          "(--arrival poisson, gamma or constant)", source=scenario.source, key="workload.arrival")
    check_context(args, scenario)
    return scenario


def check_context(args: argparse.Namespace, scenario: Scenario) -> None:
    """A fixed prompt or output that no request can have within the model's context: a ConfigError naming the flag
    that set it (or the scenario's key) and the limit, before anything runs (the runner would refuse it too)."""
    from agents.zoo.configs import model_config

    try:
        check_fits(scenario.decode.settings(ServeSettings).workload(), model_config(scenario.model).block_size,
                   scenario.model)
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        flag = next((f for f, k in WORKLOAD_FLAGS.items() if k == key and getattr(args, dest(f)) is not None), None)
        raise ConfigError(message, source=None if flag else scenario.source, key=flag or key) from exc



async def measure(args: argparse.Namespace, scenario: Scenario, rates: list[float] | None, target_pct: float,
                  log) -> ServeResult:
    server = Server(scenario, scenario.name, args, target_pct, log)
    knee = knee_of(scenario)
    model = ring_model(scenario)
    settings = scenario.decode.settings(ServeSettings)
    sweep = rates if rates is not None else ([] if args.search else [rounded(f * knee) for f in KNEE_FRACTIONS])
    log(f"{scenario.name}: cap {cap_of(scenario)}, wall TPOT {model.lap_s(1) * 1e3:.1f} ms, knee {knee:.4g} req/s "
        f"(the queueing model); {len(sweep)} rates" + (", then the search" if args.search else ""))
    idle = [rate for rate in sweep if rate * scenario.lap_timeout_s < IDLE_GAPS]
    if idle:  # the stages take a ring without frames for that long as a dead peer (PeerTimeout)
        log(f"note: at {', '.join(f'{r:g}' for r in idle)} req/s a gap between requests can outlast "
            f"network.lap_timeout_s ({scenario.lap_timeout_s:g} s), which an idle ring's stages take as a dead peer; "
            f"raise it (--set network.lap_timeout_s=3600) if a run ends in a PeerTimeout")
    plan_runs(len(sweep) or 1)
    for rate in sweep:
        await server.row(rate)
    found = await search(server, knee, target_pct) if args.search else None
    comparisons: tuple[Comparison, ...] = ()
    if args.against == "virtual" and server.shaper != "virtual":
        comparisons += (await compare_backend(server, args, target_pct, log),)
    if args.compare:
        comparisons += (await compare_colocated(server, args, target_pct, log),
                       await compare_placement(server, args, target_pct, log),
                       await compare_speculation(server, args, target_pct, log))
    return ServeResult(
        scenario=scenario.name, shaper=server.shaper, stages=scenario.n_stages, t_ring_s=scenario.t_ring_s,
        compute_s=scenario.emulated_compute_s, cap=cap_of(scenario), settings=settings, goodput=settings.goodput,
        attainment_target_pct=target_pct, wall_tpot_ms=model.lap_s(1) * 1e3,
        light_ttft_ms=prefill_s(scenario, settings.prompt_tokens) * 1e3, knee_rate_req_s=knee,
        ceiling_tok_s=model.cap / model.lap_s(model.cap), serve_rows=server.measured(server.rows), search=found,
        comparisons=comparisons)


def run(args: argparse.Namespace, console: Console) -> ServeResult:
    rates = parse_rates(args.rates)
    goodput = parse_goodput(args.goodput)
    target = args.attainment
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 100:
        raise ConfigError(f"expected a share in (0, 100] (%), got {target!r}", key="--attainment")
    scenario = serving_scenario(args, goodput)
    if (args.search or args.compare) and scenario.decode.settings(ServeSettings).goodput_targets() is None:
        raise ConfigError(f"{'--search' if args.search else '--compare'} looks for the highest rate meeting the SLO: "
                          "give its targets, e.g. --goodput 'ttft:2000 tpot:400'", key="--goodput")
    ensure_models_on(console)
    return trio.run(measure, args, scenario, rates, float(target), log_to(console))


def table(result: ServeResult) -> Table:
    from testbed.studies.serve.figures import caption, cell_pair

    out = Table(title=caption(result))
    for col in ("req/s", "done", "p50 TTFT ms", "p99 TTFT ms", "p50 TPOT ms", "p99 TPOT ms", "p50 E2EL ms",
                "p99 E2EL ms", "out tok/s", "goodput req/s", "attain %", "D"):
        out.add_column(col, justify="right")
    for row in result.serve_rows:
        m = row.measured
        out.add_row(f"{row.rate_req_s:.4g}", f"{m.completed}",
                    *(cell_pair(row, pct, lat) for lat in ("ttft", "tpot", "e2el") for pct in ("p50", "p99")),
                    f"{m.output_throughput:.2f}",
                    f"{m.request_goodput:.3f}" if m.request_goodput is not None else DASH,
                    (f"{m.slo_attainment_pct:.1f}" + (" ok" if row.met else " miss")) if row.met is not None else DASH,
                    dilation_cell(row.dilation, row.capped_error_pct, duration=True))
    return out


def every_row(result: ServeResult) -> list[tuple[str, ServeRow]]:
    """(variant, row) of every run the result holds, each once: the sweep's ("" ), then the comparisons'."""
    seen, rows = set(), []
    for label, row in ([("", r) for r in result.serve_rows] +
                       [(v.label, r) for c in result.comparisons for v in c.variants for r in v.rows]):
        if id(row) not in seen:
            seen.add(id(row))
            rows.append((label, row))
    return rows


def request_lines(result: ServeResult) -> str:
    """Every request of every run, one JSON line each (slo.per_request_lines), with its variant and rate first."""
    out = []
    for label, row in every_row(result):
        for line in per_request_lines(row.records).splitlines():
            out.append(json.dumps({"variant": label, "rate_req_s": row.rate_req_s} | json.loads(line)))
    return "".join(line + "\n" for line in out)


def write_outputs(result: ServeResult, json_path: str | Path, console: Console | None = None) -> list[Path]:
    """The study's files beside `json_path` (results/serve-SCENARIO.json by default): the result's JSON, every
    request as JSON lines (-requests.jsonl), the markdown table (.md) and the figures (-latency.png, and
    -attainment.png with --goodput). Returns the paths written."""
    from testbed.studies.serve.figures import plot_attainment, plot_latency, result_markdown

    console = console or Console(quiet=True)
    path = Path(json_path)
    stem = path.with_suffix("")
    requests = Path(f"{stem}-requests.jsonl")
    requests.parent.mkdir(parents=True, exist_ok=True)
    requests.write_text(request_lines(result))
    saved = dataclasses.replace(result.without_records(), requests_jsonl=str(requests))
    written = [write_json(path, saved.to_json(indent=2), console), requests]
    markdown = Path(f"{stem}.md")
    markdown.write_text("\n".join(result_markdown(saved, str(path))) + "\n")
    written.append(markdown)
    written.append(Path(f"{stem}-latency.png"))
    plot_latency([saved], written[-1])
    if any(row.met is not None for row in saved.serve_rows):
        written.append(Path(f"{stem}-attainment.png"))
        plot_attainment([saved], written[-1])
    for extra in written[1:]:
        console.print(f"{extra.suffix.lstrip('.').upper() if extra.suffix != '.jsonl' else 'Requests'}: {extra}")
    return written


def show(result: ServeResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result)])
    if result.search is not None:
        s = result.search
        console.print(f"search ({s.target_pct:g}% attainment, {s.runs} runs from the knee {s.knee_rate_req_s:.4g} "
                      f"req/s): highest rate meeting it "
                      f"{f'{s.highest_met_req_s:.4g} req/s' if s.highest_met_req_s is not None else 'none'}; "
                      f"{s.reason}", markup=False, highlight=False)
    for c in result.comparisons:
        console.print(f"{c.title}: {c.note}", markup=False, highlight=False)
    write_outputs(result, results_path(args, "serve", result.scenario), console)
