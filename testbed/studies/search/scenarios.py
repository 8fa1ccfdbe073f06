"""The search's candidates as scenarios: a stage per machine in its region with its roofline, the hops from the
region matrix, the decode the candidate's (or the serve mode's run of a [workload]); what --confirm, --verify and
the goodput confirmation run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agents.modes.serve import INFO as SERVE
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
    [workload] table, the serve mode's run of it on `streams` slots instead (plain decode)."""
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
                    "one_way_ms": [[spec.matrix.ms(a, b) for b in names] for a in names]},
        "stages": [{"name": f"s{i}-{m.name}", "region": m.region, "compute_ms": 1.0} for i, m in enumerate(machines)],
        "network": {"rate_mbit": spec.rate_mbit} if spec.rate_mbit else {},
        "decode": decode, **({"workload": workload} if workload is not None else {}),
    }
    scenario = scenario_from_dict(raw, f"search {spec.source}")
    stages = tuple(replace(st, compute_ms=0.0, hardware=m.hardware.name, devices=m.devices,
                           roofline=stage_roofline(spec.model, StageShare(layers, i == 0), m.hardware, m.devices))
                   for i, (st, m, layers) in enumerate(zip(scenario.stages, machines, c.layers)))
    return replace(scenario, stages=stages)


def ring_text(spec: SearchSpec, c: Candidate) -> str:
    return " -> ".join(spec.machines[g].name for g in c.stages)
