"""summarize(log) -> RunSummary: the one place a run's measured figures meet their predictions."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from agents.zoo.configs import vocabulary
from agents.modes import MODES
from testbed.core import physics, tcp
from testbed.core.records import LapRecord, alike_runs
from testbed.core.summary import HopSummary, LinkCheck, RunSummary, StageSummary, TtftSummary, summary_type
from testbed.launch import predict
from testbed.launch.runlog import DECODE_KINDS, RunLog
from testbed.scenario.config import Scenario

SELF_CHECK_BASE_TOLERANCE_MS = 0.5  # plus 2% of the delay and 3 jitter sigmas: a link outside this is "off"


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def self_check(log: RunLog) -> tuple[LinkCheck, ...] | None:
    """Per-hop one-way latency of the probe frames sent before the first lap, against the configuration."""
    if not log.probes:
        return None
    checks = []
    for i, link in enumerate(log.scenario.ring):
        measured = float(np.median([p.hop_latencies_s()[i] for p in log.probes])) * 1e3
        tolerance = SELF_CHECK_BASE_TOLERANCE_MS + 0.02 * link.delay_ms + 3 * link.jitter_ms
        checks.append(LinkCheck(link.name, link.delay_ms, measured, tolerance, abs(measured - link.delay_ms) <= tolerance))
    return tuple(checks)


def hop_transfer(sc: Scenario) -> Callable[[int, int, float], float]:
    """(hop i, bytes, when they were written) -> how long the hop's link takes to send them, its delay aside: the
    bytes at the rate (transport "tuned"), or a cold connection's slow start and window (transport "kernel":
    testbed.core.tcp; a first frame by the closed form, later ones by each hop's flow fed in order)."""
    ring = list(sc.ring)
    if sc.transport != "kernel":
        rates = [link.rate_bytes_s for link in ring]
        return lambda i, n, at: 0.0 if math.isinf(rates[i]) else n / rates[i]
    params = [tcp.link_params(sc.links, link, sc.loss_rto_ms) for link in ring]
    flows = [tcp.TcpFlow(p) for p in params]
    sent = [0] * len(ring)

    def transfer(i: int, n: int, at: float) -> float:
        sent[i] += 1
        if sent[i] == 1 and not params[i].loss:
            flows[i].send(at, n)  # the flow follows, for a next chunk
            return tcp.cold_transfer_s(n, params[i], 0.0)
        start = max(at, flows[i].link.free)
        return flows[i].send(at, n) - start

    return transfer


def ttft_summary(chunks: list[LapRecord], sc: Scenario) -> TtftSummary:
    """The first prompt against C_prefill(P) + T_ring + its serialization (Eq. 5; pipelined over the stages
    when it went in chunks: physics.ttft_pipelined), with the measured compute and configured links (under
    transport "kernel" the serialization is a cold connection's: hop_transfer)."""
    transfer = hop_transfer(sc)
    service, xmit = [], 0.0
    for lap in chunks:
        row = []
        hop_bytes = lap.hop_bytes()
        for i, stamp in enumerate(lap.stamps):
            row.append(stamp.compute_end - stamp.compute_start)
            if i < len(hop_bytes):
                row.append(transfer(i, hop_bytes[i], stamp.compute_end - chunks[0].start))
        xmit += sum(row[1::2])
        service.append(row)
    last = chunks[-1]
    head = (last.head.end - last.head.start) if last.head is not None else 0.0
    predicted = physics.ttft_pipelined(service, sc.t_ring_s, head)
    per_hop = np.sum([lap.hop_bytes() for lap in chunks], axis=0) if chunks[0].hop_bytes() else None  # every chunk
    return TtftSummary(sum(lap.n_tok for lap in chunks) + sc.wire.extra_positions, last.end - chunks[0].start,
                       sum(lap.compute_s for lap in chunks), predicted, xmit,
                       int(np.mean(per_hop)) if per_hop is not None else None,
                       chunks=len(chunks))


def _lap_figures(laps: list[LapRecord]) -> dict[int, tuple[list[float], list[int], list[float], list[float]]]:
    """id(lap) -> its hop latencies, hop bytes, stage compute and stage real time: taken once for the laps of one
    BATCH frame's streams (alike_runs)."""
    figures = {}
    for run in alike_runs(laps):
        first = run[0]
        shared = (first.hop_latencies_s(), first.hop_bytes(), first.stage_compute_s(), first.stage_real_s())
        figures.update((id(lap), shared) for lap in run)
    return figures


def from_laps(log: RunLog) -> tuple[list[HopSummary], tuple[StageSummary, ...], float | None]:
    """Per-hop and per-stage figures and the lap residual from the laps themselves (the window holds them all)."""
    sc = log.scenario
    laps = list(log.laps)
    decode = [lap for lap in laps if lap.kind in DECODE_KINDS]
    figures = _lap_figures(laps)
    # (an edge client's rounds carry no stamps: the entry's verify laps have the hops)
    hop_samples = [figures[id(lap)][0] for lap in ([lap for lap in decode if len(lap.stamps) > 1] or laps)]
    plain_sizes = [figures[id(lap)][1] for lap in decode if lap.kind == "decode"]
    any_sizes = [figures[id(lap)][1] for lap in decode]
    per_hop = []
    for i, link in enumerate(sc.ring):  # (a tensor-parallel lap has no hops: its stamp is rank 0's alone)
        samples = [hops[i] * 1e3 for hops in hop_samples if len(hops) > i]
        sizes = [b[i] for b in plain_sizes if len(b) > i] or [b[i] for b in any_sizes if len(b) > i]
        per_hop.append(HopSummary(link.name, link.delay_ms, _percentile(samples, 50), _percentile(samples, 99),
                                  int(np.mean(sizes)) if sizes else None))
    stage_compute = np.array([figures[id(lap)][2] for lap in decode]) if decode else None  # [laps, stages]
    stage_real = np.array([figures[id(lap)][3] for lap in decode]) if decode else None
    measured_stage = decode and stage_compute.ndim == 2
    per_stage = tuple(StageSummary(i, st.name, st.cost_ms(),
                                   float(stage_compute[:, i].mean()) * 1e3 if measured_stage and i < stage_compute.shape[1] else None,
                                   float(stage_real[:, i].mean()) * 1e3 if measured_stage and i < stage_real.shape[1] else None)
                      for i, st in enumerate(sc.stages))
    # what a lap costs beyond compute, hops and drafting: the entry node's own framing and bookkeeping
    residual = (float(np.mean([lap.duration_s - sum(figures[id(lap)][2]) - sum(figures[id(lap)][0]) - lap.draft_s
                               for lap in decode])) * 1e3 if decode else None)
    return per_hop, per_stage, residual


def from_totals(log: RunLog) -> tuple[list[HopSummary], tuple[StageSummary, ...], float | None]:
    """The same figures from the run log's running totals: O(stages + hops), whatever the number of laps."""
    totals = log.totals
    per_hop = [HopSummary(link.name, link.delay_ms, *totals.hop_percentiles_ms(i, [50, 99]), totals.hop_bytes_mean(i))
               for i, link in enumerate(log.scenario.ring)]
    per_stage = tuple(StageSummary(i, st.name, st.cost_ms(), totals.stage_mean_ms(i), totals.stage_mean_ms(i, real=True))
                      for i, st in enumerate(log.scenario.stages))
    residual = totals.residual.mean
    return per_hop, per_stage, residual * 1e3 if residual is not None else None


def mode_summary(log: RunLog):
    """The decode mode's own part of the summary (None for a mode without one)."""
    sc = log.scenario
    info = MODES[sc.decode.mode]
    summary = info.part("summary")  # its module: summarize(laps, scenario), maybe summarize_totals(log, scenario)
    if summary is None:
        return None
    if log.complete:
        return summary.summarize(list(log.laps), sc)
    if hasattr(summary, "summarize_totals"):
        return summary.summarize_totals(log, sc)
    part = summary.summarize(list(log.laps), sc)
    if part is None:
        return None
    counts = {name: log.totals.kinds[kind] for name, kind in info.window_counts}
    if hasattr(part, "texts"):  # every stream's whole text, not the window's
        counts["texts"] = tuple(vocabulary(sc.model).decode(log.stream_ids[s]) for s in sorted(log.stream_ids))
    return dataclasses.replace(part, **counts)


def summarize(log: RunLog) -> RunSummary:
    """Every figure of the run so far, next to its closed form (configured links, measured compute).

    A run the window holds is summarized from its laps; a longer one from running totals (means over every lap,
    percentiles within lapstats.QuantileSketch's resolution): either way the cost is bounded by the window.
    """
    sc = log.scenario
    compute = log.mean_compute_s
    measured = log.measured_tok_s
    predicted = predict.predicted_tok_s(log)
    per_hop, per_stage, residual = from_laps(log) if log.complete else from_totals(log)
    overheads = [h.measured_ms_p50 - h.configured_ms for h in per_hop if h.measured_ms_p50 is not None]
    ttft = ttft_summary(log.first_prompt, sc) if log.first_prompt else None
    info = MODES[sc.decode.mode]
    part = mode_summary(log) if info.summary_field is not None else None
    parts = {info.summary_field: part} if part is not None else {}  # RunSummary's field of that mode
    # a mode with its own headline (several streams: the aggregate; tensor parallelism: its per-token latency)
    headline = part.headline if hasattr(part, "headline") else None
    return summary_type()(
        scenario=sc.name, description=sc.description, shaper=log.shaper, shaper_reason=log.shaper_reason,
        phase=log.phase, mode=sc.decode.mode, stages=sc.n_stages, stage_names=tuple(s.name for s in sc.stages),
        hops_ms=tuple(link.delay_ms for link in sc.ring), tokens=log.decode_tokens, laps=log.decode_laps,
        wall_s=log.decode_wall_s, compute_s=compute, compute_real_s=log.mean_real_s, t_ring_s=sc.t_ring_s,
        t_ring_measured_s=log.mean_ring_s if sc.n_stages > 1 else (0.0 if log.decode_laps else None),
        measured_tok_s=headline[0] if headline else measured,
        predicted_tok_s=headline[1] if headline else predicted,
        error_pct=(headline[2] if headline else (measured / predicted - 1) * 100 if measured and predicted else None),
        lap_residual_ms=residual, per_hop=tuple(per_hop), per_stage=per_stage,
        overhead_ms_per_hop=float(np.mean(overheads)) if overheads else None,
        ttft=ttft, self_check=self_check(log), **parts,
        history=tuple(log.history), metrics_url=log.metrics_url,
        text=vocabulary(sc.model).decode(log.token_ids), token_ids=tuple(log.token_ids), generated_tokens=log.generated_tokens,
        shaper_facts={**log.shaper_facts, "schedule_changes": [dataclasses.asdict(c) for c in log.schedule_changes]}
        if log.schedule_changes else log.shaper_facts, dilation=log.dilation,
        agents=tuple(usage for _, usage in sorted(log.agent_usage.items())), wire=sc.wire, serialization_s=log.serialization_s,
        extra={"weights": log.weights.to_dict()} if log.weights is not None else {},
        **schedule_events(log),
    )


def simulated_rate(summary: RunSummary, wall_s: float, span_s: float | None = None) -> str:
    """The line a run on simulated time ends with: the tokens it generated over the box's wall seconds it took, its
    agents' start included (the virtual engine's own speed: a 10-minute serving trace at 10 req/s of 128-token
    outputs is ~768k tokens), beside the simulated seconds its laps spanned (`span_s`: the first lap's start to the
    last one's end; streams in flight overlap, so it is not the sum of their laps)."""
    tokens = summary.generated_tokens if summary.generated_tokens is not None else summary.tokens
    rate = tokens / wall_s if wall_s > 0 else 0.0
    simulated = summary.wall_s if span_s is None else span_s
    return (f"virtual time: {tokens} tokens in {wall_s:.2f} s wall ({simulated:.2f} s simulated): {rate:.0f} "
            f"simulated tokens per wall second")


def schedule_events(log: RunLog) -> dict:
    """The link schedule's events and whether each has happened (the dashboard marks them), in scenario time."""
    if not log.scenario.schedule:
        return {}
    factor = log.dilation.factor if log.dilation is not None else 1.0
    elapsed = (log.now() - log.schedule_origin) / factor if log.schedule_origin is not None else None
    return {"schedule": tuple((e.at_s, e.describe(), elapsed is not None and elapsed >= e.at_s)
                              for e in log.scenario.schedule), "schedule_elapsed_s": elapsed}
