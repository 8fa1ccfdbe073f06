"""Scenarios: built-ins load, --set overrides apply, bad input names the file, the key and the expectation."""

import pytest

from agents.modes.speculative.settings import SpecSettings
from testbed.scenario.config import builtin_names, load_scenario
from testbed.scenario.stages import split_layers
from testbed.core.errors import ConfigError

GOOD = '''
name = "t"
[[stages]]
name = "a"
compute_ms = 2
[[stages]]
name = "b"
[network]
hops_ms = [3, 4]
[decode]
tokens = 5
'''


def write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_builtins_load_and_geo_ring_is_the_paper_ring():
    names = builtin_names()
    assert "geo-ring" in names and sum(n.startswith("table2-") for n in names) == 7
    for name in names:
        load_scenario(name)
    geo = load_scenario("geo-ring")
    assert [l.delay_ms for l in geo.ring] == [130, 40, 110]
    assert [(l.src, l.dst) for l in geo.ring] == [(0, 1), (1, 2), (2, 0)]
    assert geo.t_ring_s == pytest.approx(0.280) and geo.emulated_compute_s == pytest.approx(0.033)


def test_overrides(tmp_path):
    sc = load_scenario(write(tmp_path, GOOD), ["decode.k=auto", "network.hops_ms=[1, 2]", "stages.*.compute_ms=7",
                                               "decode.prompt=hello world", "decode.mode=speculative"])
    assert sc.decode.settings(SpecSettings).k == "auto" and sc.decode.prompt == "hello world" and sc.decode.mode == "speculative"
    assert [l.delay_ms for l in sc.ring] == [1, 2]
    assert [s.compute_ms for s in sc.stages] == [7, 7]
    sc = load_scenario(write(tmp_path, GOOD), ["stages.1.compute_ms=9", "scale=0.5"])
    assert [s.compute_ms for s in sc.stages] == [1.0, 4.5] and [l.delay_ms for l in sc.ring] == [1.5, 2.0]


def test_extra_links_make_any_matrix(tmp_path):
    text = GOOD + '''
[[network.links]]
src = 1
dst = 0
delay_ms = 9
'''
    with pytest.raises(ConfigError, match="already defined"):
        load_scenario(write(tmp_path, text))
    text = GOOD.replace("[[stages]]\nname = \"b\"", "[[stages]]\nname = \"b\"\n[[stages]]\nname = \"c\"").replace(
        "hops_ms = [3, 4]", "hops_ms = [3, 4, 5]") + "[[network.links]]\nsrc = 0\ndst = 2\ndelay_ms = 9\n"
    sc = load_scenario(write(tmp_path, text))
    assert [(l.src, l.dst, l.delay_ms) for l in sc.links][-1] == (0, 2, 9)
    assert len(sc.ring) == 3


@pytest.mark.parametrize("edit, key, expected", [
    (("compute_ms = 2", "compute_ms = -1"), "stages[0].compute_ms", "in [0, 60000]"),
    (("hops_ms = [3, 4]", "hops_ms = [3, -4]"), "network.hops_ms[1]", "got -4"),
    (("hops_ms = [3, 4]", "hops_ms = [3]"), "network.hops_ms", "expected 2 ring hop delays"),
    (("tokens = 5", "tokens = 0"), "decode.tokens", "in [1, 100000]"),
    (("tokens = 5", "tokenz = 5"), "decode.tokenz", "unknown key"),
    (("[network]", "[netwerk]"), "netwerk", "unknown key"),
    (("tokens = 5", "mode = \"fast\""), "decode.mode", "plain, speculative"),
    (("tokens = 5", "k = \"many\""), "decode.k", "integer"),
    (("compute_ms = 2", "compute_ms = \"slow\""), "stages[0].compute_ms", "a finite number"),
])
def test_bad_input_names_file_key_and_expectation(tmp_path, edit, key, expected):
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    message = str(info.value)
    assert path in message and key in message and expected in message


def test_zero_stages_and_not_toml(tmp_path):
    with pytest.raises(ConfigError, match="non-empty array of \\[\\[stages\\]\\]"):
        load_scenario(write(tmp_path, 'name = "x"\n'))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(write(tmp_path, "[[[", "bad.toml"))
    with pytest.raises(ConfigError, match="no built-in scenario"):
        load_scenario("no-such-scenario")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_scenario("geo-ring", ["decode.k"])


def test_split_layers():
    sc = load_scenario("geo-ring")
    assert split_layers(6, sc.stages) == [(0, 2), (2, 4), (4, 6)]
    assert split_layers(7, sc.stages) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ConfigError, match="only 2 layers"):
        split_layers(2, sc.stages)


def test_decode_crosses_to_the_agents_typed_and_back_to_its_section():
    """Each mode's own keys stay in [decode] (decode.k, decode.tree_n) and come back typed as its settings."""
    from agents.modes.tree.settings import TreeSettings
    from testbed.core.decode import DecodeConfig
    from testbed.scenario.decode import decode_from_dict

    sc = load_scenario("geo-ring", ["decode.k=auto", "decode.tree_n=8", "decode.k_sweep=[2, 4]"])
    decode = DecodeConfig.from_json(sc.decode.to_json())
    assert decode == sc.decode and isinstance(decode.settings(TreeSettings), TreeSettings)
    assert decode.settings(TreeSettings).tree_n == 8 and decode.settings(SpecSettings).k_sweep == (2, 4)
    section = decode.to_section()
    assert section["k"] == "auto" and section["tree_n"] == 8 and "mode_settings" not in section
    assert decode_from_dict({**section, "k_sweep": list(section["k_sweep"])}, "<again>") == decode
