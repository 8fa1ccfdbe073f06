"""The launcher's side of the serve mode: the request records its laps carried -> ServeSummary (vLLM's figures of
every request, agents.modes.serve.slo, beside the queueing model's prediction, agents.modes.serve.queueing)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from agents.modes.serve.facts import ServeLap, ServeSummary
from agents.modes.serve.queueing import RingModel, mean_laps, predict, saturation_output_tok_s
from agents.modes.serve.requests import RequestRecord, RequestSpec
from agents.modes.serve.settings import ServeSettings, ServeSpecSettings
from agents.modes.serve.slo import serving_metrics
from agents.modes.serve.workload import read_trace
from agents.process import wire
from testbed.core import physics
from testbed.core.records import LapRecord
from testbed.launch.dilation import hidden_bytes
from testbed.scenario.config import Scenario


def requests_of(laps: Iterable[LapRecord]) -> list[RequestRecord]:
    """Every request record the laps carried, each once, in request order."""
    by_index = {r.index: r for lap in laps if isinstance(lap.facts, ServeLap) for r in lap.facts.ended}
    return [by_index[i] for i in sorted(by_index)]


def cap_of(scenario: Scenario) -> int:
    """Requests in the ring at once at most: decode.streams, workload.max_concurrency below it, or as many of the
    workload's mean request (prompt and output positions, each holding its KV to its end) as the KV budget holds."""
    settings = scenario.decode.settings(ServeSettings)
    cap = min(scenario.decode.streams, settings.max_concurrency or scenario.decode.streams)
    if scenario.kv_positions:
        cap = min(cap, max(1, scenario.kv_positions // (settings.prompt_tokens + settings.output_tokens)))
    return cap


def prefill_s(scenario: Scenario, prompt_tokens: int) -> float:
    """Eq. 5 per hop: a prompt alone on the ring, from its admission to its first token. Each stage's emulated pass
    over the prompt (StageConfig.cost_ms) and each hop's frame (header, the stamps so far, the prompt's hidden state:
    an upper bound under a compressing codec) at the hop's rate. With decode.prefill_chunk the chunks go back to back,
    pipelined over the stages and hops (physics.ttft_pipelined); one chunk is physics.ttft_hops."""
    ring = scenario.ring
    rates = [link.rate_bytes_s for link in ring]
    chunk = scenario.decode.prefill_chunk
    if not 0 < chunk < prompt_tokens or not ring:
        compute_s = sum(st.cost_ms(prompt_tokens, 1, prompt_tokens) for st in scenario.stages) / 1e3
        return physics.ttft_hops(compute_s, [link.delay_ms / 1e3 for link in ring],
                                 frame_sizes(scenario, prompt_tokens), rates)
    service = []
    for pos in range(0, prompt_tokens, chunk):
        n = min(chunk, prompt_tokens - pos)
        row = []
        for st, size, rate in zip(scenario.stages, frame_sizes(scenario, n), rates):
            row += [st.cost_ms(n, 1, pos + n) / 1e3, 0.0 if math.isinf(rate) else size / rate]
        service.append(row)
    return physics.ttft_pipelined(service, scenario.t_ring_s)


def frame_sizes(scenario: Scenario, positions: int) -> list[int]:
    """Each ring hop's frame of `positions` positions: its header, the stamps so far and the hidden state."""
    payload = hidden_bytes(scenario, positions)
    return [wire.HEADER.size + (i + 1) * wire.STAMP.size + payload for i in range(len(scenario.ring))]


def run_forecast(scenario: Scenario, lap_s: float) -> tuple[float, float, int]:
    """(prefill s, decode s, laps) of a serving run at D = 1, for auto dilation's budget (testbed.launch.dilation):
    its arrivals' span, then the last request's prompt and output laps (lap_s: a lap at the calibrated compute)."""
    settings = scenario.decode.settings(ServeSettings)
    if settings.arrival == "trace":
        trace = read_trace(settings.trace)
        span = (trace[-1].arrival_s if trace else 0.0) * settings.trace_scale
        span = min(span, settings.duration_s) if settings.duration_s else span
    else:
        span = settings.requests / settings.rate if settings.requests else settings.duration_s
    laps = max(1, settings.output_tokens - 1)
    return prefill_s(scenario, settings.prompt_tokens), span + laps * lap_s, laps


def ring_model(scenario: Scenario) -> RingModel:
    """The queueing model's ring: C and P summed over the stages, T_ring, the cap, the solo TTFT of a prompt. A stage's
    C is its pass over one stream and P what one more stream adds (StageConfig.cost_ms: compute_ms and per_token_ms,
    or the roofline's at the workload's mean context, prompt and half its output). Under decode.speculate a lap is
    the K drafts (K c_d, one batched pass each) and the stages' passes over K + 1 positions, and Gamma the tokens a
    lap of the workload's mean request: a calibrated draft's from its stated alpha (queueing.lap_law, the last lap's
    surplus dropped), else 1 until measured (summarize_records puts the run's own)."""
    k = scenario.decode.settings(ServeSpecSettings).speculate
    settings = scenario.decode.settings(ServeSettings)
    context = settings.prompt_tokens + settings.output_tokens // 2
    one = sum(st.cost_ms(k + 1, 1, context) for st in scenario.stages) / 1e3
    two = sum(st.cost_ms(k + 1, 2, context) for st in scenario.stages) / 1e3
    gamma, tokens = 1.0, settings.output_tokens - 1
    if k and scenario.decode.draft == "calibrated" and tokens > 0:
        gamma = tokens / mean_laps(tokens, scenario.decode.alpha, k)
    return RingModel(compute_s=one + k * scenario.decode.draft_ms / 1e3, per_token_s=two - one,
                     t_ring_s=scenario.t_ring_s, cap=cap_of(scenario),
                     ttft_s=lambda prompt_tokens: prefill_s(scenario, prompt_tokens), tokens_per_lap=gamma,
                     prompt_passes_s=lambda prompt_tokens: prompt_passes_s(scenario, prompt_tokens))


def prompt_passes_s(scenario: Scenario, prompt_tokens: int) -> list[list[float]]:
    """Each stage's passes over a prompt (one a chunk, with decode.prefill_chunk): what a convoy meets on its way."""
    chunk = scenario.decode.prefill_chunk
    step = chunk if 0 < chunk < prompt_tokens else prompt_tokens
    return [[st.cost_ms(min(step, prompt_tokens - pos), 1, min(pos + step, prompt_tokens)) / 1e3
             for pos in range(0, prompt_tokens, step)] for st in scenario.stages]


def describe(settings: ServeSettings, cap: int) -> str:
    """The workload as a benchmark names it beside its figures (its endpoint's clients where it has none of its own)."""
    if settings.arrival != "trace" and not settings.requests and not settings.duration_s:
        return f"the HTTP endpoint's requests (no workload of its own), cap {cap}"
    arrivals = (f"trace {settings.trace} (x{settings.trace_scale:g} in time)" if settings.arrival == "trace"
                else f"{settings.arrival} {settings.rate:g} req/s"
                + (f" burstiness {settings.burstiness:g}" if settings.arrival == "gamma" else ""))
    def lengths(kind: str, tokens: int, spread: float) -> str:
        return f"{kind} {tokens}" + (f"+-{spread:g}" if kind != "fixed" else "")
    count = f"{settings.requests} requests" if settings.requests else f"{settings.duration_s:g} s of arrivals"
    return (f"{arrivals}, prompt {lengths(settings.prompt, settings.prompt_tokens, settings.prompt_spread)}, "
            f"output {lengths(settings.output, settings.output_tokens, settings.output_spread)}, {count}, "
            f"seed {settings.seed}, cap {cap}")


def summarize_records(records: Sequence[RequestRecord], scenario: Scenario, running: int = 0,
                      waiting: int = 0) -> ServeSummary | None:
    if not records:
        return None
    settings = scenario.decode.settings(ServeSettings)
    measured = serving_metrics(records, settings.goodput_targets())
    model = ring_model(scenario)
    speculating = bool(scenario.decode.settings(ServeSpecSettings).speculate)
    gamma = tokens_per_lap(records) if speculating else 1.0
    model = dataclasses.replace(model, tokens_per_lap=gamma)
    origin = min(r.arrival for r in records)
    done = [r for r in records if r.completed]
    specs = [RequestSpec(r.index, r.arrival - origin, max(1, r.prompt_tokens), max(1, r.output_tokens)) for r in done]
    prediction = None
    if specs:  # the requests as they ran: their arrivals (their own rate and burstiness), lengths clipped to the
        # context and, speculating, their own laps (the acceptance's draws, keyed by request and position as its
        # lengths are by the seed: the same whatever the load)
        prediction = predict(model, specs, laps=[decode_laps(r) for r in done] if speculating else None)
    mean_prompt = round(sum(r.prompt_tokens for r in records) / len(records))
    return ServeSummary(
        workload=describe(settings, model.cap), cap=model.cap, measured=measured,
        wall_tpot_ms=model.lap_s(1) / gamma * 1e3, light_ttft_ms=prefill_s(scenario, max(1, mean_prompt)) * 1e3,
        ceiling_tok_s=saturation_output_tok_s(model), tokens_per_lap=gamma,
        predicted=prediction,
        records=tuple(records), running=running, waiting=waiting, kv_positions=scenario.kv_positions)


def tokens_per_lap(records: Sequence[RequestRecord]) -> float:
    """Gamma while serving with speculation: the tokens a request keeps a lap after its first (a lap's tokens share
    their time), over the requests that decoded."""
    tokens = laps = 0
    for r in records:
        tokens += max(0, len(r.token_times) - 1)
        laps += decode_laps(r)
    return tokens / laps if laps else 1.0


def decode_laps(record: RequestRecord) -> int:
    """The laps a request decoded in after its first token: its later tokens' distinct times."""
    return len(set(record.token_times[1:]))


def summarize(laps: Sequence[LapRecord], scenario: Scenario) -> ServeSummary | None:
    """From the laps the run log holds (a run its window holds whole)."""
    latest = next((lap.facts for lap in reversed(laps) if isinstance(lap.facts, ServeLap)), ServeLap())
    return summarize_records(requests_of(laps), scenario, latest.running, latest.waiting)


def summarize_totals(log, scenario: Scenario) -> ServeSummary | None:
    """A run longer than the run log's window: the records its metrics part kept from every lap."""
    from agents.modes.serve.metrics import ServeRequests

    part: ServeRequests = log.parts[ServeRequests.name]
    return summarize_records([part.records[i] for i in sorted(part.records)], scenario, part.running, part.waiting)
