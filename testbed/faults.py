"""python -m testbed faults SCENARIO: jitter and loss on every link, measured against the model (issue 15).

Each row is a run of the scenario with every link given the jitter (a standard deviation, ms) or the loss (%) of
that row, and greedy decoding, so the output must equal the clean run's token for token: faults delay data, they
never corrupt it. The model of a plain-decode lap, C + sum over the N hops, one frame in flight per hop (so FIFO
never holds a frame behind another):
- jitter: a hop takes max(0, l + sigma Z) (the relay clamps at 0): mean l Phi(l / sigma) + sigma phi(l / sigma);
- loss on a reliable transport: a frame lost on a hop arrives one retransmission timeout later (the relay's model,
  network.loss_rto_ms), so a lap costs C + T_ring + k RTO with k ~ Binomial(N, p).
The p99 of both is the quantile of that sum (jitter: a seeded Monte Carlo; loss: the binomial). On the kernel
backend (netem drops real packets) the kernel's TCP retransmits and the row reports what it measured against
the same model: the difference is how Linux recovers a lost segment (tail-loss probe, RTO from the measured RTT
with a 200 ms floor), not the relay's fixed RTO.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from testbed import api
from testbed.config import Scenario
from testbed.core.records import JsonRecord
from testbed.validate import listed

JITTERS_MS = (0.0, 1.0, 5.0, 20.0)
LOSSES_PCT = (0.0, 0.1, 1.0, 5.0)
TOKENS = 48
SAMPLES = 200_000


@dataclass(frozen=True)
class FaultRow(JsonRecord):
    fault: str  # "jitter" or "loss"
    value: float  # ms or %
    laps: int
    lap_ms: float
    lap_ms_p99: float
    predicted_ms: float
    predicted_ms_p99: float
    error_pct: float
    same_output: bool  # greedy tokens equal to the clean run's
    lost_pct: float = 0.0  # loss: the share of the laps' hops that took a timeout (the seeded draws' realization)
    predicted_lost_ms: float = 0.0  # loss: the model with that realized share (the mechanism, not the luck)


@dataclass(frozen=True)
class FaultsResult(JsonRecord):
    scenario: str
    shaper: str
    compute_ms: float
    t_ring_ms: float
    rto_ms: float
    fault_rows: tuple[FaultRow, ...]


def with_fault(sc: Scenario, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Scenario:
    return dataclasses.replace(sc, links=tuple(dataclasses.replace(link, jitter_ms=jitter_ms, loss_pct=loss_pct)
                                               for link in sc.links))


def jitter_lap_s(compute_s: float, hops_s: list[float], sigma_s: float, seed: int = 0) -> tuple[float, float]:
    """(mean, p99) of C + sum_i max(0, l_i + sigma Z_i)."""
    if sigma_s <= 0:
        return compute_s + sum(hops_s), compute_s + sum(hops_s)
    mean = sum(l * _phi_cdf(l / sigma_s) + sigma_s * _phi_pdf(l / sigma_s) for l in hops_s)
    rng = np.random.default_rng(seed)
    draws = np.maximum(0.0, np.array(hops_s)[None, :] + sigma_s * rng.standard_normal((SAMPLES, len(hops_s))))
    return compute_s + mean, compute_s + float(np.percentile(draws.sum(axis=1), 99))


def loss_lap_s(compute_s: float, t_ring_s: float, n_hops: int, p: float, rto_s: float) -> tuple[float, float]:
    """(mean, p99) of C + T_ring + k RTO, k ~ Binomial(n_hops, p)."""
    base = compute_s + t_ring_s
    cdf, k = 0.0, 0
    while k <= n_hops:
        cdf += math.comb(n_hops, k) * p ** k * (1 - p) ** (n_hops - k)
        if cdf >= 0.99:
            break
        k += 1
    return base + n_hops * p * rto_s, base + k * rto_s


def lost_share(runlog, rto_s: float) -> float:
    """The share of the decode laps' hops that took more than half a timeout over their configured delay."""
    sc = runlog.scenario
    extra = [h - link.delay_ms / 1e3 for lap in runlog.laps if lap.kind == "decode"
             for h, link in zip(lap.hop_latencies_s(), sc.ring)]
    return sum(e > rto_s / 2 for e in extra) / len(extra) if extra else 0.0


def _phi_pdf(x: float) -> float:
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _phi_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


async def measure(args: argparse.Namespace, jitters: list[float], losses: list[float], log) -> FaultsResult:
    from testbed.launcher import run_scenario
    from testbed.runlog import RunLog

    base = with_fault(api.scenario(args.scenario, overrides=list(args.overrides) + [
        f"decode.tokens={args.tokens or TOKENS}", "decode.temperature=0", "decode.mode=plain"]))
    rows, shaper, clean_ids, compute = [], "?", None, 0.0
    hops = [link.delay_ms / 1e3 for link in base.ring]
    for fault, values in (("jitter", jitters), ("loss", losses)):
        for value in values:
            sc = with_fault(base, **({"jitter_ms": value * base.scale} if fault == "jitter" else {"loss_pct": value}))
            log(f"{fault} {value:g} {'ms' if fault == 'jitter' else '%'}...")
            runlog = RunLog(sc)
            summary = await run_scenario(sc, args.shaper, runlog=runlog, log=lambda m: None, dilation=args.dilation)
            shaper, compute = summary.shaper, summary.compute_s or 0.0
            if value == 0 and clean_ids is None:
                clean_ids = summary.token_ids
            laps = np.array([lap.duration_s for lap in runlog.laps if lap.kind == "decode"])
            if fault == "jitter":
                mean, p99 = jitter_lap_s(compute, hops, value * base.scale / 1e3, seed=int(value * 1000))
            else:
                mean, p99 = loss_lap_s(compute, base.t_ring_s, len(hops), value / 100, base.loss_rto_ms / 1e3)
            lost = lost_share(runlog, base.loss_rto_ms / 1e3) if fault == "loss" else 0.0
            realized = loss_lap_s(compute, base.t_ring_s, len(hops), lost, base.loss_rto_ms / 1e3)[0]
            rows.append(FaultRow(fault, value, len(laps), float(laps.mean()) * 1e3, float(np.percentile(laps, 99)) * 1e3,
                                 mean * 1e3, p99 * 1e3, (float(laps.mean()) / mean - 1) * 100,
                                 clean_ids is None or summary.token_ids == clean_ids, lost * 100,
                                 realized * 1e3 if fault == "loss" else mean * 1e3))
            r = rows[-1]
            log(f"      lap {r.lap_ms:.1f} ms (predicted {r.predicted_ms:.1f}), p99 {r.lap_ms_p99:.1f} "
                f"({r.predicted_ms_p99:.1f}), output {'identical' if r.same_output else 'DIFFERENT'}")
    return FaultsResult(base.name, shaper, compute * 1e3, base.t_ring_s * 1e3, base.loss_rto_ms, tuple(rows))


def table(result: FaultsResult) -> Table:
    out = Table(title=f"Faults on {result.scenario} ({result.shaper}; T_ring {result.t_ring_ms:.1f} ms, RTO "
                      f"{result.rto_ms:g} ms): lap measured vs the model")
    for col in ("fault", "laps", "mean lap ms meas / pred", "err %", "p99 lap ms meas / pred", "hops lost %",
                "pred. with that", "output"):
        out.add_column(col, justify="right")
    for r in result.fault_rows:
        label = f"jitter {r.value:g} ms" if r.fault == "jitter" else f"loss {r.value:g}%"
        loss = r.fault == "loss" and r.value > 0
        out.add_row(label, str(r.laps), f"{r.lap_ms:.1f} / {r.predicted_ms:.1f}", f"{r.error_pct:+.2f}",
                    f"{r.lap_ms_p99:.1f} / {r.predicted_ms_p99:.1f}", f"{r.lost_pct:.2f}" if loss else "",
                    f"{r.predicted_lost_ms:.1f}" if loss else "", "identical" if r.same_output else "DIFFERENT")
    out.caption = ("loss: the model with the configured p (err %), and with the share of hops that did take a "
                   "timeout (the seeded draws: the mechanism, not the luck)")
    return out


def main(args: argparse.Namespace, console: Console) -> int:
    jitters = listed(args.jitters, "--jitters", "jitters in ms within [0, 10000], like 0,1,5,20", float,
                     lambda v: 0 <= v <= 10_000)
    losses = listed(args.losses, "--losses", "loss percentages within [0, 100], like 0,0.1,1,5", float,
                    lambda v: 0 <= v <= 100)
    api.ensure_models(lambda message: console.print(f"[bold]{message}"))
    result = trio.run(measure, args, jitters, losses, lambda m: console.print(m, markup=False, highlight=False))
    wide = console if console.width >= 120 else Console(width=120)
    wide.print(table(result))
    path = Path(args.json or f"results/faults-{Path(args.scenario).stem}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(result.to_json(indent=2) + "\n")
    console.print(f"JSON: {path}")
    return 0
