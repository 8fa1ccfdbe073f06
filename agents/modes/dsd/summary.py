"""summarize(laps, scenario) -> DsdSummary: edge speculation's rounds and requests against seeds 002/003."""

from __future__ import annotations

import numpy as np

from agents.process import wire
from agents.modes.dsd.facts import DsdSummary, DsdVerify
from testbed.core import physics
from testbed.core.records import LapRecord, mbit_to_bytes_s
from testbed.scenario.config import Scenario

def round_bytes(k: int, vocab: int) -> tuple[int, int]:
    """(up, down) bytes of one round on the edge link: PROBS [K, V] float32 and DRAFT [K + 1] int32 up, VERDICT down."""
    frame = wire.HEADER.size + wire.STAMP.size
    return 2 * frame + 4 * k * vocab + 4 * (k + 1), frame + 8


def queue_s(lap: LapRecord) -> float:
    """A prompt's wait behind other clients' passes at the entry (DsdVerify), 0 for a lap that did not wait."""
    return lap.facts.queue_s if isinstance(lap.facts, DsdVerify) else 0.0


def summarize(laps: list[LapRecord], sc: Scenario) -> DsdSummary | None:
    rounds = [lap for lap in laps if lap.kind == "spec"]
    verifies = [lap for lap in laps if lap.kind == "verify"]
    requests = [lap for lap in laps if lap.kind == "request"]
    if not rounds or not verifies:
        return None
    k = rounds[0].facts.k
    spec = sc.spec
    gamma = float(np.mean([lap.tokens for lap in rounds]))
    fresh = [lap for lap in rounds if not lap.facts.ready] or rounds  # drafted all K after their verdict
    draft = float(np.mean([lap.facts.draft_s for lap in fresh])) / k
    verify = float(np.mean([lap.duration_s for lap in verifies]))
    queue = float(np.mean([lap.facts.queue_s for lap in verifies]))
    p_hit = float(np.mean([bool(lap.facts.ready) for lap in rounds])) if spec.pipelined else 0.0  # began drafted
    from agents.zoo.configs import model_config  # the target's vocabulary: what a PROBS row holds

    up, down = round_bytes(k, model_config(sc.model).vocab_size)
    serialization = (up + down) / mbit_to_bytes_s(spec.rate_mbit)  # 0 when the edge link is unlimited
    rtt = spec.rtt_ms / 1e3 + serialization
    # pipelined: where the missed rounds' verdicts landed in the edge's draft steps (their send-to-verdict waits)
    waits = tuple(lap.facts.verdict_s for lap in rounds if not lap.facts.hit)
    predicted_round = physics.dsd_round_s("pipelined" if spec.pipelined else "edge", k, draft, verify + queue, rtt,
                                          p_hit, waits if spec.pipelined else ())
    prefills = [lap for lap in laps if lap.kind == "prefill"]
    # a prompt's lap and its wait behind other clients' laps at the entry (measured: the request's first part)
    prefill = float(np.mean([lap.duration_s + queue_s(lap) for lap in prefills])) if prefills else 0.0
    n_rounds = float(np.mean([lap.facts.rounds for lap in requests])) if requests else float(len(rounds))
    request = float(np.mean([lap.duration_s for lap in requests])) if requests else 0.0
    predicted_request = spec.rtt_ms / 1e3 + prefill + n_rounds * predicted_round
    # every client's own decode rate, summed: the aggregate while they all decode (they start and end together)
    clients = {lap.stream for lap in rounds}
    aggregate = sum(sum(lap.tokens for lap in rounds if lap.stream == c) /
                    sum(lap.duration_s for lap in rounds if lap.stream == c) for c in clients)
    span = max(max(lap.end for lap in rounds) - min(lap.start for lap in rounds), 1e-9)
    passes = {(lap.start, lap.end) for lap in verifies}  # a batched pass is one lap per client in it
    busy = sum(end - start for start, end in passes) / span
    batch = float(np.mean([lap.facts.batch for lap in verifies]))
    # the clients' own cycle (their queueing at the entry included), or the saturated entry: b passes of Gamma per t_v
    predicted_aggregate = min(spec.clients * gamma / predicted_round, batch * gamma / verify)
    overlaps = [lap.facts.overlap_sum for lap in verifies if lap.facts.overlap_sum is not None]
    return DsdSummary(
        clients=spec.clients, pipelined=spec.pipelined, k=k, rtt_ms=spec.rtt_ms, rounds=len(rounds),
        tokens_per_round=gamma, alpha_hat=sum(overlaps) / (k * len(overlaps)) if overlaps else None,
        draft_ms_per_token=draft * 1e3, verify_ms=verify * 1e3, queue_ms=queue * 1e3, hit_rate=p_hit,
        round_ms=float(np.mean([lap.duration_s for lap in rounds])) * 1e3, predicted_round_ms=predicted_round * 1e3,
        request_ms=request * 1e3, predicted_request_ms=predicted_request * 1e3,
        request_tokens=float(np.mean([lap.tokens for lap in requests])) if requests else 0.0,
        aggregate_tok_s=aggregate, predicted_aggregate_tok_s=predicted_aggregate, server_busy=busy, batch_mean=batch,
        bytes_up_per_round=up, bytes_down_per_round=down,
        error_pct=(request / predicted_request - 1) * 100 if request else 0.0)

