"""The probe study (testbed.studies.probe): on virtual time every link comes back as the scenario configured it
(delay and rate, exactly), its output file is a region matrix a search reads unchanged and ranks as it ranks the
scenario's own figures, the matrix's unmeasured entries are filled and marked, and bad input is named with exit 2."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import testbed
from testbed import cli
from testbed.core.errors import ConfigError
from testbed.scenario.config import load_scenario
from testbed.studies.probe.ladder import parse_sizes
from testbed.studies.probe.links import fill_matrix, parse
from testbed.studies.search.measure import searched
from testbed.studies.search.spec import load_spec

pytestmark = pytest.mark.exact
EXACT_MS = 1e-9


@pytest.mark.parametrize("scenario, rate", [("geo-ring", 100.0), ("table2-regional", 100.0), ("geo-ring", 0.0)])
def test_every_configured_delay_and_rate_comes_back_exactly_on_virtual_time(scenario, rate):
    overrides = [f"network.rate_mbit={rate:g}"] if rate else []
    result = testbed.probe(scenario, shaper="virtual", sizes="64,16Ki,1Mi", samples=5, overrides=overrides[:1])
    configured = load_scenario(scenario, overrides).links
    assert result.shaper == "virtual" and len(result.probe_links) == len(configured)
    for row, link in zip(result.probe_links, configured):
        assert row.link == link.name and row.configured_ms == link.delay_ms
        for figure in (row.latency_ms, row.latency_ms_p99, row.latency_ms_min):
            assert figure == pytest.approx(link.delay_ms, abs=EXACT_MS)
        assert row.goodput_mbit == pytest.approx(rate, rel=1e-9)  # 0: an unlimited link shows no rate
        assert [s.samples for s in row.sizes] == [5, 5, 5]
        for size in row.sizes:  # NetPIPE's one-way time: the delay plus the size at the rate
            serialization_ms = size.size_bytes * 8 / (rate * 1e6) * 1e3 if rate else 0.0
            assert size.one_way_ms_p50 == pytest.approx(link.delay_ms + serialization_ms, abs=EXACT_MS)
    assert result.rate_mbit == pytest.approx(rate, rel=1e-9)


def test_a_size_over_its_share_of_the_budget_is_skipped_and_said_so():
    result = testbed.probe("table2-regional", shaper="virtual", sizes="64,1Mi,32Mi", samples=5, budget_s=18.0,
                           overrides="network.rate_mbit=10")  # 32 MiB at 10 Mbit/s is 27 s a message
    for row in result.probe_links:
        assert [s.samples > 0 for s in row.sizes] == [True, True, False]
        assert "over its share of the budget" in row.sizes[2].skipped
        assert row.goodput_mbit == pytest.approx(10.0, rel=1e-9)
    assert row.sizes[1].samples == 3  # 1 MiB takes 0.84 s: its share (~3 s) holds the fewest a size gets
    assert result.seconds <= 18.0  # within the budget


SEARCH = """model = "llama-3.1-70b"
prompt_tokens = 512
tokens = 16
context = 1024
{regions}

[[machines]]
name = "a100-hk"
hardware = "a100-80gb"
region = "hong-kong"

[[machines]]
name = "h100-dub"
hardware = "h100-sxm"
region = "dublin"

[[machines]]
name = "a100-ny"
hardware = "a100-80gb"
region = "new-york"
"""


def configured_regions(scenario: str, names: list[str]) -> str:
    """The scenario's own hops as a [regions] table (each hop both ways: the ring configures one direction)."""
    sc = load_scenario(scenario)
    ms = {(link.src, link.dst): link.delay_ms for link in sc.links}
    rows = [[0.0 if a == b else ms.get((a, b), ms.get((b, a))) for b in range(len(names))] for a in range(len(names))]
    return f"[regions]\nnames = {json.dumps(names)}\none_way_ms = {json.dumps(rows)}\n"


def test_the_output_file_is_a_region_matrix_the_search_reads_and_ranks_as_the_scenario(tmp_path):
    out = tmp_path / "links.toml"
    result = testbed.probe("geo-ring", shaper="virtual", sizes="64,1Mi", samples=3, out=str(out),
                           overrides="network.rate_mbit=1000")
    (tmp_path / "probed.toml").write_text(SEARCH.format(regions='regions = "links.toml"'))  # relative to the file
    (tmp_path / "configured.toml").write_text(
        SEARCH.format(regions="rate_mbit = 1000\n" + configured_regions("geo-ring", list(result.names))))
    probed, configured = load_spec(str(tmp_path / "probed.toml")), load_spec(str(tmp_path / "configured.toml"))
    assert probed.matrix.names == result.names == ("hong-kong", "dublin", "new-york")
    for got, want in zip(probed.matrix.one_way_ms, configured.matrix.one_way_ms):
        assert got == pytest.approx(want, abs=1e-3)  # the file keeps 4 places
    assert probed.matrix.ms("hong-kong", "dublin") == pytest.approx(130.0, abs=1e-3)
    assert probed.rate_mbit == pytest.approx(1000.0) == configured.rate_mbit  # the probe's slowest goodput
    assert "links.toml" not in probed.matrix.source and "probe geo-ring" in probed.matrix.source
    a, b = searched(probed)[0].top[0], searched(configured)[0].top[0]
    assert (a.ring, a.layers, a.split, a.decode) == (b.ring, b.layers, b.split, b.decode)
    assert a.tok_s == pytest.approx(b.tok_s, rel=1e-6)
    assert set(a.regions) == {"dublin", "new-york"}  # the links decided it: the short pair of the ring
    # a search file's own rate_mbit wins over the probe's
    (tmp_path / "own.toml").write_text("rate_mbit = 25\n" + SEARCH.format(regions='regions = "links.toml"'))
    assert load_spec(str(tmp_path / "own.toml")).rate_mbit == 25


def test_a_missing_region_file_is_named(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SEARCH.format(regions='regions = "nosuch.toml"'))
    with pytest.raises(ConfigError, match=r"s\.toml: regions: cannot read the region file .*nosuch\.toml"):
        load_spec(str(path))
    (tmp_path / "empty.toml").write_text("rate_mbit = 5\n")
    path.write_text(SEARCH.format(regions='regions = "empty.toml"'))
    with pytest.raises(ConfigError, match=r"regions: the region file .* has no \[regions\] table"):
        load_spec(str(path))


def row(src: str, dst: str, ms: float) -> SimpleNamespace:
    return SimpleNamespace(src=src, dst=dst, latency_ms=ms)


def test_an_unmeasured_pair_is_the_reverse_else_routed_and_marked():
    """A 4-ring measures a->b->c->d->a: b->a is the reverse of a->b; a->c is neither, so a->b->c."""
    names, matrix, fills = fill_matrix([row("a", "b", 1.0), row("b", "c", 2.0), row("c", "d", 3.0),
                                        row("d", "a", 4.0), row("a", "a", 9.0)])
    assert names == ("a", "b", "c", "d")
    assert matrix[0] == (0.0, 1.0, 3.0, 4.0) and fills[0] == ("", "measured", "routed", "reverse")
    assert matrix[1][0] == 1.0 and fills[1][0] == "reverse"
    assert matrix[2][0] == 3.0 and fills[2][0] == "routed"  # c->b->a (2 + 1), shorter than c->d->a (3 + 4)
    assert all(matrix[i][i] == 0.0 for i in range(4))  # a link inside one region leaves the diagonal at 0
    with pytest.raises(ConfigError, match="no measured link connects a to c"):
        fill_matrix([row("a", "b", 1.0), row("c", "d", 1.0)])


def test_the_ladder_reads_ranges_and_lists():
    assert parse_sizes("64..32Mi") == (64, 256, 1024, 4096, 16384, 65536, 262144, 2 ** 20, 2 ** 22, 2 ** 24,
                                       2 ** 25)
    assert parse_sizes("64..100") == (64, 100)
    assert parse_sizes("1Mi, 64,4KiB,64") == (64, 4096, 2 ** 20)


@pytest.mark.parametrize("argv, key", [
    (["nosuch"], "SCENARIO"),
    (["geo-ring", "--sizes", "64..abc"], "--sizes"),
    (["geo-ring", "--sizes", "0"], "--sizes"),
    (["geo-ring", "--sizes", "32Mi..64"], "--sizes"),
    (["geo-ring", "--sizes", "1Ti"], "--sizes"),
    (["geo-ring", "--sizes", ""], "--sizes"),
    (["geo-ring", "--samples", "1"], "--samples"),
    (["geo-ring", "--dilation", "auto"], "--dilation"),
])
def test_bad_input_exits_2_naming_the_option(capsys, argv, key):
    assert cli.main(["probe", *argv, "--shaper", "virtual"]) == 2
    out = capsys.readouterr().out
    assert f"error: {key}:" in out, out


def test_the_report_reads_its_json(tmp_path):
    result = testbed.probe("table2-regional", shaper="virtual", sizes="64", samples=3)
    item = parse(json.loads(result.to_json()), "probe.json")
    assert [r.latency_ms for r in item.result.probe_links] == pytest.approx([7.0] * 3, abs=EXACT_MS)
    assert item.result.probe_links[0].goodput_mbit == 0.0  # one size: no rate to see
    with pytest.raises(ConfigError, match="probe.json: probe_links"):
        parse({**json.loads(result.to_json()), "probe_links": []}, "probe.json")
