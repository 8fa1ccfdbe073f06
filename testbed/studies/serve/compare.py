"""The serve study's comparisons (issue 54 item 7), a row each: the geo ring against the same ring co-located, the
highest rate each serves within the SLO; regional-first placement (which does not exist: the row says so, and
serves the place study's best ring order beside the scenario's own where the scenario has [regions]); speculation
on vs off (decode.speculate, K 4 unless the scenario sets it), the highest rate each serves within the SLO."""

from __future__ import annotations

import argparse
import dataclasses

from agents.modes.serve.settings import ServeSpecSettings
from agents.modes.serve.summary import ring_model
from testbed.scenario.config import Scenario
from testbed.studies.base import make_scenario
from testbed.studies.serve.result import Comparison, ServeVariant
from testbed.studies.serve.search import Server, knee_of, rounded, search

SPEC_K = 4  # the speculation row's K where the scenario sets no decode.speculate
PLACEMENT_LOAD = 0.75  # the placement row serves both orders at this fraction of the as-given ring's knee
COLOCATED = "co-located (every hop 0 ms)"


def colocated(scenario: Scenario) -> Scenario:
    """The same ring with every hop's delay (and jitter) 0: the stages in one place (tp's scaled_links at 0)."""
    from testbed.studies.tp.measure import scaled_links

    return dataclasses.replace(scaled_links(scenario, 0.0), name=f"{scenario.name}-colocated")


def variant_of(scenario: Scenario, label: str) -> ServeVariant:
    model = ring_model(scenario)
    return ServeVariant(label, scenario.t_ring_s, model.compute_s, knee_of(scenario), model.lap_s(1) * 1e3)


async def highest_within(servers: tuple[Server, Server]) -> list[ServeVariant]:
    """Each server's variant with the highest rate it serves within the SLO (search) and its rows."""
    variants = []
    for server in servers:
        variant = variant_of(server.scenario, server.label)
        found = await search(server, variant.knee_rate_req_s, server.target_pct)
        variants.append(dataclasses.replace(variant, search=found,
                                            rows=server.measured(r for r in server.rows)))
    return variants


def highest_text(variants: list[ServeVariant], first: str, second: str) -> str:
    """"the highest rate within the SLO: A x req/s, B y req/s (ratio)" of two variants."""

    def highest(variant: ServeVariant) -> str:
        found = variant.search
        return ("none" if found.highest_met_req_s is None else
                f"{'at least ' if found.lowest_missed_req_s is None else ''}{found.highest_met_req_s:.4g} req/s")

    far, close = (v.search.highest_met_req_s for v in variants)
    bound = "at least " if variants[1].search.lowest_missed_req_s is None else ""
    ratio = f" ({bound}{close / far:.3g}x)" if far and close and variants[0].search.lowest_missed_req_s else ""
    return f"the highest rate within the SLO: {first} {highest(variants[0])}, {second} {highest(variants[1])}{ratio}"


async def compare_colocated(geo: Server, args: argparse.Namespace, target_pct: float, log) -> Comparison:
    log("compare: geo ring vs the same ring co-located, the highest rate each serves within the SLO")
    variants = await highest_within((geo, Server(colocated(geo.scenario), COLOCATED, args, target_pct, log)))
    return Comparison("colocated", "geo ring vs co-located ring", highest_text(variants, geo.label, "co-located"),
                      tuple(variants))


async def compare_placement(geo: Server, args: argparse.Namespace, target_pct: float, log) -> Comparison:
    missing = ("no regional-first ordering exists in the testbed: [placement] places the LM head, the KV and the "
               "draft (testbed/scenario/placement.py), and the place study orders the stages by T_ring (best, "
               "worst)")
    scenario = geo.scenario
    if scenario.regions is None or any(st.region is None for st in scenario.stages) or scenario.stages[-1].is_head:
        return Comparison("placement", "regional-first placement under load",
                          missing + f"; {scenario.name} has no [regions] to order, so nothing was run")
    from testbed.studies.place.measure import reordered, search as order_search

    best_order = order_search(scenario)[0]
    best = dataclasses.replace(reordered(make_scenario(args.scenario, overrides=list(args.overrides)), best_order,
                                         "best"), decode=scenario.decode)
    rate = rounded(PLACEMENT_LOAD * knee_of(scenario))
    log(f"compare: the scenario's ring order vs the place study's best order at {rate:.4g} req/s")
    variants = []
    for server in (geo, Server(best, "best ring order (place)", args, target_pct, log)):
        await server.row(rate)
        variants.append(dataclasses.replace(variant_of(server.scenario, server.label), rows=server.measured([rate])))
    return Comparison("placement", "regional-first placement under load",
                      missing + f"; instead the place study's best order (min T_ring) beside the scenario's own at "
                      f"{rate:.4g} req/s ({PLACEMENT_LOAD:g} x the knee)", tuple(variants))


async def compare_backend(real: Server, args: argparse.Namespace, target_pct: float, log) -> Comparison:
    """--against virtual: every rate the real backend served, served again on simulated time, and each latency
    percentile of the real run against the virtual one's (the backend's own error under load: no model in between)."""
    rates = sorted(real.rows)
    log(f"against: the {len(rates)} rates again on the virtual backend")
    virtual = Server(real.scenario, "virtual", argparse.Namespace(**{**vars(args), "shaper": "virtual"}), target_pct,
                     log)
    for rate in rates:
        await virtual.row(rate)
    parts = []
    for rate in rates:
        m, v = real.rows[rate].measured, virtual.rows[rate].measured
        errors = [(f"{pct} {name}", getattr(m, f"{stat}_{name}_ms") / getattr(v, f"{stat}_{name}_ms") - 1)
                  for name in ("ttft", "tpot") for pct, stat in (("p50", "median"), ("p99", "p99"))
                  if getattr(v, f"{stat}_{name}_ms")]
        parts.append(f"{rate:.4g} req/s: " + ", ".join(f"{what} {error * 100:+.2f}%" for what, error in errors))
    variants = [dataclasses.replace(variant_of(s.scenario, s.label), rows=s.measured(rates)) for s in (real, virtual)]
    return Comparison("backend", f"{real.shaper} against virtual", "; ".join(parts), tuple(variants))


async def compare_speculation(geo: Server, args: argparse.Namespace, target_pct: float, log) -> Comparison:
    """Speculation on vs off: the scenario served with decode.speculate = K (its own, else SPEC_K) and without, the
    highest rate each serves within the SLO. Speculation shortens TPOT at light load; its K + 1 positions a row cost
    the stages more a lap, so under load the two may cross."""
    decode = geo.scenario.decode
    k = decode.settings(ServeSpecSettings).speculate or SPEC_K
    servers = tuple(Server(dataclasses.replace(geo.scenario, decode=decode.with_settings(ServeSpecSettings,
                                                                                         speculate=n)), label,
                           args, target_pct, log) for n, label in ((0, "plain"), (k, f"speculating K {k}")))
    log(f"compare: speculation (K {k}, draft {decode.draft}, c_d {decode.draft_ms:g} ms) vs plain, the highest rate "
        "each serves within the SLO")
    variants = await highest_within(servers)
    return Comparison("speculation", "speculation on vs off across load",
                      highest_text(variants, "plain", f"speculating (K {k})"), tuple(variants))
