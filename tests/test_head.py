"""Co-locate the head with the entry (seed 000, "Placement laws"): a separate head's agent costs one more hop.

placement.head = "separate" appends an agent after the last stage that runs the LM head and the sampler and
sends only the token to the entry: N + 1 hops a lap, the extra hop's latency from the scenario's links.
"""

import numpy as np
import pytest

from agents.process import wire
from testbed.scenario.config import scenario_from_dict
from testbed.scenario.stages import split_layers
from testbed.core.errors import ConfigError
from tests.ringutil import EXACT, HOP_OVERHEAD_BUDGET_MS, LAP_RESIDUAL_BUDGET_MS, rate_tolerance, run

DILATION = 2.0
HOPS_MS = [20.0, 20.0, 20.0]
HEAD_HOPS_MS = [20.0, 20.0, 20.0, 15.0]  # the head sits 20 ms after the last stage and 15 ms before the entry
HEAD_MS = 2.0


def scenario(head: str, **placement):
    hops = HEAD_HOPS_MS if head == "separate" else HOPS_MS
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": 10.0} for i in range(3)],
                               "network": {"hops_ms": hops}, "decode": {"tokens": 14, "temperature": 0.0},
                               "placement": {"head": head, **placement}}, "<test>")


def test_a_separate_head_is_an_agent_after_the_last_stage_with_no_layers():
    sc = scenario("separate", head_ms=HEAD_MS)
    assert [s.name for s in sc.stages] == ["s0", "s1", "s2", "head"] and sc.stages[-1].is_head
    assert sc.stages[-1].compute_ms == HEAD_MS
    assert [(link.src, link.dst) for link in sc.ring] == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert split_layers(6, sc.stages) == [(0, 2), (2, 4), (4, 6), (6, 6)]


@pytest.mark.parametrize("raw, key, words", [
    ({"network": {"hops_ms": HOPS_MS}}, "network.hops_ms", "plus one for the separate head"),
    ({"decode": {"mode": "speculative"}}, "placement.head", "plain decode"),
    ({"placement": {"head": "separate", "head_region": "x"}}, "placement.head_region", "no [regions]"),
    ({"placement": {"head": "cloud"}}, "placement.head", "entry"),
])
def test_bad_head_placements_name_the_key(raw, key, words):
    base = {"stages": [{"name": f"s{i}"} for i in range(3)], "network": {"hops_ms": HEAD_HOPS_MS},
            "placement": {"head": "separate"}}
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({**base, **raw}, "<test>")
    assert info.value.key == key and words in str(info.value)


def test_regions_place_the_head_agent():
    regions = {"names": ["a", "b", "c"], "one_way_ms": [[0, 10, 30], [10, 0, 20], [30, 20, 0]]}
    raw = {"stages": [{"name": "x", "region": "a"}, {"name": "y", "region": "b"}], "regions": regions,
           "placement": {"head": "separate"}}
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(raw, "<test>")
    assert info.value.key == "placement.head_region"
    sc = scenario_from_dict({**raw, "placement": {"head": "separate", "head_region": "c"}}, "<test>")
    assert [link.delay_ms for link in sc.ring] == [10, 20, 30]  # a -> b -> c (the head) -> a


def test_a_token_frame_carries_int32_ids():
    frame = wire.Frame(wire.Kind.TOKEN, lap=3, tensor=np.array([65], np.int32))
    back = wire.decode(wire.encode(frame, wire.WireConfig("int8-block")))  # a codec leaves token ids alone
    assert back.kind == wire.Kind.TOKEN and back.tensor.dtype == np.int32 and back.tensor.tolist() == [65]


def test_a_separate_head_costs_one_more_hop():
    entry, separate = run(scenario("entry"), dilation=DILATION), run(scenario("separate", head_ms=HEAD_MS),
                                                                      dilation=DILATION)
    assert separate.stages == 4 and len(separate.per_hop) == 4
    assert separate.token_ids == entry.token_ids  # the head's agent samples what the entry would have
    for summary, hops in ((entry, 3), (separate, 4)):
        lap_s = 1 / summary.predicted_tok_s
        assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=rate_tolerance(hops, lap_s, DILATION))
    # one more hop (15 ms) and the head's own compute: the lap grows by what the prediction says, within one
    # hop's overhead and the residual
    extra_ms = 1e3 / separate.measured_tok_s - 1e3 / entry.measured_tok_s
    predicted_ms = 1e3 / separate.predicted_tok_s - 1e3 / entry.predicted_tok_s
    assert predicted_ms == pytest.approx(HEAD_HOPS_MS[-1] + HEAD_MS, abs=1.0)  # measured head compute ~ HEAD_MS
    assert extra_ms == pytest.approx(predicted_ms, abs=(HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / DILATION)


def last_scenario(head: str):
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": 10.0} for i in range(3)],
                               "network": {"hops_ms": HOPS_MS, "rate_mbit": 10.0},
                               "decode": {"tokens": 8, "temperature": 0.0, "prompt_tokens": 128},
                               "placement": {"head": head}}, "<test>")


def test_the_head_on_the_last_stage_keeps_n_hops():
    sc = last_scenario("last")
    assert sc.n_stages == 3 and len(sc.ring) == 3
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({"stages": [{"name": "a"}], "placement": {"head": "last"}}, "<test>")
    assert info.value.key == "placement.head"


def test_returning_the_token_id_instead_of_the_hidden_state():
    """At 10 Mbit/s the return hop carries the 128-token prompt's hidden state (65 kB, 52 ms) when the entry holds
    the head, and one token id when the last stage does: TTFT and every lap shrink by that serialization."""
    entry, last = run(last_scenario("entry"), dilation=DILATION), run(last_scenario("last"), dilation=DILATION)
    assert last.token_ids == entry.token_ids
    hidden_hop, id_hop = entry.per_hop[-1].bytes_per_lap, last.per_hop[-1].bytes_per_lap
    assert hidden_hop - id_hop == 128 * 4 - 4  # a decode lap: one 128-float hidden state against one int32 id
    assert entry.ttft.bytes_per_hop > last.ttft.bytes_per_hop
    for summary in (entry, last):  # each TTFT against C + T_ring + its own hops' bytes at 10 Mbit/s
        t = summary.ttft
        tolerance = (3 * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / (t.predicted_s * 1e3 * DILATION)
        assert t.measured_s == pytest.approx(t.predicted_s, rel=tolerance)
    saved = entry.ttft.serialization_s - last.ttft.serialization_s
    # the prompt's hidden state on one hop against one int32 id, byte for byte at 10 Mbit/s (on simulated time this
    # is exact: the 128 x 128 x 4 bytes of the tensor alone, the frame's own bytes aside, is 0.006% off)
    assert saved == pytest.approx((128 * 128 * 4 - 4) * 8 / 10e6, rel=EXACT)
    assert entry.ttft.measured_s - last.ttft.measured_s == pytest.approx(
        saved, abs=(HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / DILATION / 1e3)
