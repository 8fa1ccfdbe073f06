"""The search's candidates as scenarios: a stage per machine in its region with its roofline, the hops from the
region matrix, the decode the candidate's (or the serve mode's run of a [workload]), its codec ([wire] codec) and
its KV (placement.kv); what --confirm, --verify and the goodput confirmation run.

A TP group (several machines of a region as one stage) runs as one stage whose pass is the search's own price of it:
a measured profile (testbed.core.roofline.MeasuredProfile) of its roofline on all its devices plus its all-reduces
over the [lan] link, at the positions a run passes (1..K_MAX + 1 and the prompt) and at the decode's mean context (a
profile has no context term: a run's laps at P + j average to the mean's, the KV term being linear in it). The ring
does not run its all-reduces as messages (a scenario is tensor parallel as a whole or not at all)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agents.modes.serve import INFO as SERVE
from testbed.core.roofline import MeasuredProfile, Roofline
from testbed.deploy.rules import StageShare, stage_roofline
from testbed.scenario.config import Scenario, scenario_from_dict
from testbed.studies.search.space import Candidate, Space
from testbed.studies.search.spec import SearchSpec

TEMPERATURE = 0.7  # a speculating run samples (the calibrated draft's acceptance is dialled at any temperature)
MODE_NAMES = {"off": "plain", "sync": "speculative", "async": "overlap"}


def build(spec: SearchSpec, c: Candidate, space: Space, name: str = "search", workload: dict | None = None,
          streams: int = 1) -> Scenario:
    """The candidate as a scenario: a stage per machine in its region, the hops from the matrix, [geometry] the model,
    each stage's roofline its layers on its devices (rules.stage_roofline; set after loading, as the scenario's own
    split is even), the decode its mode at its K and window with a calibrated draft of the stated alpha; given a
    [workload] table, the serve mode's run of it on `streams` slots instead (plain decode); a TP group's stage
    priced as the module's notes say."""
    machines = [spec.machines[g] for g in c.stages]
    names = list(dict.fromkeys(m.region for m in machines))
    decode: dict[str, Any] = {"mode": MODE_NAMES[c.mode], "tokens": spec.tokens, "temperature": 0.0,
                              "prompt_tokens": spec.prompt_tokens}
    if c.mode != "off":
        decode |= {"k": c.k, "draft": "calibrated", "alpha": spec.alpha, "temperature": TEMPERATURE,
                   "draft_ms": space.draft_s(c.stages) * 1e3}
    if c.mode == "async":
        decode["window"] = c.window
    if workload is not None:
        decode = {"mode": SERVE.name, "streams": streams, "temperature": 0.0}
    raw = {
        "name": name, "description": ring_text(spec, c),
        "model": "target" if len(c.stages) <= 6 else "target-deep",
        "geometry": {"preset": spec.model.name},
        "regions": {"names": names, "source": spec.matrix.source,
                    "one_way_ms": [[spec.dims.hop_delays * spec.matrix.ms(a, b) for b in names] for a in names]},
        "stages": [{"name": f"s{i}-{m.name}", "region": m.region, "compute_ms": 1.0} for i, m in enumerate(machines)],
        "network": {"rate_mbit": spec.rate_mbit} if spec.rate_mbit else {},
        "decode": decode, **({"workload": workload} if workload is not None else {}),
        "wire": {"codec": c.codec, "block": spec.dims.block}, "placement": {"kv": c.kv},
    }
    scenario = scenario_from_dict(raw, f"search {spec.source}")
    stages = tuple(replace(st, compute_ms=0.0, hardware=m.hardware.name, devices=m.devices * r,
                           roofline=stage_roofline(spec.model, StageShare(layers, i == 0), m.hardware, m.devices)
                           if r == 1 else tp_stage(space, c, i, workload))
                   for i, (st, m, layers, r) in enumerate(zip(scenario.stages, machines, c.layers, c.boxes)))
    # the stages' own shares of the layers (a shipped KV frame carries its sender's), not the scenario's even split
    return replace(scenario, stages=stages, wire=replace(scenario.wire, stage_layers=c.layers))


def tp_stage(space: Space, c: Candidate, i: int, workload: dict | None) -> Roofline:
    """Stage i, a TP group, as a profile of the search's price of it: its roofline on all its devices and its
    all-reduces, at each block of positions a run passes (and a second stream: a serve run's batch), at the decode's
    mean context (the served workload's, or the prompt's for a prompt)."""
    from testbed.studies.search.space import K_MAX

    spec, g, layers, ranks = space.spec, c.stages[i], c.layers[i], c.boxes[i]
    roof = space._roofline(g, layers, i == 0, ranks)
    prompts = {spec.prompt_tokens} | ({workload["prompt_tokens"]} if workload else set())
    tokens = sorted(set(range(1, K_MAX + 2)) | prompts)
    context = workload["prompt_tokens"] + workload["output_tokens"] / 2 if workload else spec.decode_context

    def ms(n: int, b: int) -> float:
        at = n if n in prompts and n > K_MAX + 1 else context + n - 1
        return (roof.seconds(n, b, at) + space.allreduce_s(ranks, layers, n * b)) * 1e3

    return Roofline(profile=MeasuredProfile(f"search: TP over {ranks} x {spec.machines[g].name}", tuple(tokens),
                                            (1.0, 2.0), tuple(tuple(ms(n, b) for b in (1, 2)) for n in tokens)))


def ring_text(spec: SearchSpec, c: Candidate) -> str:
    return " -> ".join(f"{r}x {spec.machines[g].name} (TP)" if r > 1 else spec.machines[g].name
                       for g, r in zip(c.stages, c.boxes))
