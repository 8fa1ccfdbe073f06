"""Lap aggregation: per-lap stamps from the entry node -> per-stage compute, per-hop latency, rates, summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from agents.model import decode as decode_bytes
from testbed.core import physics
from testbed.config import Scenario
from testbed.metrics import RunMetrics

SELF_CHECK_BASE_TOLERANCE_MS = 0.5  # plus 2% of the delay and 3 jitter sigmas: a link outside this is "off"
HISTORY_WINDOW_LAPS = 8  # the live rate is over this many recent laps
MAX_HISTORY_POINTS = 2000


@dataclass(frozen=True)
class Lap:
    """One traversal, decomposed on the box's one clock."""

    index: int
    kind: str  # "prefill" | "decode" | "spec"
    tokens: int
    n_tok: int
    duration_s: float
    stage_compute_s: tuple[float, ...]  # including emulated padding
    stage_real_s: tuple[float, ...]  # the real forward passes
    hop_latency_s: tuple[float, ...]  # ring hop i = stage i -> i+1; the last closes the ring
    hop_bytes: tuple[int, ...]
    spec: dict | None = None

    @property
    def compute_s(self) -> float:
        return sum(self.stage_compute_s)

    @property
    def ring_s(self) -> float:
        return sum(self.hop_latency_s)


def decompose(record: dict, n_stages: int) -> Lap:
    """Turn an entry node's lap record into a Lap (see agents.agent for the record's fields)."""
    stamps = record["stamps"]
    if len(stamps) != n_stages:
        raise ValueError(f"lap {record.get('lap')} carries {len(stamps)} stamps; expected {n_stages}")
    head_start, head_real_end, head_end = record["head"]
    compute, real = [], []
    for i, (_stage, _recv, c0, real_end, c1, _send, _size) in enumerate(stamps):
        compute.append(c1 - c0 + (head_end - head_start if i == 0 else 0.0))
        real.append(real_end - c0 + (head_real_end - head_start if i == 0 else 0.0))
    hops, sizes = [], []
    if n_stages > 1:
        for i in range(n_stages):
            arrival = stamps[i + 1][1] if i + 1 < n_stages else record["return_recv"]
            hops.append(arrival - stamps[i][5])
            sizes.append(int(stamps[i][6]))
    return Lap(record["lap"], record["kind"], int(record.get("tokens", 1)), int(record["n_tok"]),
               record["end"] - record["start"], tuple(compute), tuple(real), tuple(hops), tuple(sizes),
               record.get("spec"))


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class RunStats:
    """Everything measured in one run; `snapshot()` is both the live dashboard's input and the JSON summary."""

    scenario: Scenario
    shaper: str = "?"
    shaper_reason: str = ""
    metrics: RunMetrics | None = None
    metrics_url: str | None = None
    laps: list[Lap] = field(default_factory=list)
    probes: list[list[float]] = field(default_factory=list)  # per probe lap, per-hop one-way latency
    token_ids: list[int] = field(default_factory=list)  # every generated token, in order
    phase: str = "starting"
    started_at: float = field(default_factory=time.monotonic)
    history: list[tuple[float, float]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def hop_names(self) -> list[str]:
        return [link.name for link in self.scenario.ring]

    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.scenario.stages]

    def add_probe(self, record: dict) -> None:
        stamps = record["stamps"]
        n = self.scenario.n_stages
        self.probes.append([(stamps[i + 1][1] if i + 1 < n else record["return_recv"]) - stamps[i][5]
                            for i in range(n)])

    def add_lap(self, record: dict) -> Lap:
        lap = decompose(record, self.scenario.n_stages)
        self.laps.append(lap)
        self.token_ids.extend(int(t) for t in record.get("ids", []))
        if self.metrics is not None:
            self._export(lap)
        decode = self.decode_laps
        if decode:
            recent = decode[-HISTORY_WINDOW_LAPS:]
            rate = sum(l.tokens for l in recent) / sum(l.duration_s for l in recent)
            self.history.append((time.monotonic() - self.started_at, rate))
            del self.history[:-MAX_HISTORY_POINTS]
        return lap

    def _export(self, lap: Lap) -> None:
        m = self.metrics
        kind = "speculative" if lap.kind == "spec" else "plain"
        if lap.kind != "prefill":
            m.lap_seconds.labels(kind=kind).observe(lap.duration_s)
            m.laps_total.labels(kind=kind).inc()
            m.tokens_total.labels(kind=kind).inc(lap.tokens)
        for name, total, real in zip(self.stage_names, lap.stage_compute_s, lap.stage_real_s):
            m.stage_compute_seconds.labels(stage=name, kind="total").observe(total)
            m.stage_compute_seconds.labels(stage=name, kind="real").observe(real)
        for name, latency, size in zip(self.hop_names, lap.hop_latency_s, lap.hop_bytes):
            m.hop_latency_seconds.labels(hop=name).observe(latency)
            m.hop_bytes_total.labels(hop=name).inc(size)
        summary = self.snapshot()
        if summary["measured_tok_s"] is not None:
            m.decode_rate_tokens_per_second.labels(kind="measured").set(summary["measured_tok_s"])
            m.decode_rate_tokens_per_second.labels(kind="predicted").set(summary["predicted_tok_s"])
            m.compute_seconds.labels(kind="total").set(summary["compute_s"])
            m.compute_seconds.labels(kind="real").set(summary["compute_real_s"])
            if summary["t_ring_measured_s"] is not None:
                m.ring_latency_seconds.labels(kind="measured").set(summary["t_ring_measured_s"])
        if lap.spec is not None:
            from agents.spec import export_round  # speculation metrics live with speculation

            export_round(m, lap.spec, summary.get("spec"))

    def init_metrics(self) -> None:
        if self.metrics is None:
            return
        self.metrics.ring_latency_seconds.labels(kind="configured").set(self.scenario.t_ring_s)
        for link in self.scenario.ring:
            self.metrics.hop_configured_latency_seconds.labels(hop=link.name).set(link.delay_ms / 1e3)

    def self_check(self) -> list[dict] | None:
        """Per-hop one-way latency of the probe frames sent before the first lap, against the configuration."""
        if not self.probes:
            return None
        checks = []
        for i, link in enumerate(self.scenario.ring):
            measured = float(np.median([p[i] for p in self.probes])) * 1e3
            tolerance = SELF_CHECK_BASE_TOLERANCE_MS + 0.02 * link.delay_ms + 3 * link.jitter_ms
            checks.append({"hop": link.name, "configured_ms": link.delay_ms, "measured_ms_p50": measured,
                           "tolerance_ms": tolerance, "ok": abs(measured - link.delay_ms) <= tolerance})
        return checks

    @property
    def decode_laps(self) -> list[Lap]:
        return [lap for lap in self.laps if lap.kind in ("decode", "spec")]

    def snapshot(self) -> dict:
        sc = self.scenario
        decode = self.decode_laps
        tokens = sum(l.tokens for l in decode)
        wall = sum(l.duration_s for l in decode)
        compute = float(np.mean([l.compute_s for l in decode])) if decode else None
        compute_real = float(np.mean([sum(l.stage_real_s) for l in decode])) if decode else None
        ring_measured = float(np.mean([l.ring_s for l in decode])) if decode and sc.n_stages > 1 else (
            0.0 if decode else None)
        measured = tokens / wall if wall > 0 else None
        predicted = physics.wall_rate(compute, sc.t_ring_s) if compute is not None else None
        per_hop = []
        for i, link in enumerate(sc.ring):
            samples = [l.hop_latency_s[i] * 1e3 for l in decode] or [l.hop_latency_s[i] * 1e3 for l in self.laps]
            sizes = [l.hop_bytes[i] for l in decode if l.kind == "decode"] or [l.hop_bytes[i] for l in decode]
            per_hop.append({"hop": link.name, "configured_ms": link.delay_ms,
                            "measured_ms_p50": _percentile(samples, 50), "measured_ms_p99": _percentile(samples, 99),
                            "bytes_per_lap": int(np.mean(sizes)) if sizes else None})
        overheads = [h["measured_ms_p50"] - h["configured_ms"] for h in per_hop if h["measured_ms_p50"] is not None]
        per_stage = []
        for i, st in enumerate(sc.stages):
            per_stage.append({"stage": i, "name": st.name, "emulated_ms": st.compute_ms,
                              "compute_ms_mean": float(np.mean([l.stage_compute_s[i] for l in decode])) * 1e3
                              if decode else None,
                              "real_ms_mean": float(np.mean([l.stage_real_s[i] for l in decode])) * 1e3
                              if decode else None})
        prefill = [l for l in self.laps if l.kind == "prefill"]
        ttft = None
        if prefill:
            first = prefill[0]
            ttft = {"prompt_tokens": first.n_tok, "measured_s": first.duration_s,
                    "prefill_compute_s": first.compute_s,
                    "predicted_s": physics.ttft(first.compute_s, sc.t_ring_s)}
        self_check = self.self_check()
        summary = {
            "scenario": sc.name, "description": sc.description, "shaper": self.shaper,
            "shaper_reason": self.shaper_reason, "phase": self.phase, "mode": sc.decode.mode,
            "stages": sc.n_stages, "stage_names": self.stage_names,
            "hops_ms": [link.delay_ms for link in sc.ring],
            "tokens": tokens, "laps": len(decode), "wall_s": wall,
            "compute_s": compute, "compute_real_s": compute_real,
            "t_ring_s": sc.t_ring_s, "t_ring_measured_s": ring_measured,
            "measured_tok_s": measured, "predicted_tok_s": predicted,
            "error_pct": (measured / predicted - 1) * 100 if measured and predicted else None,
            # what a lap costs beyond compute, hops and drafting: the entry node's own framing and bookkeeping
            "lap_residual_ms": (float(np.mean([l.duration_s - l.compute_s - l.ring_s
                                               - (l.spec["draft_s"] if l.spec else 0.0) for l in decode])) * 1e3
                                if decode else None),
            "per_hop": per_hop, "per_stage": per_stage,
            "overhead_ms_per_hop": float(np.mean(overheads)) if overheads else None,
            "ttft": ttft, "self_check": self_check, "spec": None,
            "history": [list(p) for p in self.history], "metrics_url": self.metrics_url,
            "text": decode_bytes(self.token_ids), "token_ids": list(self.token_ids),
        }
        if sc.decode.mode == "speculative":
            from agents.spec import summarize_spec

            summary["spec"] = summarize_spec(self, summary)
            if summary["spec"] and summary["spec"].get("predicted_tok_s"):
                summary["predicted_tok_s"] = summary["spec"]["predicted_tok_s"]
                summary["error_pct"] = (measured / summary["predicted_tok_s"] - 1) * 100 if measured else None
        summary.update(self.extra)
        return summary
