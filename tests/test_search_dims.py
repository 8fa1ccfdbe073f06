"""The search's wire, KV, batch-cap and TP dimensions (testbed.studies.search.dims) move the way the physics says: a
smaller codec wins on a slow rated link by its bytes and ties on an unlimited one (loses where encoding costs time);
shipped KV loses on a rated link by exactly its bytes; a larger batch cap raises the goodput until the KV of its
streams no longer fits, where it is refused; TP across two machines of a region beats PP across them over a fast
LAN and loses over a slow one, its all-reduces priced as physics.tp_token_s; every new key's bad value is named."""

from __future__ import annotations

import pytest

from agents.process.wire import HEADER
from testbed import cli
from testbed.core import physics
from testbed.core.errors import ConfigError
from testbed.studies.search import goodput
from testbed.studies.search.dims import Dims, allreduce_s
from testbed.studies.search.measure import searched
from testbed.studies.search.spec import spec_from_dict

pytestmark = pytest.mark.exact


def machine(name: str, hardware: str, region: str, count: int = 1, **more) -> dict:
    return {"name": name, "hardware": hardware, "region": region, "count": count, "price_hour": 1.0, **more}


def search(machines: list[dict], model: str = "llama-3.1-70b", **top):
    raw = {"model": model, "prompt_tokens": 512, "tokens": 16, "context": 1024, "machines": machines, **top}
    return searched(spec_from_dict(raw, "test"))


# 70B needs both A100s: every candidate is a ring of two hops Virginia <-> Ohio
TWO = [machine("va", "a100-80gb", "virginia"), machine("oh", "a100-80gb", "ohio")]
CODECS = {"codecs": ["f32", "f16", "int8-block"]}


def plain(scored, **settings):
    """The best plain candidate with these settings (codec, kv, ranks)."""
    return next(s for s in scored if s.candidate.mode == "off"
                and all(getattr(s.candidate, k) == v for k, v in settings.items()))


def test_a_smaller_codec_wins_on_a_slow_link_by_its_bytes():
    result, space, scored = search(TWO, rate_mbit=10, wire=CODECS)
    assert result.top[0].codec == "int8-block"
    assert space.same_bytes == {"f16": "f32"}  # a bf16 model's f16 frame is its f32 frame: scored once
    f32, int8 = plain(scored, codec="f32"), plain(scored, codec="int8-block")
    assert f32.candidate.layers == int8.candidate.layers
    saved = sum(space.hop_bytes(f32.candidate.layers, 1, ("f32", "local"))) \
        - sum(space.hop_bytes(f32.candidate.layers, 1, ("int8-block", "local")))
    assert saved > 0
    assert 1 / f32.tok_s - 1 / int8.tok_s == pytest.approx(saved * 8 / 10e6, rel=1e-9)


def test_on_an_unlimited_link_the_codec_ties_and_loses_where_encoding_costs():
    _, _, scored = search(TWO, rate_mbit=0, wire=CODECS)
    assert plain(scored, codec="int8-block").tok_s == pytest.approx(plain(scored, codec="f32").tok_s, rel=1e-12)
    result, space, scored = search(TWO, rate_mbit=0, wire={**CODECS, "codec_gb_s": 1.0})
    assert result.top[0].codec == "f32"
    f32, int8 = plain(scored, codec="f32"), plain(scored, codec="int8-block")
    # each of the two hops encodes and decodes a token's 8192 float32 values at 1 GB/s
    assert 1 / int8.tok_s - 1 / f32.tok_s == pytest.approx(2 * 2 * 8192 * 4 / 1e9, rel=1e-9)


def test_shipped_kv_never_wins_on_a_rated_link_and_loses_by_its_bytes():
    result, space, scored = search(TWO, rate_mbit=100, placement={"kv": ["local", "ship"]})
    assert {s.candidate.kv for s in scored} == {"local", "ship"}
    assert result.top[0].kv == "local"
    local = {(s.candidate.layers, s.candidate.stages): s for s in scored if s.candidate.kv == "local"}
    for s in scored:
        c = s.candidate
        if c.kv != "ship":
            continue
        twin = local[(c.layers, c.stages)]
        assert s.tok_s < twin.tok_s
        # every hop carries its sender's new K and V: a header and one position on its layers (70B: 4 KiB a layer)
        extra = sum(HEADER.size + layers * space.kv_layer_bytes for layers in c.layers)
        assert space.kv_layer_bytes == 2 * 8 * 128 * 2
        assert 1 / s.tok_s - 1 / twin.tok_s == pytest.approx(extra * 8 / 100e6, rel=1e-9)
    _, _, free = search(TWO, rate_mbit=0, placement={"kv": ["local", "ship"]})
    assert plain(free, kv="ship").tok_s == pytest.approx(plain(free, kv="local").tok_s, rel=1e-12)


CAP_WORKLOAD = {"prompt_tokens": 2048, "output_tokens": 512, "goodput": "ttft:2000 tpot:100", "requests": 200,
                "streams": [1, 4, 16, 64, 256]}


@pytest.mark.parametrize("memory_gb, best, refused", [(80, 64, [256]), (30, 16, [64, 256])])
def test_a_larger_cap_raises_the_goodput_until_the_kv_of_its_streams_does_not_fit(memory_gb, best, refused):
    """Llama-3.1-8B alone on an A100: a request's KV is 2560 positions x 32 layers x 4 KiB = 336 MB; beside 16 GB of
    weights and the 1 GB embedding and head, 80 GB holds 190 of them, 30 GB 41."""
    result, space, ranking = search([machine("a100", "a100-80gb", "paris", memory_gb=memory_gb)],
                                    model="llama-3.1-8b", objective="goodput", workload=CAP_WORKLOAD)
    m = space.spec.model
    weights = m.params * m.bytes_per_value
    holds = int((memory_gb * 1e9 - weights) // (m.layers * space.kv_layer_bytes * 2560))
    assert goodput.kv_cap(space, ranking[0].candidate, space.spec.workload) == holds
    by_cap = {s.candidate.cap: s.objective for s in ranking}
    fits = [cap for cap in CAP_WORKLOAD["streams"] if cap <= holds]
    assert sorted(by_cap) == fits and [cap for cap in CAP_WORKLOAD["streams"] if cap > holds] == refused
    rates = [by_cap[cap] for cap in fits]
    assert rates == sorted(rates) and rates[0] < rates[-1]  # a larger cap, a higher goodput
    assert result.top[0].cap == best and result.top[0].settings.endswith(f"cap {best}")
    for cap in refused:
        assert any(r.reason.startswith(f"workload.streams {cap}:") for r in result.refusals)


# Llama-3.1-70B on two single-H100 boxes in one region: PP passes the layers one box after the other; TP reads
# every layer's weights on both at once, at two all-reduces a layer over the LAN
PAIR = [machine("h", "h100-sxm", "virginia", count=2)]


@pytest.mark.parametrize("lan, tp_wins", [({"one_way_ms": 0.005, "gbit_s": 400}, True),
                                          ({"one_way_ms": 0.05, "gbit_s": 100}, True),
                                          ({"one_way_ms": 0.5, "gbit_s": 10}, False)])
def test_tp_across_a_regions_machines_beats_pp_over_a_fast_lan_and_loses_over_a_slow_one(lan, tp_wins):
    result, space, scored = search(PAIR, placement={"parallel": ["pp", "tp"]}, lan=lan)
    tp, pp = plain(scored, ranks=(2,)), plain(scored, ranks=())
    assert len(pp.candidate.stages) == 2 and tp.candidate.stages == (0,)
    assert (tp.tok_s > pp.tok_s) is tp_wins
    assert (result.top[0].ranks == (2,)) is tp_wins
    # the TP stage's pass: its roofline on both boxes' devices, plus 2 L ring all-reduces of 2 (N - 1) messages
    roof = space._roofline(0, 80, True, 2)
    message = lan["one_way_ms"] / 1e3 + 8192 * 2 / 2 * 8 / (lan["gbit_s"] * 1e9)
    assert 1 / tp.tok_s == pytest.approx(roof.seconds(1, 1, space.spec.decode_context) + 2 * 80 * 2 * message,
                                         rel=1e-12)
    assert tp.cost_hour == pp.cost_hour == 2.0


@pytest.mark.parametrize("ranks, layers", [(2, 1), (2, 80), (4, 3)])
def test_the_all_reduce_price_is_physics_tp_token_s_on_a_uniform_ring(ranks, layers):
    dims = Dims(lan_ms=0.05, lan_gbit_s=100.0)
    message = 0.05e-3 + 8192 * 2 / ranks * 8 / 100e9
    links = {(i, j): message for i in range(ranks) for j in range(ranks) if i != j}
    segment = 1e-4
    assert physics.tp_token_s(links, ranks, layers, segment, 0.0, "ring") == pytest.approx(
        2 * layers * segment + allreduce_s(ranks, layers, 1, 2, 8192, dims), rel=1e-9)


def test_without_tp_no_group_is_a_candidate_and_a_groups_memory_is_its_machines():
    _, space, scored = search(PAIR)
    assert all(not s.candidate.ranks for s in scored)
    assert space.capacity(0, True, False, 2) >= 2 * space.capacity(0, True, False) - 1


@pytest.mark.parametrize("table, key", [
    ({"wire": {"codecs": ["f8"]}}, "wire.codecs"),
    ({"wire": {"codecs": []}}, "wire.codecs"),
    ({"wire": {"block": 0}}, "wire.block"),
    ({"wire": {"codec_gb_s": -1}}, "wire.codec_gb_s"),
    ({"wire": {"codec": "f16"}}, "wire.codec"),  # a scenario's key, not the search's
    ({"placement": {"kv": ["migrate"]}}, "placement.kv"),
    ({"placement": {"parallel": ["tp"]}}, "placement.parallel"),
    ({"placement": {"parallel": "tp"}}, "placement.parallel"),
    ({"lan": {"one_way_ms": -0.1}}, "lan.one_way_ms"),
    ({"lan": {"gbit_s": 0}}, "lan.gbit_s"),
    ({"lan": 5}, "lan"),
    ({"objective": "goodput", "workload": {**CAP_WORKLOAD, "streams": [0, 4]}}, "workload.streams"),
    ({"objective": "goodput", "workload": {**CAP_WORKLOAD, "streams": []}}, "workload.streams"),
])
def test_bad_dimension_keys_are_named(table, key):
    with pytest.raises(ConfigError) as caught:
        spec_from_dict({"model": "llama-3.1-8b", "machines": [machine("a", "a100-80gb", "paris")], **table}, "test")
    assert caught.value.key == key


def test_a_bad_dimension_key_exits_2_naming_it(tmp_path, capsys):
    path = tmp_path / "in.toml"
    path.write_text('model = "llama-3.1-8b"\n[[machines]]\nhardware = "a100-80gb"\nregion = "paris"\n'
                    '[placement]\nkv = ["local", "migrate"]\n')
    assert cli.main(["search", str(path), "--confirm", "0"]) == 2
    assert f"{path}: placement.kv:" in capsys.readouterr().out


def test_the_winner_line_says_the_codec_kv_and_parallelism(tmp_path, capsys):
    path = tmp_path / "in.toml"
    path.write_text('model = "llama-3.1-70b"\nrate_mbit = 10\ncontext = 1024\n'
                    '[[machines]]\nname = "va"\nhardware = "a100-80gb"\nregion = "virginia"\n'
                    '[[machines]]\nname = "oh"\nhardware = "a100-80gb"\nregion = "ohio"\n'
                    '[wire]\ncodecs = ["f32", "int8-block"]\n[placement]\nkv = ["local", "ship"]\n')
    assert cli.main(["search", str(path), "--confirm", "0"]) == 0
    out = capsys.readouterr().out
    assert "int8-block, KV local, PP" in out
    assert "searched: codecs f32, int8-block; KV local, ship; a stage a machine" in out


def test_a_tp_group_int8_and_shipped_kv_run_on_virtual_time_as_priced():
    """The new dimensions at once, built as a scenario (a TP group of two 4090s as one stage priced by its profile,
    then an A100 across the border; int8-block frames and shipped KV at 100 Mbit/s; two round trips a hop) and run
    on virtual time: the measured rate is the search's closed form (plain decode: exactly, as every frame's bytes
    are)."""
    import trio

    from testbed.launch.launcher import run_scenario
    from testbed.studies.search.scenarios import build

    raw = {"model": "llama-3.1-8b", "prompt_tokens": 64, "tokens": 8, "context": 1024, "rate_mbit": 100,
           "machines": [machine("4090", "rtx-4090", "frankfurt", count=2), machine("a100", "a100-80gb", "paris")],
           "wire": {"codecs": ["int8-block"], "round_trips": 2},
           "placement": {"kv": ["ship"], "parallel": ["pp", "tp"]},
           "lan": {"one_way_ms": 0.005, "gbit_s": 400}, "constraints": {"head_region": "frankfurt"}}
    _, space, scored = searched(spec_from_dict(raw, "test"))
    s = plain(scored, ranks=(2, 1))
    assert (s.candidate.codec, s.candidate.kv) == ("int8-block", "ship")
    scenario = build(space.spec, s.candidate, space)
    assert scenario.wire.codec == "int8-block" and scenario.placement.kv == "ship"
    assert scenario.wire.stage_layers == s.candidate.layers and scenario.stages[0].devices == 2
    summary = trio.run(lambda: run_scenario(scenario, "virtual", log=lambda m: None))
    assert summary.measured_tok_s == pytest.approx(s.tok_s, rel=1e-6)


@pytest.mark.parametrize("n", [2, 5])
def test_n_round_trips_a_hop_cost_2n_minus_1_one_way_delays_on_every_hop(n):
    """[wire] round_trips = n: a hop waits out n - 1 request and reply exchanges beside its frame's one way, so a
    plain lap gains 2 (n - 1) T_ring (T_ring: the one-way delays of the lap's hops) and nothing else: the same
    split, the frame's bytes serialized once."""
    _, space1, scored1 = search(TWO, rate_mbit=10)
    _, space_n, scored_n = search(TWO, rate_mbit=10, wire={"round_trips": n})
    assert space_n.spec.dims.hop_delays == 2 * n - 1 and space1.spec.dims.hop_delays == 1
    one = {(s.candidate.stages, s.candidate.layers): s for s in scored1 if s.candidate.mode == "off"}
    matched = 0
    for s in scored_n:
        if s.candidate.mode != "off":
            continue
        base = one[(s.candidate.stages, s.candidate.layers)]
        ring = [space1.spec.machines[g].region for g in s.candidate.stages]
        t_ring_s = sum(space1.spec.matrix.ms(a, b) for a, b in zip(ring, ring[1:] + ring[:1])) / 1e3
        assert t_ring_s > 0
        assert 1 / s.tok_s - 1 / base.tok_s == pytest.approx(2 * (n - 1) * t_ring_s, rel=1e-9)
        matched += 1
    assert matched > 0


def test_round_trips_favour_the_shorter_ring():
    """Three round trips a hop triple-and-more the ring's share of a lap: a ring across the Atlantic loses more
    than one inside a continent, so the rate falls by more where the ring is longer."""
    far = [machine("va", "a100-80gb", "virginia"), machine("fr", "a100-80gb", "frankfurt")]
    rates = {}
    for name, machines in (("near", TWO), ("far", far)):
        for n in (1, 3):
            rates[name, n] = search(machines, rate_mbit=1000, wire={"round_trips": n})[0].top[0].tok_s
    assert rates["near", 3] < rates["near", 1] and rates["far", 3] < rates["far", 1]
    assert rates["far", 1] / rates["far", 3] > rates["near", 1] / rates["near", 3]


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", 65, True])
def test_a_bad_round_trips_is_named(value):
    with pytest.raises(ConfigError) as caught:
        spec_from_dict({"model": "llama-3.1-8b", "machines": [machine("a", "a100-80gb", "paris")],
                        "wire": {"round_trips": value}}, "test")
    assert caught.value.key == "wire.round_trips"


def test_a_bad_round_trips_exits_2_naming_it(tmp_path, capsys):
    path = tmp_path / "in.toml"
    path.write_text('model = "llama-3.1-8b"\n[[machines]]\nhardware = "a100-80gb"\nregion = "paris"\n'
                    '[wire]\nround_trips = 0\n')
    assert cli.main(["search", str(path), "--confirm", "0"]) == 2
    assert f"{path}: wire.round_trips:" in capsys.readouterr().out
