"""python -m testbed regimes: seed 000's regime map measured on one ring, every point next to its prediction.

The same ring is cheap or expensive depending on how many tokens share one traversal (seed 000, "Regimes"):

- prefill pays the ring once per prompt: TTFT = C_prefill(P) + T_ring + the prompt's serialization at the
  link rate (Eq. 5 with Eq. 1), measured for P in PROMPT_TOKENS at the scenario's rate and at SLOW_RATE_MBIT;
- M streams in flight fill the pipe: the aggregate rises ~M-fold while each stream still crawls at
  1 / (C + T_ring), until the bottleneck stage is busy all the time (physics.streams_rates), with and
  without continuous batching, for M in {1, 2, N, 2N, 4N} and twice the knee (C + T_ring) / c_max, where
  without batching the aggregate has flattened at 1 / c_max and with it has not;
- single-stream decode pays the ring per token (the wall), and speculative decode per round;
- a prompt on a cold connection (transport "kernel": testbed.core.tcp) pays TCP's slow start on every hop besides,
  the same prompt as the TTFT rows, at the same rates: fresh beside warm.

Every point is a run of its own (same ring, same shaper, each time-dilated as --dilation says); the table
and the JSON hold measured and predicted side by side, and `testbed report` draws the JSON.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import trio
from rich.console import Console
from rich.table import Table

from agents.modes import MODES
from testbed.studies.base import (ensure_models_on, log_to, make_scenario, plan_runs, print_tables, results_path,
                                   write_json)
from testbed.scenario.config import Scenario
from testbed.core.decode import MAX_STREAMS
from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.core.summary import RunSummary

PROMPT_TOKENS = (16, 128, 240)  # the models' context is 256 positions: 240 leaves room for the first tokens
SLOW_RATE_MBIT = 10.0
STREAM_TOKENS = 16  # tokens per stream in the streams runs (and the decode runs) unless --tokens says
KINDS = ("ttft", "streams", "decode", "speculative", "cold")
# the study's regimes by name (a row's `regime`, --only): what a run measured, decided by its mode's card (row_of)
TTFT, STREAMS, DECODE, SPECULATIVE, COLD = KINDS
COLD_PROMPT = PROMPT_TOKENS[-1]


@dataclass(frozen=True)
class RegimeRow(JsonRecord):
    """One measured point of the regime map."""

    regime: str  # one of KINDS
    label: str
    unit: str  # "s" (ttft) or "tok/s" (aggregate for streams)
    measured: float
    predicted: float
    error_pct: float
    prompt_tokens: int | None = None
    rate_mbit: float | None = None  # the ring's link rate; 0 = unlimited
    serialization_s: float | None = None
    streams: int | None = None
    batching: str | None = None
    per_stream_tok_s: float | None = None  # median over the streams
    per_stream_predicted_tok_s: float | None = None
    per_stream_min_tok_s: float | None = None
    ceiling_tok_s: float | None = None
    busiest_stage: float | None = None  # measured utilization of the busiest stage
    dilation: float = 1.0


@dataclass(frozen=True)
class RegimesResult(JsonRecord):
    scenario: str
    shaper: str
    stages: int
    t_ring_s: float
    compute_s: float  # emulated C of one decode lap
    rows: tuple[RegimeRow, ...]


def knee(scenario: Scenario) -> float | None:
    """(C + T_ring) / c_max: the streams a ring holds before its slowest stage is busy all the time."""
    slowest = max(st.cost_ms() for st in scenario.stages) / 1e3
    return (scenario.emulated_compute_s + scenario.t_ring_s) / slowest if slowest > 0 else None


def stream_counts(n_stages: int, knee_streams: float | None = None) -> list[int]:
    """M in {1, 2, N, 2N, 4N}, each once, in order; and twice the knee, past which (without batching) the
    aggregate stops growing at 1 / c_max."""
    counts = {1, 2, n_stages, 2 * n_stages, 4 * n_stages}
    if knee_streams is not None:
        counts.add(min(MAX_STREAMS, 2 * math.ceil(knee_streams)))
    return sorted(counts)


def plan(scenario: Scenario, kinds: tuple[str, ...], tokens: int,
         streams: list[int] | None = None) -> list[tuple[str, list[str]]]:
    """(label, --set overrides) of every run the regime map needs (`streams`: the M values, default stream_counts)."""
    runs: list[tuple[str, list[str]]] = []
    base_rate = scenario.ring[0].rate_mbit if scenario.ring else 0.0
    if TTFT in kinds:
        for rate in dict.fromkeys((base_rate, SLOW_RATE_MBIT)):
            for p in PROMPT_TOKENS:
                runs.append((f"ttft P={p} W={'unlimited' if not rate else f'{rate:g} Mbit/s'}",
                             ["decode.mode=plain", f"decode.prompt_tokens={p}", "decode.tokens=2",
                              f"network.rate_mbit={rate}"]))
    if STREAMS in kinds:
        for batching in ("none", "continuous"):
            for m in streams or stream_counts(scenario.n_stages, knee(scenario)):
                runs.append((f"streams M={m} {batching}", ["decode.mode=streams", f"decode.streams={m}",
                                                            f"decode.batching={batching}", f"decode.tokens={tokens}"]))
    if DECODE in kinds:
        runs.append(("decode (one stream)", ["decode.mode=plain", f"decode.tokens={tokens}"]))
    if SPECULATIVE in kinds:
        runs.append(("speculative (one stream)", ["decode.mode=speculative", f"decode.tokens={tokens}"]))
    if COLD in kinds:
        for rate in dict.fromkeys((base_rate, SLOW_RATE_MBIT)):
            runs.append((f"cold P={COLD_PROMPT} W={'unlimited' if not rate else f'{rate:g} Mbit/s'} (kernel TCP)",
                         ["decode.mode=plain", f"decode.prompt_tokens={COLD_PROMPT}", "decode.tokens=2",
                          f"network.rate_mbit={rate}", 'network.transport="kernel"']))
    return runs


def row_of(label: str, summary: RunSummary, scenario: Scenario) -> RegimeRow:
    factor = summary.dilation.factor if summary.dilation else 1.0
    mode = MODES[scenario.decode.mode]
    if label.startswith(("ttft", "cold")):
        t = summary.ttft
        return RegimeRow(TTFT if label.startswith("ttft") else COLD, label, "s", t.measured_s, t.predicted_s, (t.measured_s / t.predicted_s - 1) * 100,
                         prompt_tokens=t.prompt_tokens, rate_mbit=scenario.ring[0].rate_mbit if scenario.ring else 0.0,
                         serialization_s=t.serialization_s, dilation=factor)
    if mode.per_stream:  # several streams in flight: the aggregate against the per-stream rate
        st = summary.streams
        return RegimeRow(STREAMS, label, "tok/s", st.aggregate_tok_s, st.aggregate_predicted_tok_s,
                         st.aggregate_error_pct, streams=st.streams, batching=st.batching,
                         per_stream_tok_s=st.per_stream_p50_tok_s, per_stream_predicted_tok_s=st.per_stream_predicted_tok_s,
                         per_stream_min_tok_s=st.per_stream_min_tok_s, ceiling_tok_s=st.ceiling_tok_s,
                         busiest_stage=max(st.stage_busy), dilation=factor)
    regime = SPECULATIVE if mode.spec_headline else DECODE
    return RegimeRow(regime, label, "tok/s", summary.measured_tok_s, summary.predicted_tok_s, summary.error_pct,
                     streams=1, per_stream_tok_s=summary.measured_tok_s,
                     per_stream_predicted_tok_s=summary.predicted_tok_s, dilation=factor)


def table(result: RegimesResult) -> Table:
    out = Table(title=f"Regime map of {result.scenario} ({result.stages} stages, C {result.compute_s * 1e3:.1f} ms, "
                      f"T_ring {result.t_ring_s * 1e3:.1f} ms, {result.shaper}): measured vs predicted")
    for col in ("regime", "measured", "predicted", "err %", "per-stream p50 / min / pred", "ceiling", "busiest", "D"):
        out.add_column(col, justify="right" if col != "regime" else "left")
    for row in result.rows:
        fmt = (lambda v: f"{v * 1e3:.1f} ms") if row.unit == "s" else (lambda v: f"{v:.2f} tok/s")
        per = (f"{row.per_stream_tok_s:.2f} / {row.per_stream_min_tok_s:.2f} / {row.per_stream_predicted_tok_s:.2f}"
               if row.per_stream_min_tok_s is not None else
               f"{row.per_stream_tok_s:.2f} / - / {row.per_stream_predicted_tok_s:.2f}" if row.per_stream_tok_s else "")
        label = row.label + (f" (ser. {row.serialization_s * 1e3:.1f} ms)" if row.serialization_s else "")
        out.add_row(label, fmt(row.measured), fmt(row.predicted), f"{row.error_pct:+.2f}", per,
                    f"{row.ceiling_tok_s:.1f}" if row.ceiling_tok_s else "",
                    f"{row.busiest_stage:.0%}" if row.busiest_stage is not None else "", f"{row.dilation:g}")
    return out


async def measure(scenario_name: str, args: argparse.Namespace, kinds: tuple[str, ...], tokens: int,
                  log) -> RegimesResult:
    from testbed.launch.launcher import run_scenario

    base = make_scenario(scenario_name, overrides=list(args.overrides))
    if STREAMS in kinds and base.n_stages < 2:
        raise ConfigError(f"{base.name} has one stage: streams in flight need a ring (use --only without streams)",
                          source=base.source, key="stages")
    rows, shaper = [], "?"
    runs = plan(base, kinds, tokens, args.streams)
    plan_runs(len(runs))
    for i, (label, overrides) in enumerate(runs):
        scenario = make_scenario(scenario_name, overrides=list(args.overrides) + overrides)
        log(f"[{i + 1}/{len(runs)}] {label}")
        summary = await run_scenario(scenario, args.shaper, log=lambda m: None, dilation=args.dilation,
                                     compensate=args.compensate)
        shaper = summary.shaper
        row = row_of(label, summary, scenario)
        log(f"      measured {row.measured:.4g} {row.unit}, predicted {row.predicted:.4g} ({row.error_pct:+.2f}%)")
        rows.append(row)
    return RegimesResult(base.name, shaper, base.n_stages, base.t_ring_s, base.emulated_compute_s, tuple(rows))


def run(args: argparse.Namespace, console: Console) -> RegimesResult:
    kinds = tuple(k.strip() for k in args.only.split(",") if k.strip()) if args.only else KINDS
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ConfigError(f"expected parts from {', '.join(KINDS)}, got {args.only!r}", key="--only")
    tokens = args.tokens or STREAM_TOKENS
    if args.streams is not None and not all(1 <= m <= MAX_STREAMS for m in args.streams):
        raise ConfigError(f"expected stream counts in [1, {MAX_STREAMS}], got {args.streams}", key="--streams")
    if tokens < 2:
        raise ConfigError(f"expected --tokens >= 2, got {tokens}", key="--tokens")
    ensure_models_on(console)
    return trio.run(measure, args.scenario, args, kinds, tokens, log_to(console))


def show(result: RegimesResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result)])
    write_json(results_path(args, "regimes", result.scenario), result.to_json(indent=2), console)
