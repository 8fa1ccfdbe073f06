"""python -m testbed place: which ring order of a scenario's regions decodes fastest (seed 000, "Placement laws").

A single stream pays every hop once per token, so with the stages fixed to regions the ring order alone sets
T_ring = sum of the one-way latencies between consecutive regions, and the rate 1 / (C + T_ring). The entry
(stage 0: embedding, head, sampler) stays where the user is; the other stages' order is searched:

- up to EXACT_MAX_REGIONS regions, every order ((N - 1)! of them, 5040 for 8) is evaluated: best and worst
  are exact;
- above, a heuristic: nearest-neighbour tours from the entry, improved by 2-opt until no reversal of a
  segment shortens the ring (the textbook TSP local search; good, not guaranteed optimal), and for the worst
  order the same search on the negated matrix.

`--measure` runs the best and the worst order (layers follow the ring: the first stage after the entry holds
the next layers) and prints measured next to predicted.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
from dataclasses import dataclass

import trio
from rich.console import Console
from rich.table import Table

from testbed.deploy.rules import geometry_table
from testbed.studies.base import (dilation_cell, dilation_of, ensure_models_on, make_scenario, plan_runs, print_tables,
                                  write_json)
from testbed.scenario.config import Scenario, scenario_from_dict
from testbed.scenario.regions import RegionMatrix
from testbed.scenario.stages import STAGE_KEYS
from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord

EXACT_MAX_REGIONS = 8


@dataclass(frozen=True)
class Placement(JsonRecord):
    order: tuple[str, ...]  # stage names in ring order, the entry first
    regions: tuple[str, ...]
    t_ring_s: float
    predicted_tok_s: float
    measured_tok_s: float | None = None
    error_pct: float | None = None
    label: str = ""  # "as given", "best", "worst", "best, head separate"
    head: str = "entry"  # placement.head: "separate" adds the head's agent (and its hop) after the last stage
    dilation: float | None = None  # measured: the D it ran at
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves (base.dilation_of)


@dataclass(frozen=True)
class PlaceResult(JsonRecord):
    """`place --json`: the orders (and head placements) of one scenario, predicted and, with --measure, measured."""

    scenario: str
    shaper: str
    evaluated: int  # orders searched exhaustively (0: the heuristic)
    median_t_ring_s: float | None
    placements: tuple[Placement, ...]


def ring_s(matrix: RegionMatrix, regions: list[str]) -> float:
    return sum(matrix.ring_ms(regions)) / 1e3


def exact_orders(matrix: RegionMatrix, regions: list[str]) -> list[tuple[float, tuple[int, ...]]]:
    """(T_ring, order) of every ring through `regions` with regions[0] first."""
    rest = range(1, len(regions))
    return [(ring_s(matrix, [regions[0]] + [regions[i] for i in perm]), (0, *perm))
            for perm in itertools.permutations(rest)]


def two_opt(matrix: RegionMatrix, regions: list[str], sign: float = 1.0) -> tuple[int, ...]:
    """Nearest-neighbour from the entry, then 2-opt: the order minimizing sign * T_ring (a local optimum)."""
    n = len(regions)
    cost = lambda order: sign * ring_s(matrix, [regions[i] for i in order])  # noqa: E731
    order, left = [0], set(range(1, n))
    while left:
        last = regions[order[-1]]
        nxt = min(left, key=lambda i: sign * matrix.latency(last, regions[i]))
        order.append(nxt)
        left.remove(nxt)
    improved = True
    while improved:
        improved = False
        for i in range(1, n - 1):
            for j in range(i + 1, n):
                candidate = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
                if cost(candidate) < cost(order) - 1e-12:
                    order, improved = candidate, True
    return tuple(order)


def search(scenario: Scenario) -> tuple[tuple[int, ...], tuple[int, ...], int, float | None]:
    """(best order, worst order, orders evaluated, median T_ring or None) of the scenario's stages."""
    if scenario.regions is None or any(st.region is None for st in scenario.stages):
        raise ConfigError("place needs a [regions] matrix and a region on every stage", source=scenario.source,
                          key="regions")
    regions = [st.region for st in scenario.stages]
    if len(regions) <= EXACT_MAX_REGIONS:
        orders = exact_orders(scenario.regions, regions)
        best = min(orders)[1]
        worst = max(orders)[1]
        return best, worst, len(orders), statistics.median(t for t, _ in orders)
    return two_opt(scenario.regions, regions), two_opt(scenario.regions, regions, -1.0), 0, None


def reordered(scenario: Scenario, order: tuple[int, ...], label: str, head_region: str = "") -> Scenario:
    """The scenario with its stages in `order` (layers follow the ring) and the hops that order implies; with
    head_region, the LM head on its own agent there (placement.head = "separate")."""
    raw = {"name": f"{scenario.name}-{label}", "description": f"{label} ring order", "model": scenario.model,
           "stages": [{k: v for k, v in dataclasses.asdict(scenario.stages[i]).items()
                       if v is not None and k in STAGE_KEYS} for i in order],  # TOML keys: no derived ones
           "placement": ({"head": "separate", "head_region": head_region} if head_region else {}),
           "regions": {"names": list(scenario.regions.names), "source": scenario.regions.source,
                       "one_way_ms": [list(row) for row in scenario.regions.one_way_ms]},
           "decode": {k: list(v) if isinstance(v, tuple) else v
                      for k, v in scenario.decode.to_section().items()},
           **scenario.decode.tables(),  # a mode's own tables ([workload]: the served requests)
           "wire": {"codec": scenario.wire.codec, "block": scenario.wire.block},
           **({"geometry": geometry_table(scenario.geometry)} if scenario.geometry else {}),
           # already scaled figures, at scale 1; jitter, loss and rate as the scenario's first hop has them
           "network": {"loss_rto_ms": scenario.loss_rto_ms,
                       **({"jitter_ms": scenario.ring[0].jitter_ms, "loss_pct": scenario.ring[0].loss_pct,
                           "rate_mbit": scenario.ring[0].rate_mbit} if scenario.ring else {})}}
    for st in raw["stages"]:
        st.pop("layers", None)  # split evenly along the new order
    return scenario_from_dict(raw, scenario.source)


def placement(scenario: Scenario, label: str) -> Placement:
    compute = scenario.emulated_compute_s
    return Placement(tuple(st.name for st in scenario.stages), tuple(st.region for st in scenario.stages),
                     scenario.t_ring_s, physics.wall_rate(compute, scenario.t_ring_s), label=label,
                     head="separate" if scenario.stages[-1].is_head else "entry")


def table(title: str, rows: list[Placement]) -> Table:
    out = Table(title=title)
    for col in ("order", "ring", "T_ring ms", "predicted tok/s", "measured tok/s", "err %", "D"):
        out.add_column(col, justify="left" if col == "ring" else "right")
    for p in rows:
        out.add_row(p.label, " -> ".join(p.order) + f" -> {p.order[0]}", f"{p.t_ring_s * 1e3:.1f}",
                    f"{p.predicted_tok_s:.3f}", f"{p.measured_tok_s:.3f}" if p.measured_tok_s else "-",
                    f"{p.error_pct:+.2f}" if p.error_pct is not None else "-",
                    dilation_cell(p.dilation, p.capped_error_pct) if p.dilation is not None else "-")
    return out


def run(args: argparse.Namespace, console: Console) -> PlaceResult:
    """The search, and with --measure the best and worst orders' runs."""
    scenario = make_scenario(args.scenario, tokens=args.tokens, overrides=list(args.overrides))
    if scenario.stages[-1].is_head:
        raise ConfigError("place orders the stages with the head on the entry; compare a separate head with "
                          "--head-region", source=scenario.source, key="placement.head")
    best, worst, evaluated, median = search(scenario)
    if args.head_region and args.head_region not in scenario.regions.names:
        raise ConfigError(f"unknown region {args.head_region!r}; expected one of {', '.join(scenario.regions.names)}",
                          key="--head-region")
    runs = [("best", reordered(scenario, best, "best")), ("worst", reordered(scenario, worst, "worst"))]
    if args.head_region:
        runs.append((f"best, head in {args.head_region}", reordered(scenario, best, "best-head", args.head_region)))
    rows = [placement(scenario, "as given")] + [placement(sc, label) for label, sc in runs]
    shaper = "-"
    if args.measure:
        from testbed.launch.launcher import run_scenario

        ensure_models_on(console)
        measured = []
        plan_runs(len(runs))
        for label, sc in runs:
            console.print(f"measuring {label} ({sc.n_stages} agents, T_ring {sc.t_ring_s * 1e3:.1f} ms)...")
            summary = trio.run(lambda: run_scenario(sc, args.shaper, log=lambda m: None, dilation=args.dilation,
                                                    compensate=args.compensate))
            shaper = summary.shaper
            # predicted with the measured C, as every run reports it
            measured.append(dataclasses.replace(placement(sc, label), predicted_tok_s=summary.predicted_tok_s,
                                                measured_tok_s=summary.measured_tok_s, error_pct=summary.error_pct,
                                                **dilation_of(summary)))
        rows = rows[:1] + measured
    return PlaceResult(scenario.name, shaper, evaluated, median, tuple(rows))


def title_of(scenario: Scenario, result: PlaceResult) -> str:
    how = (f"all {result.evaluated} orders with {scenario.stages[0].name} first" if result.evaluated else
           f"{scenario.n_stages} regions: nearest neighbour + 2-opt (a local optimum, not an exhaustive search)")
    median = result.median_t_ring_s
    return (f"Ring orders of {scenario.name} ({how}; C = {scenario.emulated_compute_s * 1e3:.1f} ms emulated"
            + (f"; median T_ring {median * 1e3:.1f} ms" if median is not None else "") + ")")


def show(result: PlaceResult, args: argparse.Namespace, console: Console) -> None:
    scenario = make_scenario(args.scenario, tokens=args.tokens, overrides=list(args.overrides))
    print_tables(console, [table(title_of(scenario, result), list(result.placements))])
    if scenario.regions.source:
        console.print(f"latencies: {scenario.regions.source}", highlight=False)
    if args.json:
        write_json(args.json, result.to_json(indent=2), console)
