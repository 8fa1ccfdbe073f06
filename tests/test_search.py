"""The search study (testbed.studies.search): the search moves the way the physics says (a faster device where the
slowest stage is raises the rate; a memory limit refuses candidates and says why; a far region stays out of the
single-stream winner; speculation wins on a long ring at high alpha and loses at alpha 0; per dollar the cheaper
machine wins a tie), the winner run on virtual time within 1% of its prediction, the report part, and bad input
named with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed import cli
from testbed.core.errors import ConfigError
from testbed.studies.search.figures import parse
from testbed.studies.search.measure import searched
from testbed.studies.search.spec import load_spec, spec_from_dict

pytestmark = pytest.mark.exact


def machine(name: str, hardware: str, region: str, devices: int = 1, count: int = 1, price: float = 1.0) -> dict:
    return {"name": name, "hardware": hardware, "region": region, "devices": devices, "count": count,
            "price_hour": price}


def search(machines: list[dict], model: str = "llama-3.1-70b", **top):
    raw = {"model": model, "prompt_tokens": 512, "tokens": 16, "context": 1024, "machines": machines, **top}
    return searched(spec_from_dict(raw, "test"))


def test_a_faster_device_in_the_slowest_stages_region_raises_the_rate():
    """70B spans an A100 in Paris and four 4090s in Frankfurt; the A100's stage is the slowest a layer. An H100 in
    Paris beside it lets the split move layers onto faster memory: the winner's rate goes up."""
    base = [machine("a100", "a100-80gb", "paris"), machine("4090s", "rtx-4090", "frankfurt", devices=4)]
    before, space, _ = search(base)
    slow = max(before.top[0].machines, key=lambda name: space.layer_s(
        next(i for i, m in enumerate(space.spec.machines) if m.name == name)))
    assert slow == "a100"
    after, _, _ = search([*base, machine("h100", "h100-sxm", "paris")])
    assert after.top[0].tok_s > before.top[0].tok_s * 1.05
    assert "h100" in after.top[0].machines


def test_a_memory_limit_refuses_candidates_and_says_why():
    machines = [machine("a100", "a100-80gb", "paris", count=2), machine("4090s", "rtx-4090", "frankfurt", devices=4)]
    loose, _, _ = search(machines)
    tight, _, _ = search(machines, constraints={"memory_fraction": 0.6})
    assert tight.scored < loose.scored
    assert tight.refused > loose.refused
    assert any("layers" in r.reason and r.candidates > 0 for r in tight.refusals)
    assert sum(r.candidates for r in tight.refusals) == tight.refused


def test_a_far_region_is_left_out_of_the_single_stream_winner():
    """70B needs two A100s; Virginia-Ohio is 15 ms a lap, either with Sydney ~200 ms."""
    machines = [machine("va", "a100-80gb", "virginia"), machine("oh", "a100-80gb", "ohio"),
                machine("syd", "a100-80gb", "sydney")]
    result, _, scored = search(machines)
    assert "sydney" not in result.top[0].regions
    assert any(2 in s.candidate.stages for s in scored)  # rings through Sydney were scored, and lost


@pytest.mark.parametrize("alpha, speculates", [(0.9, True), (0.0, False)])
def test_speculation_wins_on_a_long_ring_when_alpha_is_high(alpha, speculates):
    machines = [machine("va", "h100-sxm", "virginia"), machine("syd", "h100-sxm", "sydney")]
    result, _, _ = search(machines, speculation={"draft": "llama-3.1-8b", "alpha": alpha},
                          constraints={"head_region": "virginia"})
    assert set(result.top[0].regions) == {"virginia", "sydney"}  # the model needs both
    assert (result.top[0].mode != "off") is speculates


def test_per_dollar_prefers_the_cheaper_machine_when_rates_tie():
    machines = [machine("dear", "a100-80gb", "paris", price=4.0), machine("cheap", "a100-80gb", "paris", price=1.0)]
    by_rate, _, _ = search(machines, model="llama-3.1-8b")
    by_dollar, _, _ = search(machines, model="llama-3.1-8b", objective="tok_s_per_dollar")
    assert by_rate.top[0].tok_s == pytest.approx(by_rate.top[1].tok_s)  # the two single machines tie on rate
    assert by_dollar.top[0].machines == ("cheap",)
    assert by_dollar.top[0].objective == pytest.approx(by_dollar.top[0].tok_s / 1.0)


def test_every_split_keeps_its_stages_within_memory():
    machines = [machine("a100", "a100-80gb", "paris", count=2), machine("4090s", "rtx-4090", "frankfurt", devices=4),
                machine("h100", "h100-sxm", "london")]
    _, space, scored = search(machines, speculation={"draft": "llama-3.1-8b"})
    assert {s.candidate.split for s in scored} == {"even", "balanced", "greedy"}
    for s in scored:
        c = s.candidate
        assert sum(c.layers) == space.spec.model.layers
        for i, (g, layers) in enumerate(zip(c.stages, c.layers)):
            assert 1 <= layers <= space.capacity(g, i == 0, c.mode != "off")


def test_the_winner_runs_on_virtual_time_within_one_percent(tmp_path, capsys):
    out = tmp_path / "search.json"
    assert cli.main(["search", "small", "--confirm", "1", "--json", str(out), "--figure", str(tmp_path / "p.png")]) == 0
    item = parse(json.loads(out.read_text()), str(out))
    first = item.result.confirmations[0]
    assert first.rank == 1 and first.shaper == "virtual"
    assert abs(first.error_pct) < 1.0
    assert abs(first.vs_search_pct) < 1.0  # plain decode: the search's own form
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    assert "candidates" in capsys.readouterr().out


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in.toml"
    path.write_text(text)
    return path


BASE = 'model = "llama-3.1-70b"\n[[machines]]\nhardware = "{hw}"\nregion = "{region}"\ndevices = {devices}\n'


@pytest.mark.parametrize("hw, region, devices, key", [
    ("h100-sxmm", "virginia", 2, "machines[0].hardware"),  # an unknown preset
    ("h100-sxm", "atlantis", 2, "machines[0].region"),  # a region missing from the matrix
    ("h100-sxm", "virginia", 1, "machines"),  # 70B does not fit in one H100
])
def test_bad_input_exits_2_naming_the_field(tmp_path, capsys, hw, region, devices, key):
    path = write(tmp_path, BASE.format(hw=hw, region=region, devices=devices))
    assert cli.main(["search", str(path), "--confirm", "0"]) == 2
    out = capsys.readouterr().out
    assert f"{path}: {key}:" in out


def test_a_region_matrix_in_the_file_must_name_the_machines_regions():
    raw = {"model": "llama-3.1-8b", "regions": {"names": ["a", "b"], "one_way_ms": [[0, 5], [5, 0]]},
           "machines": [{"hardware": "a100-80gb", "region": "c"}]}
    with pytest.raises(ConfigError, match=r"machines\[0\]\.region.*missing from the region matrix"):
        spec_from_dict(raw, "test")
    raw["machines"][0]["region"] = "b"
    assert spec_from_dict(raw, "test").matrix.ms("a", "b") == 5


def test_verify_runs_the_winner_on_the_named_backend_beside_its_prediction(tmp_path, capsys):
    """The plumbing of --verify on virtual time (the real backend's figure is the report's, not a test's): the winner
    alone, its measured rate beside the search's closed form, in the JSON and the printed table."""
    out = tmp_path / "search.json"
    assert cli.main(["search", "small", "--confirm", "0", "--verify", "virtual", "--json", str(out)]) == 0
    result = parse(json.loads(out.read_text()), str(out)).result
    v = result.verification
    assert not result.confirmations and v.rank == 1 and v.shaper == "virtual" and v.dilation == 1.0
    assert (v.ring, v.decode) == (result.top[0].ring, result.top[0].decode)
    assert v.predicted_tok_s == result.top[0].tok_s
    assert v.measured_tok_s == pytest.approx(v.predicted_tok_s, rel=1e-6)  # plain decode on virtual time: exact
    printed = capsys.readouterr().out
    assert "The winner verified on virtual (--verify)" in printed and "verified on virtual at D 1" in printed
    from testbed.studies import STUDIES

    parser = STUDIES["search"].parser()
    assert parser.parse_args(["small", "--verify"]).verify == "auto"  # netem where the kernel has it, else the relay
    assert parser.parse_args(["small"]).verify is None


# --- published cases (issue 53 part 5): the published split as a candidate of the same machines and order ---------
PUBLISHED = Path(__file__).resolve().parents[1] / "testbed" / "studies" / "search" / "published"


@pytest.mark.parametrize("name, figure", [("exo-row1", 25.4), ("exo-row2", 8.7)])
def test_a_published_deployment_is_printed_beside_the_searchs_split_with_its_figure(capsys, name, figure):
    """PUBLISHED.md rows 1 and 2 (exo, 4 identical M3 Ultras): the search's best split of the same ring predicts at
    least the published split's rate; with identical machines no split beats it, and the printed reason says why;
    the published figure is printed beside the published split's prediction (not fitted to it)."""
    path = PUBLISHED / f"{name}.toml"
    result, _, _ = searched(load_spec(str(path)))
    case = result.published
    assert case.theirs.split == "memory" and case.theirs.machines == ("mac1", "mac2", "mac3", "mac4")
    assert case.ours.machines == case.theirs.machines  # the same machines, the same order
    assert case.ours.tok_s >= case.theirs.tok_s * (1 - 1e-9)
    assert case.gain == pytest.approx(1.0, rel=1e-6)  # identical machines: a lap is the same sum however split
    assert case.figure_tok_s == figure
    assert cli.main(["search", str(path), "--confirm", "0"]) == 0
    out = capsys.readouterr().out
    assert f"PUBLISHED.md row {name[-1]}" in out and f"{figure:g}" in out
    assert "takes the lap longest" in out and "no split beats it" in out


def mixed(split: str) -> dict:
    """Not a published row: a mixed pair the presets can express (an M3 Ultra, 512 GB at 819 GB/s, and a box of four
    RTX 4090s, 96 GB at 4 x 1008 GB/s) for Llama-3.1-70B, split the way exo (memory) or a scenario (even) splits."""
    return {"model": "llama-3.1-70b", "prompt_tokens": 512, "tokens": 16, "context": 1024,
            "regions": {"names": ["home"], "one_way_ms": [[0.0]]},
            "machines": [machine("mac", "m3-ultra", "home"), machine("4090s", "rtx-4090", "home", devices=4)],
            "published": {"system": "test", "split": split}}


@pytest.mark.parametrize("split", ["memory", "even"])
def test_on_mixed_machines_the_searchs_split_beats_the_published_one_and_says_why(split):
    """The memory split puts 67 of 80 layers on the Mac (most memory, slowest a layer), the even split 40: the Mac's
    stage takes the lap longest, and the search's split moves layers off it onto the 4090s (as many as they hold)."""
    result, space, _ = searched(spec_from_dict(mixed(split), "test"))
    case = result.published
    mac, gpus = case.layer_ms
    assert mac > gpus  # a layer costs more on the Mac
    assert case.bottleneck == 0 and case.theirs.layers[0] > case.ours.layers[0]
    assert case.ours.layers[1] == space.capacity(1, False, False)  # the 4090s hold all they can
    assert case.gain > 1.2
    assert case.ours_stage_ms[0] < case.theirs_stage_ms[0]
    assert f"stage 0 mac takes the lap longest: {case.theirs.layers[0]} layers" in case.reason
    assert f"moves {case.theirs.layers[0] - case.ours.layers[0]} layers off mac" in case.reason
    assert f"{case.gain:.2f}x the rate" in case.reason


def test_the_memory_split_cuts_at_the_cumulative_memory_shares():
    """exo's split: 80 layers over 512 GB and 96 GB cut at floor(80 x 512 / 608) = 67."""
    spec = spec_from_dict(mixed("memory"), "test")
    space = searched(spec)[1]
    assert space.memory_split((0, 1)) == ((67, 13), "")
    assert space.memory_split((1, 0)) == ((12, 68), "")  # floor(80 x 96 / 608) = 12
    assert space.memory_split((1,) * 7) == ((11, 11, 12, 11, 12, 11, 12), "")  # equal shares: the cuts floored


# --- the goodput objectives (testbed.studies.search.goodput) ---------------------------------------------------

SLO_WORKLOAD = {"prompt_tokens": 64, "output_tokens": 32, "goodput": "ttft:300 tpot:100", "requests": 200}


def slo_workload(**overrides):
    from testbed.studies.search.spec import Workload

    return Workload(**{**SLO_WORKLOAD, **overrides})


def goodput_at(t_ring_s: float, cap: int, **workload) -> float:
    from agents.modes.serve.queueing import RingModel
    from testbed.studies.search.goodput import goodput_of

    model = RingModel(compute_s=0.02, per_token_s=0.0005, t_ring_s=t_ring_s, cap=cap,
                      ttft_s=lambda prompt: 0.03 + t_ring_s)
    return goodput_of(model, slo_workload(**workload))[0]


def test_a_shorter_ring_has_the_higher_goodput_at_a_tight_ttft_target():
    """The same stages on a 20 ms ring and a 120 ms one: the long ring's lap holds each slot longer and its solo TTFT
    is most of a 200 ms target, so it meets the target at a lower rate (and at 150 ms not even alone)."""
    short, long = goodput_at(0.02, 16, goodput="ttft:200"), goodput_at(0.12, 16, goodput="ttft:200")
    assert short > 1.5 * long > 0
    assert goodput_at(0.12, 16, goodput="ttft:140") == 0.0 < goodput_at(0.02, 16, goodput="ttft:140")


def test_goodput_rises_with_the_cap():
    rates = [goodput_at(0.05, cap) for cap in (2, 8, 32)]
    assert rates[0] < rates[1] < rates[2]


def test_the_goodput_objective_ranks_by_goodput_and_prints_it_beside_tok_s(capsys):
    raw = {"model": "llama-3.1-8b", "objective": "goodput", "context": 4096, "workload": SLO_WORKLOAD,
           "machines": [machine("4090s", "rtx-4090", "frankfurt", count=2),
                        machine("a100", "a100-80gb", "paris")]}
    result, _, ranking = searched(spec_from_dict(raw, "test"))
    rates = [r.goodput_req_s for r in result.top]
    assert all(rate is not None for rate in rates) and rates == sorted(rates, reverse=True) and rates[0] > 0
    assert [s.objective for s in ranking[:len(rates)]] == rates
    assert "SLO ttft:300 tpot:100 at p90" in result.workload


@pytest.mark.parametrize("workload, objective, key", [
    ({**SLO_WORKLOAD, "promt_tokens": 64}, "goodput", "workload.promt_tokens"),  # a misspelt key
    ({**SLO_WORKLOAD, "attainment": 95}, "goodput", "workload.attainment"),  # no p95 in the model
    ({**SLO_WORKLOAD, "goodput": "ttft:fast"}, "goodput", "workload.goodput"),
    ({**SLO_WORKLOAD, "arrival": "trace"}, "goodput", "workload.arrival"),
    ({**SLO_WORKLOAD, "output_tokens": 0}, "goodput", "workload.output_tokens"),
    ({"prompt_tokens": 64}, "goodput_per_dollar", "workload.goodput"),  # the objective needs its SLO
    (None, "goodput", "workload"),
])
def test_bad_workload_keys_are_named(workload, objective, key):
    raw = {"model": "llama-3.1-8b", "objective": objective, "machines": [machine("a100", "a100-80gb", "paris")],
           **({"workload": workload} if workload is not None else {})}
    with pytest.raises(ConfigError) as caught:
        spec_from_dict(raw, "test")
    assert caught.value.key == key


def test_confirm_serves_the_goodput_winner_on_virtual_time_and_prints_its_attainment(tmp_path, capsys, monkeypatch):
    """Plumbing: the best ring of two stages or more served by the serve mode at its goodput (a short run), its
    measured attainment printed beside the target and written to the JSON."""
    from testbed.studies.search import goodput

    monkeypatch.setattr(goodput, "CONFIRM_REQUESTS", 20)
    path = write(tmp_path, 'model = "llama-3.1-8b"\nobjective = "goodput"\ncontext = 4096\n[workload]\n'
                           'prompt_tokens = 32\noutput_tokens = 8\ngoodput = "ttft:2000 tpot:200"\n'
                           '[[machines]]\nhardware = "rtx-4090"\nregion = "frankfurt"\ncount = 2\nprice_hour = 0.4\n')
    out_json = tmp_path / "out.json"
    assert cli.main(["search", str(path), "--confirm", "1", "--json", str(out_json)]) == 0
    check = json.loads(out_json.read_text())["goodput_check"]
    assert check["requests"] == 20 and check["target_pct"] == 90 and 0 <= check["measured_pct"] <= 100
    assert check["rate_req_s"] > 0 and check["shaper"] == "virtual" and " -> " in check["ring"]
    assert "measured SLO attainment" in capsys.readouterr().out
