"""python -m testbed faults SCENARIO: jitter and loss on every link, measured against the model (issue 15).

Each row is a run of the scenario with every link given the jitter (a standard deviation, ms) or the loss (%) of
that row, and greedy decoding, so the output must equal the clean run's token for token: faults delay data, they
never corrupt it. The model of a plain-decode lap, C + sum over the N hops, one frame in flight per hop (so FIFO
never holds a frame behind another):
- jitter: a hop takes max(0, l + sigma Z) (the relay clamps at 0): mean l Phi(l / sigma) + sigma phi(l / sigma);
- loss on a reliable transport: a frame lost on a hop arrives one retransmission timeout later (the relay's model,
  network.loss_rto_ms), so a lap costs C + T_ring + k RTO with k ~ Binomial(N, p).
The p99 of both is the quantile of that sum (jitter: a seeded Monte Carlo; loss: the binomial). On the kernel
backend (`--shaper netem`, or several with `--shapers userspace,netem`) netem drops real packets and the kernel's
TCP recovers them: a loss row reports the measured penalty per lap (its mean lap less the clean row's) next to the
relay's model N p RTO, the measured cost of one lost frame, and what the kernel did, read from each agent's
namespace while it ran (/proc/net/netstat, /proc/net/snmp, /proc/net/tcp): RTO expiries, tail-loss probes,
retransmitted segments, and the connections' RTO, which Linux computes as srtt + max(4 rttvar, 200 ms) (the
200 ms floor is TCP_RTO_MIN, scaled by nothing), so a lost frame costs about 200 ms + srtt on any scale, unless a
later segment (a tail-loss probe's, a dup ACK's fast retransmit) recovers it sooner.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from dataclasses import dataclass

import numpy as np
import trio
from rich.console import Console
from rich.table import Table

from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, log_to, make_scenario, plan_runs,
                                   print_tables, results_path, write_json)
from testbed.scenario.config import Scenario
from testbed.core.records import JsonRecord
from testbed.scenario.validate import listed

JITTERS_MS = (0.0, 1.0, 5.0, 20.0)
LOSSES_PCT = (0.0, 0.1, 1.0, 5.0)
TOKENS = 48
SAMPLES = 200_000
POLL_S = 0.5  # how often the kernel's TCP counters are read from the agents' namespaces during a netem run
KERNEL_LOST_EXTRA_S = 0.05  # netem: a hop this much over its delay waited for TCP's recovery (a lap's own noise is
# a few ms even in user-mode-linux; the kernel's fastest recovery of a lone lost segment, a tail-loss probe, takes
# 2 srtt + the 40 ms delayed ACK the probe's RTT samples carry)
NETSTAT_KEYS = {"TcpExt": ("TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery"), "Tcp": ("RetransSegs",)}
USER_HZ = 100  # /proc/net/tcp gives rto in clock ticks


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
    # the model with what the run realized (the mechanism, not the luck): loss, that share of lost hops; jitter, the
    # delays the relay drew (measure.drawn_lap_s; the expectation where the backend does not report them)
    predicted_lost_ms: float = 0.0
    penalty_ms: float = 0.0  # loss: measured mean lap less the clean (loss 0) row's
    model_penalty_ms: float = 0.0  # loss: the relay's model of it, N p RTO
    per_loss_ms: float = 0.0  # loss: mean time a lost hop took over its delay (what one loss cost)
    kernel: KernelTcp | None = None  # netem: what the kernel's TCP did, summed over the agents' namespaces
    dilation: float = 1.0  # the row's D
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class KernelTcp(JsonRecord):
    """The kernel's TCP counters of one netem run (fresh namespaces: they start at 0), read while it ran."""

    timeouts: int = 0  # TcpExt TCPTimeouts: RTO expiries
    loss_probes: int = 0  # TcpExt TCPLossProbes: tail-loss probes sent
    probe_recoveries: int = 0  # TcpExt TCPLossProbeRecovery: losses a probe repaired
    retrans_segs: int = 0  # Tcp RetransSegs
    rto_ms: float = 0.0  # mean icsk_rto of the sending connections at the last read (10 ms ticks)
    ato_ms: float = 0.0  # mean delayed-ACK timeout of the receiving connections


def read_namespace_tcp() -> dict[str, float]:
    """Inside a namespace (this thread's: /proc/thread-self): the counters and the RTO of the sending connections
    (their local port is not one this namespace listens on) and the ATO of the receiving ones."""
    values: dict[str, float] = {}
    for name in ("netstat", "snmp"):
        with open(f"/proc/thread-self/net/{name}") as f:
            lines = [line.split() for line in f]
        for names, numbers in zip(lines[::2], lines[1::2]):
            for key in NETSTAT_KEYS.get(names[0].rstrip(":"), ()):
                if key in names:
                    values[key] = float(numbers[names.index(key)])
    with open("/proc/thread-self/net/tcp") as f:
        rows = [line.split() for line in f][1:]
    listening = {row[1].split(":")[1] for row in rows if row[3] == "0A"}
    for row in (r for r in rows if r[3] == "01"):  # ESTABLISHED
        side = "ato" if row[1].split(":")[1] in listening else "rto"
        values[f"{side}_sum"] = values.get(f"{side}_sum", 0.0) + int(row[13 if side == "ato" else 12]) * 1e3 / USER_HZ
        values[f"{side}_n"] = values.get(f"{side}_n", 0.0) + 1
    return values


def testbed_namespaces() -> list[str]:
    from netem.plan import is_testbed_name
    from pyroute2 import netns

    return [name for name in os.listdir(netns.NETNS_RUN_DIR) if is_testbed_name(name) and re.search(r"-s\d+$", name)] \
        if os.path.isdir(netns.NETNS_RUN_DIR) else []


async def watch_kernel_tcp(seen: dict[str, dict[str, float]]) -> None:
    """Until cancelled: every POLL_S, each testbed namespace's read_namespace_tcp into seen (the last read stays when
    the run tears the namespace down)."""
    from netem.nsutil import in_namespace

    while True:
        for namespace in await trio.to_thread.run_sync(testbed_namespaces):
            try:
                values = await trio.to_thread.run_sync(in_namespace, namespace, read_namespace_tcp)
                seen[namespace] = {**seen.get(namespace, {}), **values}  # the RTOs of the last read with connections
            except OSError:
                pass  # torn down between the listing and the read
        await trio.sleep(POLL_S)


def kernel_tcp(seen: dict[str, dict[str, float]]) -> KernelTcp:
    total = {key: sum(v.get(key, 0.0) for v in seen.values())
             for key in ("TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "RetransSegs", "rto_sum", "rto_n",
                         "ato_sum", "ato_n")}
    return KernelTcp(int(total["TCPTimeouts"]), int(total["TCPLossProbes"]), int(total["TCPLossProbeRecovery"]),
                     int(total["RetransSegs"]), total["rto_sum"] / max(total["rto_n"], 1),
                     total["ato_sum"] / max(total["ato_n"], 1))


def explain(row: "FaultRow", relay_rto_ms: float, n_hops: int) -> str:
    """One line on why a netem loss row's penalty differs from the relay's model, from what was measured."""
    k = row.kernel
    if k is None or row.value == 0:
        return ""
    if not row.per_loss_ms:
        return (f"{k.timeouts} RTO expiries + {k.loss_probes} tail-loss probes, {k.retrans_segs} segments resent; no "
                f"decode hop lost (senders' RTO {k.rto_ms:.0f} ms)")
    return (f"{k.timeouts} RTO expiries + {k.loss_probes} tail-loss probes ({k.probe_recoveries} repaired), "
            f"{k.retrans_segs} segments resent; a loss cost {row.per_loss_ms:.0f} ms, not {relay_rto_ms:g} (senders' "
            f"RTO {k.rto_ms:.0f} ms, receivers' ACK delay {k.ato_ms:.0f} ms): N x {row.lost_pct:.2f}% lost x "
            f"{row.per_loss_ms:.0f} ms = {n_hops * row.lost_pct / 100 * row.per_loss_ms:.1f} ms/lap")


@dataclass(frozen=True)
class FaultsResult(JsonRecord):
    scenario: str
    shaper: str
    compute_ms: float
    t_ring_ms: float
    rto_ms: float
    fault_rows: tuple[FaultRow, ...]
    n_hops: int = 0


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


def drawn_lap_s(compute_s: float, ring, propagation: dict[str, tuple[float, int]], factor: float) -> float | None:
    """C + each ring hop's mean delay as the relay drew it (Shaper.realized_propagation, the box's time / D): the
    jitter model with the seeded draws the run realized, not their expectation; None where they are not known."""
    if not ring or any(link.name not in propagation for link in ring):
        return None
    return compute_s + sum(propagation[link.name][0] for link in ring) / factor


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


def hop_extras_s(runlog) -> list[float]:
    """Every decode lap's hops: the time each took over its configured delay."""
    return [h - link.delay_ms / 1e3 for lap in runlog.laps if lap.kind == "decode"
            for h, link in zip(lap.hop_latencies_s(), runlog.scenario.ring)]


def lost_share(runlog, rto_s: float, threshold_s: float | None = None) -> float:
    """The share of the decode laps' hops that took more than `threshold_s` (default half a timeout) over their
    configured delay."""
    extra = hop_extras_s(runlog)
    threshold_s = rto_s / 2 if threshold_s is None else threshold_s
    return sum(e > threshold_s for e in extra) / len(extra) if extra else 0.0


def _phi_pdf(x: float) -> float:
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _phi_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


async def measure(args: argparse.Namespace, jitters: list[float], losses: list[float], log,
                  shaper: str | None = None) -> FaultsResult:
    """Every row on one backend (`shaper`, default args.shaper)."""
    from testbed.launch.launcher import run_scenario
    from testbed.launch.runlog import RunLog

    base = with_fault(make_scenario(args.scenario, overrides=list(args.overrides) + [
        f"decode.tokens={args.tokens or TOKENS}", "decode.temperature=0", "decode.mode=plain"]))
    rows, ran, clean_ids, compute, clean_lap_s = [], "?", None, 0.0, None
    hops, rto_s = [link.delay_ms / 1e3 for link in base.ring], base.loss_rto_ms / 1e3
    for fault, values in (("jitter", jitters), ("loss", losses)):
        for value in values:
            sc = with_fault(base, **({"jitter_ms": value * base.scale} if fault == "jitter" else {"loss_pct": value}))
            log(f"{fault} {value:g} {'ms' if fault == 'jitter' else '%'}...")
            runlog, seen = RunLog(sc), {}
            async with trio.open_nursery() as nursery:
                if (shaper or args.shaper) != "userspace":
                    nursery.start_soon(watch_kernel_tcp, seen)
                summary = await run_scenario(sc, shaper or args.shaper, runlog=runlog, log=lambda m: None,
                                             dilation=args.dilation)
                nursery.cancel_scope.cancel()
            ran, compute = summary.shaper, summary.compute_s or 0.0
            if value == 0 and clean_ids is None:
                clean_ids = summary.token_ids
            laps = np.array([lap.duration_s for lap in runlog.laps if lap.kind == "decode"])
            if value == 0:
                clean_lap_s = float(laps.mean())
            if fault == "jitter":
                mean, p99 = jitter_lap_s(compute, hops, value * base.scale / 1e3, seed=int(value * 1000))
            else:
                mean, p99 = loss_lap_s(compute, base.t_ring_s, len(hops), value / 100, rto_s)
            kernel = kernel_tcp(seen) if ran == "netem" else None
            threshold = KERNEL_LOST_EXTRA_S if ran == "netem" else rto_s / 2
            lost = lost_share(runlog, rto_s, threshold) if fault == "loss" else 0.0
            realized = (loss_lap_s(compute, base.t_ring_s, len(hops), lost, rto_s)[0] if fault == "loss" else
                        drawn_lap_s(compute, base.ring, runlog.propagation, dilation_of(summary)["dilation"]) or mean)
            over = [e for e in hop_extras_s(runlog) if e > threshold] if fault == "loss" else []
            rows.append(FaultRow(fault, value, len(laps), float(laps.mean()) * 1e3, float(np.percentile(laps, 99)) * 1e3,
                                 mean * 1e3, p99 * 1e3, (float(laps.mean()) / mean - 1) * 100,
                                 clean_ids is None or summary.token_ids == clean_ids, lost * 100,
                                 realized * 1e3,
                                 (float(laps.mean()) - clean_lap_s) * 1e3 if fault == "loss" and clean_lap_s else 0.0,
                                 len(hops) * value / 100 * rto_s * 1e3 if fault == "loss" else 0.0,
                                 float(np.mean(over)) * 1e3 if over else 0.0, kernel, **dilation_of(summary)))
            r = rows[-1]
            log(f"      lap {r.lap_ms:.1f} ms (predicted {r.predicted_ms:.1f}), p99 {r.lap_ms_p99:.1f} "
                f"({r.predicted_ms_p99:.1f}), output {'identical' if r.same_output else 'DIFFERENT'}"
                + (f"; {explain(r, base.loss_rto_ms, len(hops))}" if kernel and fault == "loss" else ""))
    return FaultsResult(base.name, ran, compute * 1e3, base.t_ring_s * 1e3, base.loss_rto_ms, tuple(rows), len(hops))


def _sampling_note(result: FaultsResult) -> str:
    """How many timeouts the largest loss row could realize by luck alone: Binomial(hop crossings, p)."""
    rows = [r for r in result.fault_rows if r.fault == "loss" and r.value > 0]
    if not rows or not result.n_hops:
        return ""
    r = max(rows, key=lambda row: row.value)
    n, p = r.laps * result.n_hops, r.value / 100
    return (f"at {r.value:g}% its {n} hop crossings expect {n * p:.1f} +- {math.sqrt(n * p * (1 - p)):.1f} "
            f"timeouts and took {n * r.lost_pct / 100:.0f}")


def table(result: FaultsResult) -> Table:
    out = Table(title=f"Faults on {result.scenario} ({result.shaper}; T_ring {result.t_ring_ms:.1f} ms, RTO "
                      f"{result.rto_ms:g} ms): lap measured vs the model")
    kernel = result.shaper == "netem"
    for col in ("fault", "laps", "mean lap ms meas / pred", "err %", "p99 lap ms meas / pred", "hops lost %",
                "pred. with that", "err % with that",
                *(("loss penalty/lap ms meas / relay model", "ms per loss") if kernel else ()),
                "output", "D"):
        out.add_column(col, justify="right")
    notes = []
    for r in result.fault_rows:
        label = f"jitter {r.value:g} ms" if r.fault == "jitter" else f"loss {r.value:g}%"
        loss = r.fault == "loss" and r.value > 0
        realized = r.value > 0 and r.predicted_lost_ms > 0 and (loss or r.predicted_lost_ms != r.predicted_ms)
        penalty = (f"{r.penalty_ms:.1f} / {r.model_penalty_ms:.1f}", f"{r.per_loss_ms:.0f}") if loss else ("", "")
        out.add_row(label, str(r.laps), f"{r.lap_ms:.1f} / {r.predicted_ms:.1f}", f"{r.error_pct:+.2f}",
                    f"{r.lap_ms_p99:.1f} / {r.predicted_ms_p99:.1f}", f"{r.lost_pct:.2f}" if loss else "",
                    f"{r.predicted_lost_ms:.1f}" if realized else "",
                    f"{(r.lap_ms / r.predicted_lost_ms - 1) * 100:+.2f}" if realized else "",
                    *(penalty if kernel else ()),
                    "identical" if r.same_output else "DIFFERENT",
                    dilation_cell(r.dilation, r.capped_error_pct, duration=True))
        if kernel and loss:
            notes.append(f"{label}: {explain(r, result.rto_ms, result.n_hops)}")
    out.caption = ("loss: the model with the configured p (err %), and with the share of hops that did take a "
                   "timeout (the seeded draws: the mechanism, not the luck); jitter: its expectation, and the "
                   "delays the relay drew")
    luck = _sampling_note(result)
    out.caption += f"; {luck}" if luck else ""
    if kernel:
        out.caption = (f"netem: the kernel's TCP recovers a dropped segment, not the relay's {result.rto_ms:g} ms RTO; "
                       f"a hop > {KERNEL_LOST_EXTRA_S * 1e3:g} ms over its delay counts as lost. Linux retransmits a "
                       "lone lost segment when its RTO expires, RTO = srtt + max(4 rttvar, TCP_RTO_MIN 200 ms), or "
                       "sooner by a tail-loss probe (2 srtt + 200 ms with one segment out, 2 srtt + 2 ticks with "
                       "more) or by a fast retransmit when later segments bring dup ACKs; a frame here is one "
                       "segment and the next waits for the lap, so the floor prices most losses. Measured:\n"
                       + "\n".join(notes) + (f"\n{luck}" if luck else ""))
    return out


def shapers_of(args: argparse.Namespace) -> list[str]:
    """--shapers a,b (each row set once per backend) or --shaper."""
    text = getattr(args, "shapers", None) or args.shaper
    from netem.select import kinds

    return listed(text, "--shapers", f"backends among {', '.join(kinds())}, like userspace,netem", str,
                  lambda v: v in kinds())


def run(args: argparse.Namespace, console: Console) -> list[FaultsResult]:
    """Every row on each backend of --shapers (or --shaper): one result per backend."""
    jitters = listed(args.jitters, "--jitters", "jitters in ms within [0, 10000], like 0,1,5,20", float,
                     lambda v: 0 <= v <= 10_000)
    losses = listed(args.losses, "--losses", "loss percentages within [0, 100], like 0,0.1,1,5", float,
                    lambda v: 0 <= v <= 100)
    shapers = shapers_of(args)
    ensure_models_on(console)
    plan_runs(len(shapers) * (len(jitters) + len(losses)))
    return [trio.run(measure, args, jitters, losses, log_to(console), shaper) for shaper in shapers]


def show(results: list[FaultsResult], args: argparse.Namespace, console: Console) -> None:
    base = results_path(args, "faults", args.scenario)
    for result in results:
        print_tables(console, [table(result)])
        path = base if len(results) == 1 else base.with_name(f"{base.stem}-{result.shaper}{base.suffix}")
        write_json(path, result.to_json(indent=2), console)
