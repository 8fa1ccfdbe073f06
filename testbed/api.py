"""The Python API for scripts and notebooks: run a scenario, a K sweep or any study and get its result back.

    import testbed
    summary = testbed.run("geo-ring", shaper="virtual", tokens=8)
    print(summary.measured_tok_s, summary.predicted_tok_s)

    result = testbed.faults("geo-ring", shaper="virtual", jitters=[0, 5], losses=[0, 1])  # every study, by name
    print(result[0].fault_rows[1].lap_ms, result[0].fault_rows[1].predicted_ms)

A study takes its command's options as keywords (`--hop-scale 0.5,1` is hop_scale=[0.5, 1]); its result is what
the command writes as JSON (testbed.studies.STUDIES lists them; `testbed.study(name, ...)` runs any of them, a study
registered later included). Overrides are scenario keys (dots allowed, as with `--set`); the CLI is a thin layer over
these functions.

This module is imported with `import testbed`, so it imports nothing heavy at its top: every function imports what
it runs when it is called (`import testbed.core` in an agent process stays light).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rich.console import Console

    from testbed.core.summary import RunSummary
    from testbed.scenario.config import Scenario

__all__ = ["run", "sweep", "study",
           "sweep_k", "regimes", "place", "tp", "tree", "codecs", "dsd", "acceptance", "overlap", "faults", "whatif",
           "probe", "transport", "weights", "search", "reproduce", "bench", "serve"]


def run(name_or_path: str | Scenario, shaper: str = "auto", *, tokens: int | None = None,
        overrides: list[str] | None = None, log: Callable[[str], None] | None = None, dilation: float | str = "auto",
        compensate: bool = False, trace: str | Path | None = None, budget_s: float | None = None, **keys: Any
        ) -> RunSummary:
    """Run one scenario to completion (blocking) and return its summary.

    `name_or_path` is a built-in scenario (`geo-ring`, ...), a TOML path or a built `Scenario`; `shaper` is `auto`,
    `virtual`, `userspace` or `netem`; keyword overrides are scenario keys (`**{"decode.mode": "speculative"}`).
    `dilation` is a factor or `auto` (testbed.launch.dilation; `budget_s` is auto's run-time budget, default
    testbed.launch.dilation.BUDGET_S); `trace` writes the laps as a Chrome trace-event timeline.

        >>> summary = testbed.run("geo-ring", shaper="virtual", tokens=8)
        >>> summary.measured_tok_s, summary.predicted_tok_s
    """
    import trio

    from testbed.launch.dilation import BUDGET_S
    from testbed.launch.launcher import run_scenario
    from testbed.launch.trace import tracing
    from testbed.studies.base import ensure_models

    sc = scenario(name_or_path, tokens=tokens, overrides=overrides, **keys)
    ensure_models()
    with tracing(trace):
        return trio.run(lambda: run_scenario(sc, shaper, log=log or (lambda message: None), dilation=dilation,
                                             compensate=compensate,
                                             budget_s=BUDGET_S if budget_s is None else budget_s))


def scenario(name_or_path: str | Scenario, *, tokens: int | None = None, overrides: list[str] | None = None,
             **keys: Any) -> Scenario:
    """A `Scenario` from a built-in name or a TOML path, with `--set`-style overrides and keyword overrides."""
    from testbed.studies.base import make_scenario

    return make_scenario(name_or_path, tokens=tokens, overrides=overrides, **keys)


def sweep(name_or_path: str, ks: list[int], *, alpha: float | None = None, rounds: int = 30, shaper: str = "auto",
          overrides: list[str] | None = None, dilation: float | str = "auto", **keys: Any) -> RunSummary:
    """One speculative K sweep (one run): `summary.spec.per_k` has measured vs predicted per K."""
    from testbed.studies.sweep.measure import sweep_scenario

    return run(sweep_scenario(name_or_path, ks, alpha=alpha, rounds=rounds, overrides=overrides, **keys), shaper,
               dilation=dilation)


def study(name: str, scenario_name: str | None = None, *, console: Console | None = None, **options: Any) -> Any:
    """Run the study `name` (a key of testbed.studies.STUDIES) with its command's options as keywords; returns its
    result (nothing printed unless a console is given). An unknown study or option is a TypeError naming it."""
    from rich.console import Console

    from testbed.studies import STUDIES

    if name not in STUDIES:
        raise TypeError(f"no study {name!r}; expected one of {', '.join(STUDIES)}")
    chosen = STUDIES[name]
    args = chosen.parser().parse_args([scenario_name] if chosen.scenario and scenario_name is not None else [])
    for key, value in options.items():
        if not hasattr(args, key):
            known = ", ".join(sorted(k for k in vars(args) if k != "scenario"))
            raise TypeError(f"{name}() got an unexpected option {key!r}; expected one of {known}")
        setattr(args, key, ",".join(str(v) for v in value) if isinstance(value, list | tuple) else value)
    return chosen.measure(args, console or Console(quiet=True))


# Each built-in study by name: `testbed.faults(...)` is `testbed.study("faults", ...)`. The K-sweep study is
# `sweep_k` here, since `sweep` above is the one-run K sweep. tests/test_api.py holds this list to the registry.

def sweep_k(scenario_name: str | None = None, **options: Any) -> Any:
    """The `sweep` study: speculative K sweep, measured vs predicted rate per K, and K* (`python -m testbed sweep`)."""
    return study("sweep", scenario_name, **options)


def regimes(scenario_name: str | None = None, **options: Any) -> Any:
    """Seed 000's regime map on one ring: TTFT vs prompt and link rate, aggregate and per-stream rate vs streams in
    flight, decode, speculation (`python -m testbed regimes`)."""
    return study("regimes", scenario_name, **options)


def place(scenario_name: str | None = None, **options: Any) -> Any:
    """Ring orders of a scenario's regions: best and worst T_ring and rate; `measure=True` runs both
    (`python -m testbed place`)."""
    return study("place", scenario_name, **options)


def tp(scenario_name: str | None = None, **options: Any) -> Any:
    """Pipeline vs tensor parallelism on the same links: per-token latency measured vs predicted, the TP/PP ratio
    next to Eq. 8's 4L/N (`python -m testbed tp`)."""
    return study("tp", scenario_name, **options)


def tree(scenario_name: str | None = None, **options: Any) -> Any:
    """Tree speculation: L(n), tok/s vs nodes per round and W*, measured vs predicted (`python -m testbed tree`)."""
    return study("tree", scenario_name, **options)


def codecs(scenario_name: str | None = None, **options: Any) -> Any:
    """Wire codecs (f32, f16, int8-block): bytes, encode/decode time, greedy agreement, KL and acceptance rate;
    `measure=True`: TTFT on the ring per codec (`python -m testbed codecs`)."""
    return study("codecs", scenario_name, **options)


def dsd(scenario_name: str | None = None, **options: Any) -> Any:
    """Speculation at a distance: co-located SD, synchronous and pipelined edge drafts and cloud AR across the edge
    RTT, the crossover, and server capacity (`python -m testbed dsd`)."""
    return study("dsd", scenario_name, **options)


def acceptance(scenario_name: str | None = None, **options: Any) -> Any:
    """Acceptance per draft position (Sequoia's vector) on calibration prompts, and Gamma predicted from it beside
    the i.i.d. form and measured on held-out prompts (`python -m testbed acceptance`)."""
    return study("acceptance", **({"scenario": scenario_name} if scenario_name else {}), **options)


def overlap(**options: Any) -> Any:
    """Overlapped speculation against synchronous speculation and plain decode by T_ring (single box, metro, regional,
    geo): tok/s measured vs predicted and the gain (`python -m testbed overlap`)."""
    return study("overlap", **options)


def faults(scenario_name: str | None = None, **options: Any) -> Any:
    """Jitter and loss on every link: mean and p99 lap measured vs the model, and the output against the clean run
    (`python -m testbed faults`)."""
    return study("faults", scenario_name, **options)


def serve(scenario_name: str | None = None, **options: Any) -> Any:
    """Serving under open-loop traffic (`python -m testbed serve`): the scenario (default geo-ring) served at each
    request rate, p50 / p99 TTFT, TPOT and E2EL, throughput, goodput and SLO attainment measured beside the queueing
    model's prediction and its error; on virtual time unless `shaper` says otherwise. Returns the ServeResult
    (testbed.studies.serve.result: a row per rate with its request records; testbed.studies.serve.measure.
    write_outputs writes the command's files).

        >>> result = testbed.serve(rates=[0.5, 1], requests=20, goodput="ttft:1000 tpot:400")
        >>> [(row.rate_req_s, row.measured.median_tpot_ms, row.predicted.median_tpot_ms) for row in result.serve_rows]

    `search=True` finds the highest rate whose attainment is at least `attainment` (90%) for the `goodput` targets;
    `compare=True` adds issue 54's comparisons (geo vs co-located ring, placement, speculation). The workload's
    keywords mirror [workload]: arrival, burstiness, requests or duration, prompt_tokens, output_tokens,
    max_concurrency, seed, streams (the cap).
    """
    return study("serve", scenario_name, **options)


def whatif(**options: Any) -> Any:
    """A deployment from the catalogues (model, hardware, regions): decode, TTFT, speculation, streams and where a
    token's time goes, predicted, and measured with `measure=True` (`python -m testbed whatif`)."""
    return study("whatif", **options)


def probe(scenario_name: str | None = None, **options: Any) -> Any:
    """Every link of a scenario measured one-way by message size on the box's clock (latency p50 / p99 and goodput,
    NetPIPE-style) beside what it configured; `out="links.toml"` writes the region matrix a search file reads
    (`python -m testbed probe`).

        >>> result = testbed.probe("geo-ring", shaper="virtual", sizes="64,1Mi", samples=5)
        >>> [(r.configured_ms, r.latency_ms) for r in result.probe_links]
    """
    return study("probe", scenario_name, **options)


def transport(**options: Any) -> Any:
    """The flow-level TCP model of transport "kernel" (testbed.core.tcp) against transfers over each backend: a grid
    of sizes, RTTs, rates, losses and connections, predicted vs measured, with the window's cap and slow start's
    rounds (`python -m testbed transport`).

        >>> result = testbed.transport(shapers="virtual", quick=True)
        >>> [(r.predicted_s, r.measured_s) for r in result.transport_rows]
    """
    return study("transport", **options)


def weights(scenario_name: str | None = None, **options: Any) -> Any:
    """How long a ring waits for its weights: every stage's shard of the scenario's [geometry] from an origin over one
    stream, parallel range streams or a chunked swarm, geo vs co-located, tuned vs kernel TCP, simulated on simulated
    time beside the closed forms (`python -m testbed weights`).

        >>> result = testbed.weights("geo-ring", overrides='geometry.preset="seed-700b"', regions="hong-kong,ireland,virginia")
        >>> [(r.placement, r.transport, r.strategy, r.ring_ready_s, r.predicted_s) for r in result.weights_rows]
    """
    return study("weights", scenario=scenario_name, **options)


def search(spec: str, **options: Any) -> Any:
    """The best deployment of the machines and regions a file lists: every candidate ranked by the closed forms, the
    top ones confirmed on virtual time (`python -m testbed search FILE`)."""
    return study("search", file=spec, **options)


def reproduce(**options: Any) -> Any:
    """Published deployments (PUBLISHED.md) as rings built from their sources: published vs predicted vs measured
    (`python -m testbed reproduce`)."""
    return study("reproduce", **options)


def bench(**options: Any) -> Any:
    """Relay precision, per-hop overhead and Table 2 fidelity, each beside its reference (`python -m testbed bench`)."""
    return study("bench", **options)
