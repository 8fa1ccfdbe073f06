"""python -m testbed dsd: speculation at a distance (seeds 002/003), measured across the edge link's RTT.

Per RTT, one request of decode.tokens tokens in each of four ways, measured next to its closed form:
- co-located SD (the draft beside the target, `decode.mode = "speculative"`): the server's prompt and rounds, plus
  the client's RTT once (the prompt goes up, the last token comes down);
- synchronous DSD (`spec.placement = "edge"`): every round's drafts cross the link and its verdict comes back;
- pipelined DSD (`spec.pipelined`): the edge drafts ahead while a round is verified;
- cloud autoregressive decoding (`decode.mode = "plain"`), plus the RTT once.
Co-located and autoregressive runs do not depend on the RTT, so each is measured once and the RTT added.
The pipelined crossover (the RTT below which pipelined DSD beats co-located SD) is interpolated from the measured
rows and set next to physics.pipelined_crossover_rtt_s with the measured t_d, t_v and hit rate. Then capacity:
the saturated server's throughput with every client's draft offloaded (--clients edge clients) against the
co-located server's, next to 1 + K t_d / t_v; and, the referee's question, alpha-hat, t_d and t_v per run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import trio
from rich.console import Console
from rich.table import Table

from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, log_to, make_scenario, plan_runs,
                                  print_tables, results_path, write_json)
from testbed.core import physics
from testbed.core.decode import MAX_CLIENTS
from testbed.core.records import JsonRecord
from testbed.core.summary import RunSummary
from testbed.scenario.validate import listed

RTTS_MS = (5.0, 10.0, 20.0, 50.0, 100.0, 200.0)
TOKENS = 40


def colocated_request(summary: RunSummary, rtt_s: float) -> tuple[float, float]:
    """(measured, predicted) seconds of a co-located SD request: prompt + rounds on the server, + the RTT once."""
    spec, ttft = summary.spec, summary.ttft
    measured = ttft.measured_s + spec.rounds * spec.round_s + rtt_s
    round_s = physics.dsd_round_s("colocated", round(spec.k), spec.draft_per_token_s, spec.verify_compute_s
                                  + summary.t_ring_s)
    return measured, ttft.predicted_s + spec.rounds * round_s + rtt_s


def autoregressive_request(summary: RunSummary, rtt_s: float) -> tuple[float, float]:
    """(measured, predicted) seconds of a cloud autoregressive request: prompt + one lap a token, + the RTT once."""
    laps = summary.laps
    return (summary.ttft.measured_s + summary.wall_s + rtt_s,
            summary.ttft.predicted_s + laps / summary.predicted_tok_s + rtt_s)


@dataclass(frozen=True)
class DsdRow(JsonRecord):
    rtt_ms: float
    colocated_ms: float
    colocated_predicted_ms: float
    sync_ms: float
    sync_predicted_ms: float
    pipelined_ms: float
    pipelined_predicted_ms: float
    autoregressive_ms: float
    autoregressive_predicted_ms: float
    alpha_hat: float | None  # the referee's question: do these move with the RTT?
    draft_ms_per_token: float
    verify_ms: float
    hit_rate: float
    dilation: float = 1.0
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class CapacityRow(JsonRecord):
    clients: int
    batching: str  # "none": one verification at a time; "continuous": every queued round in one pass
    aggregate_tok_s: float
    predicted_aggregate_tok_s: float
    server_busy: float
    batch_mean: float
    verify_ms: float  # t_v as the run measured it (a batched pass's, with batching: the referee's point)
    per_client_tok_s: float
    dilation: float = 1.0
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class JitterRow(JsonRecord):
    """The referee's question: synchronous DSD at one RTT with a jittery edge link, against the fixed-parameter form."""

    rtt_ms: float
    jitter_ms: float  # standard deviation of the round trip (each direction: jitter / sqrt 2)
    request_ms: float
    predicted_request_ms: float  # the jitter-free closed form with this run's t_d, t_v and Gamma
    error_pct: float
    alpha_hat: float | None
    draft_ms_per_token: float
    verify_ms: float
    round_ms: float
    dilation: float = 1.0
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class DsdResult(JsonRecord):
    scenario: str
    shaper: str
    k: int
    tokens: int
    dsd_rows: tuple[DsdRow, ...]
    crossover_rtt_ms: float | None  # measured: where pipelined DSD stops beating co-located SD (None: not on the grid)
    crossover_predicted_rtt_ms: float
    ar_crossover_rtt_ms: float | None  # measured: where synchronous DSD stops beating cloud autoregressive decoding
    ar_crossover_predicted_rtt_ms: float  # physics.dsd_beats_ar_below_rtt_s (negative: never)
    colocated_tok_s: float  # the co-located server's throughput: one request at a time, draft and target
    capacity: tuple[CapacityRow, ...]
    multiplier_measured: float | None  # the most clients' aggregate (no batching) over colocated_tok_s
    multiplier_predicted: float  # 1 + K t_d / t_v
    jitter: tuple[JitterRow, ...]
    target_tok_s: float  # a per-client rate: how many clients does the server sustain at it?
    clients_colocated: int  # colocated_tok_s / target: the server drafting and verifying for all of them
    clients_offloaded: int  # the most clients measured (no batching) that each still got the target rate


def crossover(rows: list[DsdRow], mode: str = "pipelined", against: str = "colocated") -> float | None:
    """The RTT where `mode` minus `against` request latency turns positive, linear between grid points."""
    gaps = [(r.rtt_ms, getattr(r, f"{mode}_ms") - getattr(r, f"{against}_ms"))
            for r in sorted(rows, key=lambda r: r.rtt_ms)]
    for (x0, g0), (x1, g1) in zip(gaps, gaps[1:]):
        if g0 < 0 <= g1:
            return x0 + (x1 - x0) * (-g0) / (g1 - g0)
    return None


async def measure(args: argparse.Namespace, rtts: list[float], clients: list[int], jitters: list[float],
                  log) -> DsdResult:
    from testbed.launch.launcher import run_scenario

    base = list(args.overrides) + [f"decode.tokens={args.tokens or TOKENS}"]

    async def run(label: str, overrides: list[str]) -> RunSummary:
        log(label)
        sc = make_scenario(args.scenario, overrides=base + overrides)
        return await run_scenario(sc, args.shaper, log=lambda m: None, dilation=args.dilation)

    plan_runs(2 + 2 * len(rtts) + len(clients) + (1 if clients else 0) + len(jitters))
    colocated = await run("co-located SD", ["decode.mode=speculative", "spec.placement=colocated"])
    plain = await run("cloud autoregressive", ["decode.mode=plain", "spec.placement=colocated"])
    k = round(colocated.spec.k)
    rows = []
    for rtt in rtts:
        edge = ["decode.mode=speculative", "spec.placement=edge", f"spec.rtt_ms={rtt}"]
        sync_run = await run(f"RTT {rtt:g} ms: synchronous DSD", edge)
        sync = sync_run.dsd
        pipe = (await run(f"RTT {rtt:g} ms: pipelined DSD", edge + ["spec.pipelined=true"])).dsd
        rows.append(DsdRow(rtt, *(x * 1e3 for x in colocated_request(colocated, rtt / 1e3)), sync.request_ms,
                           sync.predicted_request_ms, pipe.request_ms, pipe.predicted_request_ms,
                           *(x * 1e3 for x in autoregressive_request(plain, rtt / 1e3)), sync.alpha_hat,
                           sync.draft_ms_per_token, sync.verify_ms, pipe.hit_rate, **dilation_of(sync_run)))
        log(f"      co-located {rows[-1].colocated_ms:.0f}, sync {sync.request_ms:.0f} (pred "
            f"{sync.predicted_request_ms:.0f}), pipelined {pipe.request_ms:.0f} (pred {pipe.predicted_request_ms:.0f}) ms")
    t_d, t_v = rows[0].draft_ms_per_token / 1e3, rows[0].verify_ms / 1e3
    predicted_crossover = physics.pipelined_crossover_rtt_s(k, t_d, t_v, sum(r.hit_rate for r in rows) / len(rows))
    capacity = []
    runs = [(e, "none") for e in clients] + ([(max(clients), "continuous")] if clients else [])
    for e, batching in runs:
        whole = await run(f"capacity: {e} edge clients, batching {batching}",
                          ["decode.mode=speculative", "spec.placement=edge", f"spec.rtt_ms={rtts[0]}",
                           f"spec.clients={e}", f"decode.batching={batching}"])
        summary = whole.dsd
        capacity.append(CapacityRow(e, batching, summary.aggregate_tok_s, summary.predicted_aggregate_tok_s,
                                    summary.server_busy, summary.batch_mean, summary.verify_ms,
                                    summary.aggregate_tok_s / e, **dilation_of(whole)))
    jitter = []
    for j in jitters:
        whole = await run(f"RTT {rtts[-1]:g} ms, jitter {j:g} ms: synchronous DSD",
                          ["decode.mode=speculative", "spec.placement=edge", f"spec.rtt_ms={rtts[-1]}",
                           f"spec.jitter_ms={j}"])
        d = whole.dsd
        jitter.append(JitterRow(rtts[-1], j, d.request_ms, d.predicted_request_ms, d.error_pct, d.alpha_hat,
                                d.draft_ms_per_token, d.verify_ms, d.round_ms, **dilation_of(whole)))
    colocated_rate = colocated.spec.measured_tok_s
    plain_rows = [c for c in capacity if c.batching == "none"]
    best = max((c.aggregate_tok_s for c in plain_rows), default=None)
    target = args.target_rate or colocated_rate / 2
    gamma_ = colocated.spec.gamma_measured
    ar_rtt = physics.dsd_beats_ar_below_rtt_s(gamma_, 1 / plain.measured_tok_s, k, t_d, t_v)
    return DsdResult(args.scenario, colocated.shaper, k, args.tokens or TOKENS, tuple(rows), crossover(rows),
                     predicted_crossover * 1e3, crossover(rows, "sync", "autoregressive"), ar_rtt * 1e3,
                     colocated_rate, tuple(capacity),
                     best / colocated_rate if best else None, physics.capacity_multiplier(k, t_d, t_v),
                     tuple(jitter), target,
                     int(colocated_rate / target),
                     max((c.clients for c in plain_rows if c.per_client_tok_s >= target), default=0))


def tables(result: DsdResult) -> list[Table]:
    latency = Table(title=f"{result.scenario}: one request of {result.tokens} tokens (K = {result.k}), ms, "
                          f"measured / predicted ({result.shaper})")
    for col in ("RTT ms", "co-located SD", "sync DSD", "pipelined DSD", "cloud AR", "alpha-hat", "t_d ms", "t_v ms",
                "hit rate", "D (sync)"):
        latency.add_column(col, justify="right")
    for r in result.dsd_rows:
        latency.add_row(f"{r.rtt_ms:g}", f"{r.colocated_ms:.0f} / {r.colocated_predicted_ms:.0f}",
                        f"{r.sync_ms:.0f} / {r.sync_predicted_ms:.0f}", f"{r.pipelined_ms:.0f} / "
                        f"{r.pipelined_predicted_ms:.0f}", f"{r.autoregressive_ms:.0f} / "
                        f"{r.autoregressive_predicted_ms:.0f}", f"{r.alpha_hat:.3f}" if r.alpha_hat is not None else "-",
                        f"{r.draft_ms_per_token:.2f}", f"{r.verify_ms:.2f}", f"{r.hit_rate:.2f}",
                        dilation_cell(r.dilation, r.capped_error_pct, duration=True))
    measured = f"{result.crossover_rtt_ms:.1f} ms" if result.crossover_rtt_ms is not None else "not on the grid"
    ar = f"{result.ar_crossover_rtt_ms:.1f} ms" if result.ar_crossover_rtt_ms is not None else "not on the grid"
    latency.caption = (f"pipelined DSD beats co-located SD below RTT {measured} measured, "
                       f"{result.crossover_predicted_rtt_ms:.1f} ms predicted; synchronous DSD beats cloud AR below "
                       f"{ar} measured, {result.ar_crossover_predicted_rtt_ms:.1f} ms predicted (negative: never)")
    capacity = Table(title=f"Capacity: the server verifying only, edge clients drafting (co-located server: "
                           f"{result.colocated_tok_s:.1f} tok/s)")
    for col in ("clients", "batching", "aggregate tok/s", "predicted", "per client", "server busy", "batch", "t_v ms",
                "D"):
        capacity.add_column(col, justify="right")
    for c in result.capacity:
        capacity.add_row(str(c.clients), c.batching, f"{c.aggregate_tok_s:.1f}", f"{c.predicted_aggregate_tok_s:.1f}",
                         f"{c.per_client_tok_s:.1f}", f"{c.server_busy:.0%}", f"{c.batch_mean:.2f}",
                         f"{c.verify_ms:.1f}", dilation_cell(c.dilation, c.capped_error_pct))
    if result.multiplier_measured is not None:
        capacity.caption = (f"multiplier: {result.multiplier_measured:.2f} measured, 1 + K t_d / t_v = "
                            f"{result.multiplier_predicted:.2f}; at {result.target_tok_s:.1f} tok/s a client the server "
                            f"sustains {result.clients_colocated} clients drafting itself, {result.clients_offloaded} "
                            f"with the drafts offloaded (of those measured)")
    jitter = Table(title="The referee's question: do the fixed-parameter forms hold on a jittery edge link? "
                         "(synchronous DSD)")
    for col in ("RTT ms", "jitter ms", "request ms meas / pred", "err %", "round ms", "alpha-hat", "t_d ms", "t_v ms",
                "D"):
        jitter.add_column(col, justify="right")
    for j in result.jitter:
        flag = " (off)" if abs(j.error_pct) > 5 else ""
        jitter.add_row(f"{j.rtt_ms:g}", f"{j.jitter_ms:g}", f"{j.request_ms:.0f} / {j.predicted_request_ms:.0f}",
                       f"{j.error_pct:+.2f}{flag}", f"{j.round_ms:.1f}",
                       f"{j.alpha_hat:.3f}" if j.alpha_hat is not None else "-", f"{j.draft_ms_per_token:.2f}",
                       f"{j.verify_ms:.2f}", dilation_cell(j.dilation, j.capped_error_pct, duration=True))
    return [latency, capacity] + ([jitter] if result.jitter else [])


def run(args: argparse.Namespace, console: Console) -> DsdResult:
    rtts = listed(args.rtts, "--rtts", "round trips in ms within [0, 10000], like 5,10,20", float,
                  lambda v: 0 <= v <= 10_000)
    clients = listed(args.clients, "--clients", f"client counts within [1, {MAX_CLIENTS}], like 1,2,4", int,
                     lambda v: 1 <= v <= MAX_CLIENTS) if args.clients else []
    jitters = listed(args.jitters, "--jitters", "jitters in ms within [0, 1000], like 0,5,20", float,
                     lambda v: 0 <= v <= 1_000) if args.jitters else []
    ensure_models_on(console)
    return trio.run(measure, args, rtts, clients, jitters, log_to(console))


def show(result: DsdResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, tables(result))
    write_json(results_path(args, "dsd", args.scenario), result.to_json(indent=2), console)
