"""Placement (seed 000, "Placement laws"): ring orders over a region matrix, best and worst, measured on real rings."""

import itertools
import subprocess
import sys

import pytest

from testbed.scenario.config import load_scenario, scenario_from_dict
from testbed.core.errors import ConfigError
from testbed.studies.place.measure import PlaceResult, exact_orders, ring_s, reordered, search, two_opt

# Four regions on a line 0 - 1 - 2 - 3 (10 ms apart): the best ring goes out and back (60 ms), the worst zigzags.
LINE = {"names": ["a", "b", "c", "d"],
        "one_way_ms": [[0, 10, 20, 30], [10, 0, 10, 20], [20, 10, 0, 10], [30, 20, 10, 0]]}


def line_scenario(order=("a", "c", "b", "d"), **decode):
    return scenario_from_dict({"regions": LINE, "stages": [{"name": r, "region": r, "compute_ms": 5.0} for r in order],
                               "decode": {"tokens": 6, **decode}}, "<test>")


def test_the_ring_hops_come_from_the_matrix_in_stage_order():
    sc = line_scenario()
    assert [link.delay_ms for link in sc.ring] == [20.0, 10.0, 20.0, 30.0]  # a->c, c->b, b->d, d->a


def test_best_and_worst_orders_of_a_line():
    sc = line_scenario()
    best, worst, evaluated, _median = search(sc)
    assert evaluated == 6  # (4 - 1)! orders with the entry first
    names = [st.name for st in sc.stages]
    assert ring_s(sc.regions, [names[i] for i in best]) == pytest.approx(0.060)
    assert ring_s(sc.regions, [names[i] for i in worst]) == pytest.approx(0.080)  # a -> c -> b -> d -> a zigzags
    # independent brute force over every permutation (not only those starting at the entry)
    every = [sum(LINE["one_way_ms"]["abcd".index(p[i])]["abcd".index(p[(i + 1) % 4])] for i in range(4))
             for p in itertools.permutations("abcd")]
    assert min(every) == 60 and max(every) == 80


def test_two_opt_finds_the_exact_best_of_the_built_in_world():
    world = load_scenario("world-8")
    regions = [st.region for st in world.stages]
    exact = min(t for t, _ in exact_orders(world.regions, regions))
    heuristic = ring_s(world.regions, [regions[i] for i in two_opt(world.regions, regions)])
    assert exact <= heuristic <= exact * 1.05
    best, worst, evaluated, median = search(world)
    assert evaluated == 5040 and exact < median < ring_s(world.regions, [regions[i] for i in worst])


def test_a_reordered_scenario_keeps_the_stages_and_moves_the_hops():
    sc = line_scenario()
    best, _, _, _ = search(sc)
    moved = reordered(sc, best, "best")
    assert sorted(st.name for st in moved.stages) == sorted(st.name for st in sc.stages)
    assert moved.stages[0].name == "a" and moved.t_ring_s == pytest.approx(0.060)


@pytest.mark.parametrize("raw, key", [
    ({"regions": LINE, "stages": [{"name": "x", "region": "z"}]}, "stages[0].region"),
    ({"stages": [{"name": "x", "region": "a"}]}, "stages.region"),
    ({"regions": {"names": ["a", "b"], "one_way_ms": [[0, 1]]}, "stages": [{"name": "x"}]}, "regions.one_way_ms"),
    ({"regions": {"names": ["a", "b"], "one_way_ms": [[1, 1], [1, 0]]}, "stages": [{"name": "x"}]},
     "regions.one_way_ms[0][0]"),
    ({"regions": LINE, "stages": [{"name": "x", "region": "a"}, {"name": "y"}]}, "stages.region"),
])
def test_bad_regions_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(raw, "<test>")
    assert info.value.key == key


def test_place_runs_for_a_new_user_on_the_built_in_world(tmp_path):
    out = tmp_path / "place.json"
    result = subprocess.run([sys.executable, "-m", "testbed", "place", "world-8", "--head-region", "tokyo",
                             "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 5040 orders" in result.stdout and "best" in result.stdout and "worst" in result.stdout
    placed = PlaceResult.from_json(out.read_text())
    rows = {p.label: p for p in placed.placements}
    best, head = rows["best"], rows["best, head in tokyo"]
    assert head.head == "separate" and head.order == best.order + ("head",)
    # the token now goes last stage -> tokyo -> entry instead of last stage -> entry: one more hop
    world = load_scenario("world-8")
    last = dict(zip(best.order, best.regions))[best.order[-1]]
    extra = (world.regions.latency(last, "tokyo") + world.regions.latency("tokyo", best.regions[0])
             - world.regions.latency(last, best.regions[0])) / 1e3
    assert head.t_ring_s - best.t_ring_s == pytest.approx(extra)


def test_a_bad_head_region_exits_2():
    result = subprocess.run([sys.executable, "-m", "testbed", "place", "world-8", "--head-region", "mars"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--head-region" in result.stdout and "mars" in result.stdout


def test_the_best_order_measures_faster_than_the_worst_as_predicted(tmp_path):
    from tests.ringutil import rate_tolerance, run

    sc = line_scenario()
    best, worst, _, _ = search(sc)
    rates = {}
    for label, order in (("best", best), ("worst", worst)):
        summary = run(reordered(sc, order, label), dilation=4.0)
        lap_s = sc.emulated_compute_s + reordered(sc, order, label).t_ring_s
        assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=rate_tolerance(4, lap_s, 4.0))
        rates[label] = summary.measured_tok_s
    # 1 / (20 + 60) ms against 1 / (20 + 80) ms
    assert rates["best"] / rates["worst"] == pytest.approx(100 / 80, rel=1e-6)
