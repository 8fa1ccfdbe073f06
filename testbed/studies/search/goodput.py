"""The goodput objectives: each candidate as a server of the file's [workload], its goodput the highest Poisson rate
at which the serve mode's closed-form queueing model (agents.modes.serve.queueing) predicts the stated percentile of
TTFT and of TPOT (p90 at attainment 90) within the SLO's targets.

The ring model of a candidate comes from the same closed forms that score it: C the stages' one-token passes at the
workload's mean context (prompt + output / 2), P what each further stream adds to them up to a full batch (the
roofline's secant from batch 1 to the cap: each stream's own KV reads, and the math where a full batch makes a stage
compute-bound; the lap is exact alone and at the cap, where the knee is decided), T_ring the ring's
hops plus a one-token frame's serialization on each, the solo TTFT a prompt's pass on every stage plus its frames,
and the cap the workload's streams or fewer: as many of its requests (prompt and output positions) as the stage with
the least room beside its weights holds the KV of. The model is monotone in the rate (the wait and the lap only
grow), so bisection finds the rate: from the knee (the rate where the cap binds) out by doubling, then halving the
bracket to GOODPUT_TOLERANCE.

A synchronous speculating candidate (at its K*) is served as the serve mode speculates (decode.speculate = K):
every running request drafts K tokens a lap and the lap verifies K + 1 positions of each. Its C is the K drafts'
passes (the draft on the entry machine, K c_d) and the stages' passes over K + 1 positions, P what a second request
adds to both (its K + 1 positions' math and KV reads, its drafts'), T_ring the hops with frames of K + 1 positions;
Gamma the workload's tokens a lap (queueing.lap_law at the stated alpha: the last lap's surplus dropped), and each
request's laps drawn from that law (queueing.drawn_laps), so a p90 TPOT is a request with more laps than the mean.
Speculation's TPOT at light load is its lap over Gamma, shorter than a plain lap where T_ring dominates; but each
request in the batch costs K + 1 positions, so as the batch fills its lap grows about (K + 1) / Gamma times as fast
as a plain one, and past the batch where L_spec(b) / Gamma = L(b) plain decode serves more.

The best GOODPUT_POOL plain and SPECULATING_POOL synchronous candidates by single-stream rate are given one (about 15
predictions each, a few ms apiece): a ring slower for one stream has a longer lap, and its goodput at a TPOT target
is lower too. Overlapped speculation is not served.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import numpy as np

from agents.modes.serve import INFO as SERVE
from agents.modes.serve.queueing import Prediction, RingModel, drawn_laps, knee_rate, mean_laps, predict
from agents.modes.serve.requests import RequestSpec
from agents.modes.serve.settings import ServeSpecSettings
from agents.modes.serve.slo import Goodput
from agents.modes.serve.workload import WorkloadSpec
from testbed.core.records import JsonRecord
from testbed.deploy.rules import StageShare, stage_roofline
from testbed.studies.search.scenarios import build, ring_text
from testbed.studies.search.space import Candidate, Scored, Space
from testbed.studies.search.spec import SearchSpec, Workload

GOODPUT_POOL = 24  # plain candidates given a goodput, the best by single-stream rate
SPECULATING_POOL = 8  # and synchronous speculating ones (at their K*)
GOODPUT_TOLERANCE = 0.01  # the bisection stops when the bracket's ends are within 1% of each other
DOUBLINGS = 12  # from the knee out at most 4096x
PERCENTILE = {50: "median", 90: "p90", 99: "p99"}  # the stated attainment's figure of a Prediction
CONFIRM_REQUESTS = 300  # requests of the --confirm run (virtual time)


@dataclass(frozen=True)
class Served:
    """A candidate as a server: its ring model, its goodput and the predicted figures there."""

    scored: Scored
    model: RingModel
    goodput_req_s: float  # 0: even one request alone misses a target
    knee_req_s: float
    ttft_ms: float  # the stated percentile's, at the goodput
    tpot_ms: float
    predictions: int  # closed forms evaluated to find it


@dataclass(frozen=True)
class GoodputCheck(JsonRecord):
    """--confirm under a goodput objective: the winner served on --shaper at its goodput, attainment beside target."""

    ring: str
    rate_req_s: float
    target_pct: float  # the stated attainment
    measured_pct: float  # requests meeting every target, as vLLM counts them
    slo: str
    predicted_ttft_ms: float  # the stated percentile's, the search's model
    measured_ttft_ms: float
    predicted_tpot_ms: float
    measured_tpot_ms: float
    requests: int
    shaper: str


def kv_cap(space: Space, c: Candidate, w: Workload) -> int:
    """Requests whose KV (prompt and output positions) the stage with the least room beside its weights holds (a
    TP group: its machines' room together); a speculating candidate's entry also holds the draft and each request's
    draft KV."""
    per_request = w.prompt_tokens + w.output_tokens
    drafts = c.mode != "off" and space.spec.draft is not None
    draft_kv = space.spec.draft.kv_bytes_per_token * per_request if drafts else 0.0
    room = [int((space.room(g, i == 0, drafts and i == 0, r) - layers * space.layer_bytes)
                // (space.kv_layer_bytes * layers * per_request + (draft_kv if i == 0 else 0.0)))
            for i, (g, layers, r) in enumerate(zip(c.stages, c.layers, c.boxes))]
    return max(1, min(room))


def ring_model(space: Space, c: Candidate, w: Workload) -> RingModel:
    """The candidate's RingModel (the module's notes): C, P, T_ring, the cap and the solo TTFT; a TP group's passes
    with its all-reduces, every hop's frames under the candidate's codec and KV. Speculating (sync at K), a lap is
    the K drafts and the passes and frames of K + 1 positions a request, Gamma the workload's (lap_law)."""
    context = w.prompt_tokens + w.output_tokens / 2
    parts = list(zip(c.stages, c.layers, c.boxes))
    roofs = [space._roofline(g, layers, i == 0, r) for i, (g, layers, r) in enumerate(parts)]

    def pass_s(n: int, b: int, at: float) -> float:
        return sum(roof.seconds(n, b, at) + space.allreduce_s(r, layers, n * b)
                   for roof, (_, layers, r) in zip(roofs, parts))

    hops = sum(space.hops_s(c.stages))

    def ttft_s(prompt: int) -> float:
        return pass_s(prompt, 1, prompt) + hops + sum(space.hop_s(c.layers, prompt, c.wire))

    cap = c.cap or min(w.streams, kv_cap(space, c, w))
    full = max(cap, 2)  # P: the secant to a full batch (the roofline's lap is exact at 1 and at the cap)
    n, (draft_one, draft_full), gamma = 1, (0.0, 0.0), 1.0
    if c.mode != "off":
        n, tokens = c.k + 1, w.output_tokens - 1
        draft_one, draft_full = (c.k * draft_s(space, c.stages[0], b, context) for b in (1, full))
        gamma = tokens / mean_laps(tokens, space.spec.alpha, c.k) if tokens > 0 else 1.0
    one = pass_s(n, 1, context) + draft_one
    def prompt_passes_s(prompt: int) -> list[list[float]]:
        return [[roof.seconds(prompt, 1, prompt) + space.allreduce_s(r, layers, prompt)]
                for roof, (_, layers, r) in zip(roofs, parts)]

    return RingModel(compute_s=one, per_token_s=(pass_s(n, full, context) + draft_full - one) / (full - 1),
                     t_ring_s=hops + sum(space.hop_s(c.layers, n, c.wire)), cap=cap, ttft_s=ttft_s,
                     tokens_per_lap=gamma, prompt_passes_s=prompt_passes_s)


def draft_s(space: Space, kind: int, batch: int, context: float) -> float:
    """c_d: the draft's pass on the entry machine over one token of each of `batch` requests."""
    draft, machine = space.spec.draft, space.spec.machines[kind]
    assert draft is not None
    return stage_roofline(draft, StageShare(draft.layers, True), machine.hardware, machine.devices).seconds(
        1, batch, context)


def laps_of(space: Space, c: Candidate, w: Workload) -> np.ndarray | None:
    """A speculating candidate's requests' decode laps: lap_law's quantiles (its acceptance's spread: a p90 TPOT
    is a request with more laps than the mean); None for plain decode, one lap a token."""
    if c.mode == "off":
        return None
    return drawn_laps([RequestSpec(i, 0.0, w.prompt_tokens, w.output_tokens) for i in range(w.requests)],
                      space.spec.alpha, c.k, w.seed)


def workload_spec(w: Workload, rate: float, requests: int | None = None) -> WorkloadSpec:
    return WorkloadSpec(arrival=w.arrival, rate=rate, prompt_tokens=w.prompt_tokens, output_tokens=w.output_tokens,
                        requests=requests or w.requests, seed=w.seed)


def figure(p: Prediction, name: str, attainment: int) -> float:
    return getattr(p, f"{PERCENTILE[attainment]}_{name}_ms")


def meets(p: Prediction, targets: Goodput, attainment: int) -> bool:
    """The stated percentile of every targeted figure within its target."""
    return all(target is None or figure(p, name, attainment) <= target
               for name, target in (("ttft", targets.ttft_ms), ("tpot", targets.tpot_ms), ("e2el", targets.e2el_ms)))


def goodput_of(model: RingModel, w: Workload, laps: np.ndarray | None = None
               ) -> tuple[float, float, Prediction | None, int]:
    """(goodput req/s, the knee, the prediction at the goodput, predictions made): the highest rate the model
    predicts meets the targets, by doubling out from the knee and bisection; 0 where a request alone misses.
    `laps`: each request's decode laps (a speculating candidate's, laps_of)."""
    targets = Goodput.parse(w.goodput)
    knee = knee_rate(model, w.prompt_tokens, w.output_tokens)
    calls = 0

    def at(rate: float) -> Prediction | None:
        nonlocal calls
        calls += 1
        p = predict(model, workload_spec(w, rate), laps=laps)
        return p if meets(p, targets, w.attainment) else None

    best = at(knee * 1e-6)
    if best is None:
        return 0.0, knee, None, calls
    lo, hi = knee * 1e-6, knee
    for _ in range(DOUBLINGS):
        p = at(hi)
        if p is None:
            break
        lo, hi, best = hi, hi * 2, p
    while hi - lo > GOODPUT_TOLERANCE * hi:
        mid = (lo + hi) / 2
        p = at(mid)
        lo, hi, best = (mid, hi, p) if p is not None else (lo, mid, best)
    return lo, knee, best, calls


def served(space: Space, s: Scored, w: Workload) -> Served:
    model = ring_model(space, s.candidate, w)
    rate, knee, p, calls = goodput_of(model, w, laps_of(space, s.candidate, w))
    return Served(s, model, rate, knee, figure(p, "ttft", w.attainment) if p else 0.0,
                  figure(p, "tpot", w.attainment) if p else 0.0, calls)


def pooled(scored: list[Scored], pool: int = GOODPUT_POOL, speculating: int = SPECULATING_POOL) -> list[Scored]:
    """The candidates given a goodput: the best `pool` plain ones and the best `speculating` synchronous ones by
    single-stream rate (overlapped speculation is not served: the serve mode drafts in step with its laps)."""
    def best(mode: str, count: int) -> list[Scored]:
        return sorted((s for s in scored if s.candidate.mode == mode), key=lambda s: -s.tok_s)[:count]

    return best("off", pool) + best("sync", speculating)


def ranked(space: Space, scored: list[Scored], pool: int = GOODPUT_POOL) -> list[Served]:
    """The pooled candidates, each given its goodput (at each cap of a [workload] streams list whose KV fits: a cap
    that does not is refused, counted in space.refused), best objective first (goodput, or goodput per $/h); ties to
    the cheaper, then the faster for one stream."""
    spec = space.spec
    w = spec.workload
    assert w is not None
    out = []
    for s in pooled(scored, pool):
        if not w.caps:
            out.append(served(space, s, w))
            continue
        holds = kv_cap(space, s.candidate, w)
        for cap in w.caps:
            if cap > holds:
                space.refused[f"workload.streams {cap}: the KV of {cap} requests of {w.prompt_tokens + w.output_tokens}"
                              f" positions does not fit beside the weights"] += 1
                continue
            out.append(served(space, replace(s, candidate=replace(s.candidate, cap=cap)), w))
    per_dollar = spec.objective.endswith("_per_dollar")
    out.sort(key=lambda v: (-(v.goodput_req_s / v.scored.cost_hour if per_dollar else v.goodput_req_s),
                            v.scored.cost_hour, -v.scored.tok_s, v.scored.candidate.cap))
    return out


def objective_of(v: Served, per_dollar: bool) -> float:
    return v.goodput_req_s / v.scored.cost_hour if per_dollar else v.goodput_req_s


def described(w: Workload) -> str:
    return (f"{w.arrival} arrivals, prompt {w.prompt_tokens}, output {w.output_tokens} tokens, SLO {w.goodput} at "
            f"p{w.attainment}, " + (f"caps {'/'.join(map(str, w.caps))} streams searched" if w.caps else
                                    f"{w.streams} streams at most") + f", a run of {w.requests} requests")


def ranking(space: Space, scored: list[Scored], per_dollar: bool
            ) -> tuple[list[Scored], dict[Candidate, float], str]:
    """(the served candidates best first, their objective the goodput (per $/h), each one's goodput, the workload in
    words with the pool's size and time)."""
    start = time.perf_counter()
    out = ranked(space, scored)
    seconds = time.perf_counter() - start
    w = space.spec.workload
    assert w is not None
    rings = {replace(v.scored.candidate, cap=0) for v in out}
    speculating = sum(c.mode != "off" for c in rings)
    words = (f"{described(w)}; goodput of the best {len(rings) - speculating} plain and {speculating} speculating "
             f"candidates by single-stream rate"
             + (f" ({len(out)} with a cap that fits)" if w.caps else "")
             + f", {sum(v.predictions for v in out)} predictions in {seconds:.2f} s")
    rates = {v.scored.candidate: v.goodput_req_s for v in out}
    for v in reversed(out):  # a candidate without its cap (the baseline, a frontier point): its best cap's
        rates[replace(v.scored.candidate, cap=0)] = v.goodput_req_s
    return [replace(v.scored, objective=objective_of(v, per_dollar)) for v in out], rates, words


async def confirm(spec: SearchSpec, space: Space, ranking_: list[Scored], args: argparse.Namespace,
                  log) -> GoodputCheck | None:
    """The winner (the best ring of SERVE.min_stages or more stages where it has fewer: the serve mode's least)
    served on args.shaper at its goodput, CONFIRM_REQUESTS requests; its measured attainment beside the target."""
    from testbed.launch.launcher import run_scenario

    w = spec.workload
    assert w is not None
    pick = next((s for s in ranking_ if len(s.candidate.stages) >= SERVE.min_stages), None)
    if pick is None:
        log(f"no served candidate has {SERVE.min_stages} stages or more (the serve mode's least): nothing confirmed")
        return None
    v = served(space, pick, w)
    if v.goodput_req_s <= 0:
        log(f"{ring_text(spec, pick.candidate)} meets no SLO even alone: nothing to confirm")
        return None
    rate = float(f"{v.goodput_req_s:.4g}")
    table = {"arrival": w.arrival, "rate": rate, "prompt_tokens": w.prompt_tokens, "output_tokens": w.output_tokens,
             "requests": CONFIRM_REQUESTS, "seed": w.seed, "goodput": w.goodput}
    scenario = build(spec, pick.candidate, space, "search-goodput", table, v.model.cap)
    per_token = [r.seconds(1, 2, w.prompt_tokens + w.output_tokens / 2) - r.seconds(1, 1, w.prompt_tokens
                 + w.output_tokens / 2) for r in (st.roofline for st in scenario.stages)]
    scenario = replace(scenario, stages=tuple(replace(st, per_token_ms=p * 1e3)
                                              for st, p in zip(scenario.stages, per_token)))
    if pick.candidate.mode != "off":  # build() serves plain decode: speculating at K with a calibrated draft
        decode = replace(scenario.decode, draft="calibrated", alpha=spec.alpha,
                         draft_ms=space.draft_s(pick.candidate.stages) * 1e3)
        scenario = replace(scenario, decode=decode.with_settings(ServeSpecSettings, speculate=pick.candidate.k))
    log(f"serving {ring_text(spec, pick.candidate)} on {args.shaper} at its goodput {rate:g} req/s "
        f"({CONFIRM_REQUESTS} requests, cap {v.model.cap})...")
    summary = await run_scenario(scenario, args.shaper, log=lambda m: None, budget_s=args.budget_s)
    serve = summary.serve
    assert serve is not None
    m = serve.measured
    p = predict(v.model, workload_spec(w, rate, CONFIRM_REQUESTS),
                laps=laps_of(space, pick.candidate, replace(w, requests=CONFIRM_REQUESTS)))
    check = GoodputCheck(ring_text(spec, pick.candidate), rate, float(w.attainment), m.slo_attainment_pct or 0.0,
                         w.goodput, figure(p, "ttft", w.attainment), figure(m, "ttft", w.attainment),
                         figure(p, "tpot", w.attainment), figure(m, "tpot", w.attainment), m.completed,
                         summary.shaper)
    log(f"      measured SLO attainment {check.measured_pct:.1f}% (target {check.target_pct:g}%), p{w.attainment} "
        f"TTFT {check.measured_ttft_ms:.1f} ms (model {check.predicted_ttft_ms:.1f}), TPOT "
        f"{check.measured_tpot_ms:.1f} ms (model {check.predicted_tpot_ms:.1f})")
    return check
