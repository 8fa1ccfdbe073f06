"""The Python API for scripts and notebooks: run a scenario or a K sweep and get RunSummary objects back.

    import testbed
    summary = testbed.run("geo-ring", shaper="userspace", tokens=16, **{"decode.mode": "speculative"})
    print(summary.measured_tok_s, summary.predicted_tok_s, summary.spec.gamma_measured)
    rows = testbed.sweep("geo-ring", ks=[2, 4, 8], alpha=0.8, rounds=20, scale=0.5).spec.per_k

Overrides are scenario keys (dots allowed, as with `--set`); the CLI is a thin layer over these functions.
"""

from __future__ import annotations

from typing import Any, Callable

import trio

from testbed.config import Scenario, load_scenario
from testbed.core.summary import RunSummary


def scenario(name_or_path: str | Scenario, *, tokens: int | None = None, overrides: list[str] | None = None,
             **keys: Any) -> Scenario:
    """A Scenario from a built-in name or TOML path, with `--set`-style overrides and keyword overrides."""
    if isinstance(name_or_path, Scenario):
        if overrides or keys or tokens is not None:
            raise TypeError("overrides apply to a scenario name or path, not to a built Scenario")
        return name_or_path
    items = list(overrides or [])
    items += [f"{key}={_toml(value)}" for key, value in keys.items()]
    if tokens is not None:
        items.append(f"decode.tokens={tokens}")
    return load_scenario(name_or_path, items)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def ensure_models(notify: Callable[[str], None] | None = None) -> dict:
    """Make sure the tiny models exist (trained on first use unless shipped); returns their metadata."""
    from agents.train import ensure_trained, needs_training

    if notify is not None and needs_training():
        notify("The model recipe differs from the shipped weights: training the tiny models (once)...")
    return ensure_trained()


def run(name_or_path: str | Scenario, shaper: str = "auto", *, tokens: int | None = None,
        overrides: list[str] | None = None, log: Callable[[str], None] | None = None, dilation: float | str = "auto",
        compensate: bool = False, **keys: Any) -> RunSummary:
    """Run one scenario to completion (blocking) and return its summary (dilation: see testbed.dilation)."""
    from testbed.launcher import run_scenario

    sc = scenario(name_or_path, tokens=tokens, overrides=overrides, **keys)
    ensure_models()
    return trio.run(lambda: run_scenario(sc, shaper, log=log or (lambda message: None), dilation=dilation,
                                         compensate=compensate))


def sweep_scenario(name_or_path: str | Scenario, ks: list[int], *, alpha: float | None = None, rounds: int = 30,
                   overrides: list[str] | None = None, **keys: Any) -> Scenario:
    """The scenario of one K sweep: speculative, every K for `rounds` rounds, calibrated at `alpha` if given."""
    items = list(overrides or []) + ["decode.mode=speculative", f"decode.k_sweep={list(ks)}",
                                     f"decode.rounds_per_k={rounds}", f"decode.k_max={max(ks)}"]
    if alpha is not None:
        items += ["decode.draft=calibrated", f"decode.alpha={alpha}"]
    return scenario(name_or_path, overrides=items, **keys)


def sweep(name_or_path: str, ks: list[int], *, alpha: float | None = None, rounds: int = 30, shaper: str = "auto",
          overrides: list[str] | None = None, dilation: float | str = "auto", **keys: Any) -> RunSummary:
    """One speculative K sweep (one run); `summary.spec.per_k` has measured vs predicted per K."""
    return run(sweep_scenario(name_or_path, ks, alpha=alpha, rounds=rounds, overrides=overrides, **keys), shaper,
               dilation=dilation)
