"""The shipped catalogues (testbed.deploy): every entry sourced and checked, hand-checked facts, physical sanity."""

from __future__ import annotations

import pytest

from testbed.core.errors import ConfigError
from testbed.deploy import DTYPE_BYTES, hardware, hardware_preset, model_preset, models, region, regions
from testbed.deploy.catalog import parse_hardware, parse_models, parse_regions, read_catalogue

pytestmark = pytest.mark.exact

REQUIRED_MODELS = {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b", "mixtral-8x22b", "deepseek-v3",
                   "seed-700b"}
REQUIRED_HARDWARE = {"a100-80gb", "h100-sxm", "h200", "mi300x", "rtx-4090", "m2-ultra", "m3-ultra"}
REQUIRED_REGIONS = {"hong-kong", "ireland", "virginia", "frankfurt", "tokyo", "singapore", "sydney", "sao-paulo",
                    "oregon", "n-california", "mumbai", "london"}
HK_DUBLIN_KM = 9848.0  # shared/PUBLISHED.md


def test_the_required_presets_exist():
    assert REQUIRED_MODELS <= set(models())
    assert REQUIRED_HARDWARE <= set(hardware())
    assert REQUIRED_REGIONS <= set(regions().names)


def test_every_entry_names_its_source():
    for preset in [*models().values(), *hardware().values()]:
        assert preset.source.strip(), preset.name
    for preset in hardware().values():
        assert preset.efficiency_source.strip(), preset.name
    catalog = regions()
    assert catalog.source.strip() and catalog.date.strip()
    assert all(r.provider.strip() and r.city.strip() for r in catalog.regions)


def test_hand_checked_model_facts():
    llama70 = model_preset("llama-3.1-70b")
    assert (llama70.d_model, llama70.layers, llama70.kv_heads, llama70.head_dim) == (8192, 80, 8, 128)
    assert llama70.kv_bytes_per_token == 327_680  # 2 * 8 * 128 * 80 * 2 bytes
    assert llama70.hidden_bytes() == 16_384 and llama70.hidden_bytes(4) == 65_536
    seed = model_preset("seed-700b")
    assert seed.hidden_bytes(1) == 32 * 1024  # the seed paper's 32 KiB crossing tensor
    assert seed.params == 700_000_000_000 and seed.weight_bytes == 1_400_000_000_000
    deepseek = model_preset("deepseek-v3")
    assert 2 * deepseek.kv_heads * deepseek.head_dim == 576  # MLA: kv_lora_rank 512 + rope 64 cached per layer
    assert deepseek.bytes_per_value == 1 and deepseek.active_params < deepseek.params
    mixtral = model_preset("mixtral-8x22b")
    assert mixtral.active_weight_bytes < mixtral.weight_bytes
    for preset in models().values():
        assert preset.bytes_per_value == DTYPE_BYTES[preset.dtype]
        if preset.active_params == preset.params:  # dense: the residual width is the query heads' width
            assert preset.d_model == preset.heads * preset.head_dim, preset.name


def test_hand_checked_hardware_facts():
    h100 = hardware_preset("h100-sxm")
    assert h100.memory_bw_gbs == 3350 and h100.memory_bw_bytes_s == 3.35e12
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.peak_flops("fp8") == pytest.approx(1978.9e12)
    assert h100.peak_flops("f32") == pytest.approx(67e12)  # the datasheet's FP32 figure
    a100 = hardware_preset("a100-80gb")
    assert a100.peak_flops("fp8") == a100.peak_flops("bf16")  # no FP8 datapath: runs at the 16-bit rate
    assert hardware_preset("h200").memory_gb == 141
    for preset in hardware().values():
        assert 0 < preset.mem_efficiency <= 1 and 0 < preset.flop_efficiency <= 1
        assert preset.peak_flops("fp8") >= preset.peak_flops("bf16") > 0
    with pytest.raises(ConfigError, match="unknown dtype 'int3'"):
        h100.peak_flops("int3")


def test_the_region_matrix_is_square_with_a_zero_diagonal():
    catalog = regions()
    n = len(catalog.names)
    assert len(catalog.one_way_ms) == n and all(len(row) == n for row in catalog.one_way_ms)
    assert all(catalog.one_way_ms[i][i] == 0 for i in range(n))
    assert {r.name for r in catalog.regions} == set(catalog.names)
    assert region("hong-kong").provider == "aws ap-east-1"
    assert region("ireland").provider == "aws eu-west-1" and region("ireland").city == "Dublin"
    assert region("virginia").provider == "aws us-east-1"


def test_every_latency_is_at_least_its_fiber_floor():
    catalog = regions()
    ratios = []
    for a in catalog.names:
        for b in catalog.names:
            if a != b:
                ratios.append((catalog.latency_ms(a, b) / catalog.fiber_floor_ms(a, b), a, b))
    ratios.sort()
    print("latency / fiber floor: lowest", [f"{a}->{b} {r:.2f}" for r, a, b in ratios[:3]],
          "highest", [f"{a}->{b} {r:.2f}" for r, a, b in ratios[-3:]])
    below = [f"{a}->{b}: {catalog.latency_ms(a, b):.2f} ms < floor {catalog.fiber_floor_ms(a, b):.2f} ms"
             for r, a, b in ratios if r < 1]
    assert not below, "faster than light in fiber (wrong coordinates?): " + "; ".join(below)


def test_hong_kong_to_dublin_is_the_published_great_circle():
    catalog = regions()
    assert catalog.distance_km("hong-kong", "ireland") == pytest.approx(HK_DUBLIN_KM, rel=0.01)
    assert catalog.distance_km("ireland", "hong-kong") == pytest.approx(catalog.distance_km("hong-kong", "ireland"))
    assert catalog.fiber_floor_ms("hong-kong", "ireland") == pytest.approx(49.24, abs=0.5)  # 5 us per km


def test_a_sub_matrix_keeps_the_order_asked_for():
    catalog = regions()
    names, rows = catalog.matrix(["virginia", "hong-kong", "ireland"])
    assert names == ("virginia", "hong-kong", "ireland")
    assert rows[1][2] == catalog.latency_ms("hong-kong", "ireland")
    assert rows[2][1] == catalog.latency_ms("ireland", "hong-kong")
    assert [rows[i][i] for i in range(3)] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("lookup, kind, known", [
    (model_preset, "model preset", "deepseek-v3, llama-3.1-405b"),
    (hardware_preset, "hardware preset", "a100-80gb, apple-m1, h100-sxm"),
    (region, "region", "frankfurt, hong-kong"),
])
def test_an_unknown_name_lists_the_known_ones(lookup, kind, known):
    with pytest.raises(ConfigError, match=f"unknown {kind} 'nowhere-9'; known: {known}") as caught:
        lookup("nowhere-9", source="scenario.toml", key="stages[0].model")
    assert (caught.value.source, caught.value.key) == ("scenario.toml", "stages[0].model")
    with pytest.raises(ConfigError, match="unknown region 'atlantis'"):
        regions().latency_ms("hong-kong", "atlantis")


GOOD_MODEL = """
["tiny-1b"]
source = "a test"
d_model = 2048
layers = 16
heads = 16
kv_heads = 4
head_dim = 128
ffn = 8192
vocab = 32000
params_b = 1.0
active_params_b = 1.0
dtype = "bf16"
context = 4096
"""


@pytest.mark.parametrize("change, key, message", [
    (("layers = 16", "layers = 0"), "tiny-1b.layers", "expected an integer >= 1"),
    (("layers = 16", "layers = 16.5"), "tiny-1b.layers", "expected an integer"),
    (("layers = 16\n", ""), "tiny-1b.layers", "missing key"),
    (('source = "a test"', 'source = ""'), "tiny-1b.source", "non-empty string"),
    (("ffn = 8192", "ffn = 8192\nflops = 3"), "tiny-1b.flops", "unknown key"),
    (('dtype = "bf16"', 'dtype = "int4"'), "tiny-1b.dtype", "expected one of"),
    (("heads = 16", "heads = 15"), "tiny-1b.heads", "not a multiple of heads"),
    (("kv_heads = 4", "kv_heads = 3"), "tiny-1b.kv_heads", "not a multiple of kv_heads"),
    (("active_params_b = 1.0", "active_params_b = 2.0"), "tiny-1b.active_params_b", "<= 1"),
    (("params_b = 1.0", "params_b = -1.0"), "tiny-1b.params_b", "> 0"),
])
def test_a_planted_bad_model_catalogue_names_file_and_key(tmp_path, change, key, message):
    path = tmp_path / "bad-models.toml"
    path.write_text(GOOD_MODEL.replace(*change))
    with pytest.raises(ConfigError, match=message) as caught:
        read_catalogue(path, parse_models)
    assert (caught.value.source, caught.value.key) == (str(path), key)


def test_the_good_planted_catalogue_parses(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(GOOD_MODEL)
    tiny = read_catalogue(path, parse_models)["tiny-1b"]
    assert tiny.params == 1_000_000_000 and tiny.kv_bytes_per_token == 2 * 4 * 128 * 16 * 2


def test_a_planted_bad_hardware_or_region_catalogue_names_the_key():
    hw = {"gpu-x": {"source": "s", "memory_gb": 80, "memory_bw_gbs": 2000, "tflops_bf16": 300, "tflops_fp8": 0,
                    "mem_efficiency": 1.5, "flop_efficiency": 0.5, "efficiency_source": "assumed"}}
    with pytest.raises(ConfigError, match="expected a number <= 1") as caught:
        parse_hardware(hw, "hw.toml")
    assert (caught.value.source, caught.value.key) == ("hw.toml", "gpu-x.mem_efficiency")
    hw["gpu-x"].update(mem_efficiency=0.8, efficiency_source="")
    with pytest.raises(ConfigError, match="non-empty string") as caught:
        parse_hardware(hw, "hw.toml")
    assert caught.value.key == "gpu-x.efficiency_source"
    base = {"source": "s", "date": "2025-05-29", "names": ["a", "b"], "one_way_ms": [[0.0, 5.0], [5.0, 0.0]],
            "regions": {"a": {"city": "A", "provider": "p a", "lat": 0.0, "lon": 0.0},
                        "b": {"city": "B", "provider": "p b", "lat": 0.0, "lon": 1.0}}}
    assert parse_regions(base, "r.toml").latency_ms("a", "b") == 5.0
    for change, key in [({"one_way_ms": [[1.0, 5.0], [5.0, 0.0]]}, "one_way_ms[0][0]"),
                        ({"one_way_ms": [[0.0, 5.0]]}, "one_way_ms"),
                        ({"names": ["a", "c"]}, "names"),
                        ({"regions": {**base["regions"], "b": {"city": "B", "provider": "p", "lat": 91.0,
                                                               "lon": 0.0}}}, "regions.b.lat"),
                        ({"date": ""}, "date")]:
        with pytest.raises(ConfigError) as caught:
            parse_regions({**base, **change}, "r.toml")
        assert (caught.value.source, caught.value.key) == ("r.toml", key)


def test_a_catalogue_that_is_not_toml_is_a_config_error(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[unclosed\n")
    with pytest.raises(ConfigError, match="not valid TOML") as caught:
        read_catalogue(path, parse_models)
    assert caught.value.source == str(path)
