"""Goodput for speculating candidates (testbed.studies.search.goodput): the search serves a synchronous speculating
candidate as the serve mode speculates (K drafts a lap, K + 1 positions a request, Gamma tokens a lap), so a goodput
search picks speculation where it pays. Speculation's TPOT is its lap over Gamma: on a long ring at light load that
is far under a plain lap. Each request in the batch costs K + 1 positions, so its lap grows faster as the batch fills,
and past the batch b* where L_spec(b) / Gamma = L(b) plain decode serves more; b* grows with T_ring."""

from __future__ import annotations

from dataclasses import replace

import pytest

from testbed.studies.search import goodput
from testbed.studies.search.measure import searched
from testbed.studies.search.spec import spec_from_dict

pytestmark = pytest.mark.exact

CAPS = (16, 128)


def machine(name: str, region: str) -> dict:
    return {"name": name, "hardware": "h200", "region": region, "devices": 1, "count": 1, "price_hour": 1.0}


def search(far: str, slo: str = "ttft:2000 tpot:1000"):
    """Llama-3.1-70B over an H200 in Virginia and one in `far` (neither holds it alone), an 8B draft at alpha 0.8;
    each cap of CAPS its own candidate, a run of 300 requests (more than a cap: the knee binds, not the run)."""
    raw = {"model": "llama-3.1-70b", "objective": "goodput", "context": 4096,
           "speculation": {"draft": "llama-3.1-8b", "alpha": 0.8, "modes": ["off", "sync"]},
           "constraints": {"head_region": "virginia"},
           "workload": {"prompt_tokens": 256, "output_tokens": 128, "goodput": slo, "requests": 300,
                        "streams": list(CAPS)},
           "machines": [machine("va", "virginia"), machine("far", far)]}
    return searched(spec_from_dict(raw, "test"))


def per_token_s(space, candidate, batch: int) -> float:
    """A full batch's lap over the tokens a request keeps a lap: L(b) plain, L_spec(b) / Gamma; each with the
    prompts' passes the convoy meets at the knee's rate (every slot busy: b over a request's slot time), which a
    speculating lap spreads over its Gamma tokens."""
    w = space.spec.workload
    model = goodput.ring_model(space, replace(candidate, cap=batch), w)
    lap = model.lap_s(batch)
    rate = batch / (model.decode_laps(w.output_tokens) * lap + model.prefill_s(w.prompt_tokens))
    passes = [stage[0] for stage in model.prompt_passes_s(w.prompt_tokens)]  # each stage's (no chunks here)
    met = sum(rate * f * f / 2 for f in passes)  # queueing.py's E at the knee
    return (lap + met) / model.tokens_per_lap


def crossover(space, plain, spec) -> int:
    """b*: the least batch at which a speculating lap's tokens cost more than a plain lap's."""
    low, high = 1, 4096
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if per_token_s(space, spec, mid) < per_token_s(space, plain, mid) else (low, mid)
    return high


@pytest.mark.parametrize("far, crosses_between", [("sydney", (128, 4096)), ("ohio", (16, 128))])
def test_speculation_wins_at_light_load_and_loses_where_the_batch_fills(far, crosses_between):
    """At each cap the search serves the mode whose full batch costs less a token (the knee's rate is c over a
    request's laps at L(c)); the crossover b* moves out with the ring's latency: Virginia-Sydney (T_ring ~200 ms)
    still speculates at 128 requests, Virginia-Ohio (~13 ms) serves plain there. With a TPOT target under a plain
    lap (light load, one request alone misses it) only speculation serves at all. The workload line counts the
    speculating candidates served."""
    result, space, ranking = search(far)
    rings = {replace(s.candidate, cap=0) for s in ranking if s.candidate.mode == "sync"}
    assert f"and {len(rings)} speculating candidates" in result.workload and rings
    best = {}
    for s in ranking:
        best.setdefault((s.candidate.mode, s.candidate.cap), s)
    plain, spec = best[("off", CAPS[0])].candidate, best[("sync", CAPS[0])].candidate
    b_star = crossover(space, plain, spec)
    assert crosses_between[0] < b_star <= crosses_between[1]
    for cap in CAPS:
        winner = max(("off", "sync"), key=lambda mode: best[(mode, cap)].objective)
        assert winner == ("sync" if cap < b_star else "off"), (cap, b_star)
    assert ranking[0].candidate.mode == ("sync" if b_star > max(CAPS) else "off")

    w = space.spec.workload
    wall_ms = goodput.ring_model(space, plain, w).lap_s(1) * 1e3
    tight = replace(w, goodput=f"ttft:2000 tpot:{0.8 * wall_ms:.0f}")
    assert goodput.goodput_of(goodput.ring_model(space, plain, w), tight)[0] == 0.0
    spec_model = goodput.ring_model(space, spec, w)
    assert 1 < spec_model.tokens_per_lap < spec.k + 1
    assert goodput.goodput_of(spec_model, tight, goodput.laps_of(space, spec, w))[0] > 0

