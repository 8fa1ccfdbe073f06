"""The Python API for scripts and notebooks: run a scenario, a K sweep or any study and get its result back.

    import testbed
    summary = testbed.run("geo-ring", shaper="userspace", tokens=16, **{"decode.mode": "speculative"})
    print(summary.measured_tok_s, summary.predicted_tok_s, summary.spec.gamma_measured)
    rows = testbed.sweep("geo-ring", ks=[2, 4, 8], alpha=0.8, rounds=20, scale=0.5).spec.per_k

    result = testbed.faults("geo-ring", shaper="virtual", jitters=[0, 5], losses=[0, 1])  # every study, by name
    print(result[0].fault_rows[1].lap_ms, result[0].fault_rows[1].predicted_ms)

A study takes its command's options as keywords (`--hop-scale 0.5,1` is hop_scale=[0.5, 1]); its result is what
the command writes as JSON (testbed.studies.STUDIES lists them). Overrides are scenario keys (dots allowed, as with
`--set`); the CLI is a thin layer over these functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import trio
from rich.console import Console

from testbed.scenario.config import Scenario
from testbed.core.summary import RunSummary
from testbed.run.dilation import BUDGET_S
from testbed.studies.base import ensure_models, make_scenario as scenario
from testbed.studies.sweep.measure import sweep_scenario


def run(name_or_path: str | Scenario, shaper: str = "auto", *, tokens: int | None = None,
        overrides: list[str] | None = None, log: Callable[[str], None] | None = None, dilation: float | str = "auto",
        compensate: bool = False, trace: str | Path | None = None, budget_s: float = BUDGET_S, **keys: Any
        ) -> RunSummary:
    """Run one scenario to completion (blocking) and return its summary (dilation: see testbed.run.dilation, budget_s
    its auto's run-time budget; trace: write its laps there as a Chrome trace-event timeline, testbed.run.trace)."""
    from testbed.run.launcher import run_scenario
    from testbed.run.trace import tracing

    sc = scenario(name_or_path, tokens=tokens, overrides=overrides, **keys)
    ensure_models()
    with tracing(trace):
        return trio.run(lambda: run_scenario(sc, shaper, log=log or (lambda message: None), dilation=dilation,
                                             compensate=compensate, budget_s=budget_s))


def sweep(name_or_path: str, ks: list[int], *, alpha: float | None = None, rounds: int = 30, shaper: str = "auto",
          overrides: list[str] | None = None, dilation: float | str = "auto", **keys: Any) -> RunSummary:
    """One speculative K sweep (one run); `summary.spec.per_k` has measured vs predicted per K."""
    return run(sweep_scenario(name_or_path, ks, alpha=alpha, rounds=rounds, overrides=overrides, **keys), shaper,
               dilation=dilation)


def study(name: str, scenario_name: str | None = None, *, console: Console | None = None, **options: Any) -> Any:
    """Run the study `name` (a key of testbed.studies.STUDIES) with its command's options as keywords; returns its
    result (nothing printed unless a console is given). An unknown study or option is a TypeError naming it."""
    from testbed.studies import STUDIES

    if name not in STUDIES:
        raise TypeError(f"no study {name!r}; expected one of {', '.join(STUDIES)}")
    chosen = STUDIES[name]
    args = chosen.parser().parse_args([scenario_name] if chosen.scenario and scenario_name is not None else [])
    for key, value in options.items():
        if not hasattr(args, key):
            known = ", ".join(sorted(k for k in vars(args) if k != "scenario"))
            raise TypeError(f"{name}() got an unexpected option {key!r}; expected one of {known}")
        setattr(args, key, ",".join(str(v) for v in value) if isinstance(value, list | tuple) else value)
    return chosen.measure(args, console or Console(quiet=True))
