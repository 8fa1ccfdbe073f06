"""The launcher's side of the streams mode: a run's laps -> StreamsSummary (measured next to physics.streams_rates)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from agents.zoo.configs import vocabulary
from testbed.core import physics
from testbed.core.records import LapRecord, alike_runs
from agents.modes.streams.facts import StreamsSummary
from testbed.scenario.config import Scenario


def _busy_fraction(intervals: set[tuple[float, float]], t0: float, t1: float) -> float:
    """Share of [t0, t1] covered by the (possibly shared, never overlapping) compute intervals of one stage."""
    covered = sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in intervals)
    return covered / (t1 - t0)


def predicted_rates(scenario: Scenario, stage_pass_s: list[float]) -> tuple[float, float, list[float], float]:
    """physics.streams_rates for the scenario's M and batching with the measured cost of a forward pass per stage:
    (per-stream tok/s, aggregate tok/s, utilization per stage, ceiling tok/s).

    Under continuous batching a measured pass costs c_i + p_i (M - 1) for the whole convoy; the form takes c_i
    and p_i apart, so c_i is recovered with the configured p_i (per_token_ms).
    """
    config = scenario.decode
    if config.batching == "continuous":
        per_token_s = [st.per_token_ms / 1e3 for st in scenario.stages]
        single = [c - p * (config.streams - 1) for c, p in zip(stage_pass_s, per_token_s)]
        per, aggregate, busy = physics.streams_rates(config.streams, single, scenario.t_ring_s, "continuous",
                                                     per_token_s)
        return per, aggregate, busy, physics.batching_ceiling(config.streams, single, per_token_s)
    per, aggregate, busy = physics.streams_rates(config.streams, list(stage_pass_s), scenario.t_ring_s, "none")
    return per, aggregate, busy, 1.0 / max(stage_pass_s)


def _stage_passes(decode: list[LapRecord], n: int
                  ) -> tuple[list[set[tuple[float, float]]], list[list[int]], np.ndarray]:
    """Each stage's forward passes (compute intervals: the frames of a batch share one) and the batch of each, and
    every lap's queueing at each stage in ms [laps, stages]; read once for the laps of one BATCH frame (alike_runs)."""
    passes: list[set[tuple[float, float]]] = [set() for _ in range(n)]
    batches: list[list[int]] = [[] for _ in range(n)]
    queues: list[list[float]] = []
    for run in alike_runs(decode):
        queues += [run[0].stage_queue_s()] * len(run)
        for i, stamp in enumerate(run[0].stamps[:n]):
            interval = (stamp.compute_start, stamp.compute_end)
            if interval not in passes[i]:
                passes[i].add(interval)
                batches[i].append(stamp.batch)
    return passes, batches, np.array(queues) * 1e3


def summarize(laps: Sequence[LapRecord], scenario: Scenario) -> StreamsSummary | None:
    decode = [lap for lap in laps if lap.kind == "decode"]
    if not decode:
        return None
    config = scenario.decode
    by_stream: dict[int, list[LapRecord]] = defaultdict(list)
    for lap in decode:
        by_stream[lap.stream].append(lap)
    # The aggregate over whole laps of one stream while every stream decodes: between two lap ends of the
    # stream that finishes first, every other stream in steady state ends exactly as many laps (a train or a
    # convoy, in phase or not), so counting the laps that end in between has no edge bias.
    t0 = max(stream[0].start for stream in by_stream.values())
    first_done = min(by_stream.values(), key=lambda stream: stream[-1].end)
    ends = [lap.end for lap in first_done if lap.end >= t0]
    # Not up to its last lap end: that lap's token is its stream's last, so no frame of it follows through the
    # bottleneck, and the other streams' laps ending by then already ran faster (measured on simulated time: 8
    # streams past the bottleneck, 12 tokens, counted to the last end: +3.75% over the ceiling, 3 laps early).
    if len(ends) >= 3:
        ends = ends[:-1]
    if len(ends) >= 2:
        t0, t1 = ends[0], ends[-1]
        aggregate = sum(lap.tokens for lap in decode if t0 < lap.end <= t1) / (t1 - t0)
    else:  # too short a run: each lap's tokens spread over its own time, over the stretch every stream decodes
        t1 = min(stream[-1].end for stream in by_stream.values())
        if t1 <= t0:
            t0, t1 = min(lap.start for lap in decode), max(lap.end for lap in decode)
        aggregate = sum(lap.tokens * max(0.0, min(lap.end, t1) - max(lap.start, t0)) / lap.duration_s
                        for lap in decode if lap.duration_s > 0) / (t1 - t0)
    per_stream = tuple(sum(lap.tokens for lap in s) / sum(lap.duration_s for lap in s)
                       for _, s in sorted(by_stream.items()))
    passes, batches, queues = _stage_passes(decode, scenario.n_stages)
    stage_s = [float(np.mean([end - start for start, end in p])) for p in passes]
    predicted_per, predicted_agg, busy_predicted, ceiling = predicted_rates(scenario, stage_s)
    durations = [lap.duration_s * 1e3 for lap in decode]
    every: dict[int, list[LapRecord]] = defaultdict(list)  # each stream's laps, its prefills too
    for lap in laps:
        every[lap.stream].append(lap)
    texts = tuple(vocabulary(scenario.model).decode([t for lap in sorted(every[s], key=lambda r: r.lap)
                                                     for t in lap.ids]) for s in sorted(by_stream))
    return StreamsSummary(
        streams=config.streams, batching=config.batching, window_s=t1 - t0,
        aggregate_tok_s=aggregate, aggregate_predicted_tok_s=predicted_agg,
        aggregate_error_pct=(aggregate / predicted_agg - 1) * 100, per_stream_predicted_tok_s=predicted_per,
        per_stream_tok_s=per_stream, per_stream_p50_tok_s=float(np.median(per_stream)),
        per_stream_min_tok_s=min(per_stream), lap_ms_p50=float(np.percentile(durations, 50)),
        lap_ms_p99=float(np.percentile(durations, 99)), ceiling_tok_s=ceiling,
        stage_compute_ms=tuple(c * 1e3 for c in stage_s),
        stage_batch_mean=tuple(float(np.mean(b)) for b in batches),
        stage_busy=tuple(_busy_fraction(p, t0, t1) for p in passes), stage_busy_predicted=tuple(busy_predicted),
        stage_queue_ms_mean=tuple(float(x) for x in queues.mean(axis=0)),
        stage_queue_ms_p99=tuple(float(x) for x in np.percentile(queues, 99, axis=0)),
        texts=texts,
    )
