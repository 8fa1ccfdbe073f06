"""python -m testbed tp: pipeline vs tensor parallelism on the same links and N (seed 000, Eq. 8), measured.

PP hands the hidden state on once per stage: a token costs C + T_ring. TP (agents.modes.tp) splits every layer over the
N agents and all-reduces twice per layer: a token costs 2 L all-reduces, each 2 (N - 1) serial hops on a ring
all-reduce or one direct exchange on all-to-all (physics.tp_token_s). For each --hop-scale (every link's one-way
delay multiplied by it) both run on the same ring and the table shows per-token latency measured next to
predicted, the measured TP/PP ratio next to the exact one for the all-reduce used and to Eq. 8's 4 L / N.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import trio
from rich.console import Console
from rich.table import Table

from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, log_to, make_scenario, plan_runs,
                                  print_tables, results_path, write_json)
from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.scenario.config import Scenario
from testbed.scenario.validate import listed

TOKENS = 6  # per run: the first is the prompt's lap, the rest are the decode tokens measured


@dataclass(frozen=True)
class TpRow(JsonRecord):
    hop_scale: float
    mean_link_ms: float  # mean one-way delay of the ring's links at this scale
    pp_token_ms: float
    pp_predicted_token_ms: float
    tp_token_ms: float
    tp_predicted_token_ms: float
    ratio_measured: float
    ratio_predicted: float  # TP's predicted over PP's predicted: the exact ratio for this all-reduce
    ratio_bound: float  # Eq. 8: 4 L / N
    tp_bytes_per_token: float  # sent by one rank
    pp_bytes_per_token: float  # over one hop
    same_tokens: bool  # the TP run decoded the PP run's tokens (greedy)
    dilation: float = 1.0  # the TP run's D
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class TpResult(JsonRecord):
    scenario: str
    shaper: str
    ranks: int
    layers: int
    allreduce: str
    tp_rows: tuple[TpRow, ...]


def scaled_links(sc: Scenario, factor: float) -> Scenario:
    """Every link's one-way delay (and jitter) times `factor`; compute stays."""
    return dataclasses.replace(sc, links=tuple(dataclasses.replace(link, delay_ms=link.delay_ms * factor,
                                                                   jitter_ms=link.jitter_ms * factor)
                                               for link in sc.links))


async def measure(args: argparse.Namespace, scales: list[float], log) -> TpResult:
    from testbed.launch.launcher import run_scenario

    common = list(args.overrides) + [f"decode.tokens={args.tokens or TOKENS}", "decode.temperature=0"]
    pp_base = make_scenario(args.scenario, overrides=common)
    tp_base = make_scenario(args.scenario, overrides=common + ["parallel=tp", f"tp.allreduce={args.allreduce}"])
    rows, shaper, layers = [], "?", 0
    plan_runs(2 * len(scales))
    for i, factor in enumerate(scales):
        pp_sc, tp_sc = scaled_links(pp_base, factor), scaled_links(tp_base, factor)
        log(f"[{i + 1}/{len(scales)}] links x{factor:g}: PP ({pp_sc.n_stages} stages), then TP ({args.allreduce})")
        pp = await run_scenario(pp_sc, args.shaper, log=lambda m: None, dilation=args.dilation)
        tp = await run_scenario(tp_sc, args.shaper, log=lambda m: None, dilation=args.dilation)
        shaper, t = tp.shaper, tp.tp
        if t is None or not pp.measured_tok_s:
            raise ConfigError("a run decoded no tokens past the prompt: raise --tokens", key="--tokens")
        layers = t.layers
        pp_ms, pp_pred_ms = 1e3 / pp.measured_tok_s, 1e3 / pp.predicted_tok_s
        row = TpRow(factor, sum(link.delay_ms for link in pp_sc.ring) / len(pp_sc.ring), pp_ms, pp_pred_ms,
                    t.token_ms, t.predicted_token_ms, t.token_ms / pp_ms, t.predicted_token_ms / pp_pred_ms,
                    t.ratio_bound, t.bytes_per_token, sum(h.bytes_per_lap or 0 for h in pp.per_hop) / len(pp.per_hop),
                    tp.token_ids == pp.token_ids, **dilation_of(tp))
        log(f"      PP {pp_ms:.1f} ms (pred {pp_pred_ms:.1f}), TP {t.token_ms:.1f} ms (pred {t.predicted_token_ms:.1f}): "
            f"TP/PP {row.ratio_measured:.2f} (exact {row.ratio_predicted:.2f}, Eq. 8 bound {row.ratio_bound:.2f})")
        rows.append(row)
    return TpResult(pp_base.name, shaper, pp_base.n_stages, layers, args.allreduce, tuple(rows))


def table(result: TpResult) -> Table:
    out = Table(title=f"PP vs TP on {result.scenario} ({result.ranks} "
                      f"agents, {result.layers} layers, {result.allreduce} all-reduce, {result.shaper}): per-token "
                      f"latency, measured vs predicted")
    for col in ("links x", "mean link ms", "PP ms meas / pred", "TP ms meas / pred", "TP err %", "TP/PP meas",
                "TP/PP exact", "4L/N", "TP B/token", "PP B/hop", "same tokens", "D"):
        out.add_column(col, justify="right")
    for r in result.tp_rows:
        out.add_row(f"{r.hop_scale:g}", f"{r.mean_link_ms:.1f}", f"{r.pp_token_ms:.1f} / {r.pp_predicted_token_ms:.1f}",
                    f"{r.tp_token_ms:.1f} / {r.tp_predicted_token_ms:.1f}",
                    f"{(r.tp_token_ms / r.tp_predicted_token_ms - 1) * 100:+.2f}", f"{r.ratio_measured:.2f}",
                    f"{r.ratio_predicted:.2f}", f"{r.ratio_bound:.2f}", f"{r.tp_bytes_per_token:.0f}",
                    f"{r.pp_bytes_per_token:.0f}", "yes" if r.same_tokens else "no",
                    dilation_cell(r.dilation, r.capped_error_pct, duration=True))
    return out


def run(args: argparse.Namespace, console: Console) -> TpResult:
    scales = listed(args.hop_scale, "--hop-scale", "link scales like 0.25,0.5,1 (each in (0, 100])", float,
                    lambda v: 0 < v <= 100)
    if args.tokens is not None and args.tokens < 3:
        raise ConfigError(f"expected --tokens >= 3 (the prompt's lap and two decode tokens), got {args.tokens}",
                          key="--tokens")
    ensure_models_on(console)
    return trio.run(measure, args, scales, log_to(console))


def show(result: TpResult, args: argparse.Namespace, console: Console) -> None:
    print_tables(console, [table(result)])
    write_json(results_path(args, "tp", result.scenario), result.to_json(indent=2), console)
