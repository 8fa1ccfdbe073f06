"""Keep KV local (seed 000, "Placement laws"): the cost of shipping each step's new K and V, measured.

With placement.kv = "ship" every stage sends the K and V it just computed to its successor before the hidden
state, on the same link: on a rate-limited ring every hop carries 2 x layers x T x d_model x 4 more bytes per
lap, and the lap (and TTFT) grows by their serialization, as predicted from the bytes the stamps counted.
"""

import pytest

from agents.process import wire
from testbed.scenario.config import scenario_from_dict
from testbed.core.errors import ConfigError
from tests.ringutil import HOP_OVERHEAD_BUDGET_MS, LAP_RESIDUAL_BUDGET_MS, run

PROMPT = 64
D_MODEL, LAYERS_PER_STAGE = 128, 2  # the target's 6 layers over 3 stages
DILATION = 2.0


def scenario(kv: str):
    return scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": 10.0} for i in range(3)],
                               "network": {"hops_ms": [5.0, 5.0, 5.0], "rate_mbit": 10.0},
                               "decode": {"tokens": 8, "prompt_tokens": PROMPT}, "placement": {"kv": kv}}, "<test>")


def test_a_bad_kv_placement_names_the_key():
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({"stages": [{"name": "a"}], "placement": {"kv": "migrate"}}, "<test>")
    assert info.value.key == "placement.kv"


def kv_bytes(n_tok: int) -> int:
    return wire.HEADER.size + 2 * LAYERS_PER_STAGE * n_tok * D_MODEL * 4


def test_shipping_kv_costs_its_bytes_at_the_link_rate():
    local, ship = run(scenario("local"), dilation=DILATION), run(scenario("ship"), dilation=DILATION)
    # every hop of the prefill lap carried the prompt's KV on top of its hidden state; every decode lap one token's
    assert ship.ttft.bytes_per_hop - local.ttft.bytes_per_hop == kv_bytes(PROMPT)
    for a, b in zip(ship.per_hop, local.per_hop):
        assert a.bytes_per_lap - b.bytes_per_lap == kv_bytes(1)
    for summary in (local, ship):
        t = summary.ttft
        tolerance = (3 * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS) / (t.predicted_s * 1e3 * DILATION)
        assert t.measured_s == pytest.approx(t.predicted_s, rel=tolerance)
        lap_ms = 1e3 / summary.predicted_tok_s
        assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s,
                                                       rel=(3 * HOP_OVERHEAD_BUDGET_MS + LAP_RESIDUAL_BUDGET_MS)
                                                       / (lap_ms * DILATION))
    # the prompt's KV at 10 Mbit/s over three hops: 3 x 131 kB x 8 / 10 Mbit/s = 315 ms more to the first token
    extra = 3 * kv_bytes(PROMPT) * 8 / 10e6
    assert ship.ttft.measured_s - local.ttft.measured_s == pytest.approx(extra, rel=1e-6)
    assert ship.serialization_s - local.serialization_s == pytest.approx(3 * kv_bytes(1) * 8 / 10e6, rel=1e-6)
