"""Auto dilation's run-time budget covers the whole run: the prompt's prefill (its bytes on every hop, its compute)
as well as the decode laps (issue 55: a 1,024-token 700B-class prompt at 10 Mbit/s once chose D = 8)."""

from __future__ import annotations

import math

import pytest
import trio

from testbed.core import physics
from testbed.launch import dilation
from testbed.launch.dilation import BUDGET_S, Calibration, choose, forecast, resolve
from testbed.launch.launcher import run_scenario
from testbed.scenario.config import load_scenario

pytestmark = pytest.mark.exact

RATE_BYTES_S = 10e6 / 8  # 10 Mbit/s
PROMPT = 1024


def slow_700b(*more: str):
    """Seed 000's 700B-class geometry (32 KiB a position) on table2-regional, a 1,024-token prompt at 10 Mbit/s."""
    return load_scenario("table2-regional", ['geometry.preset="seed-700b"', f"decode.prompt_tokens={PROMPT}",
                                             "network.rate_mbit=10", "decode.tokens=4", *more])


def test_the_forecast_s_prefill_is_eq_5_with_the_prompt_s_bytes_on_every_hop():
    sc = slow_700b()
    prompt_bytes = physics.b_hop(PROMPT, 16384, 2)  # Eq. 1: 32 MiB
    prefill_compute = sum(st.compute_ms + st.prefill_ms_per_token * (PROMPT - 1) for st in sc.stages) / 1e3
    expected = prefill_compute + sc.t_ring_s + 3 * prompt_bytes / RATE_BYTES_S  # Eq. 5: 80.5 s of it is bytes
    run = forecast(sc, sc.emulated_compute_s)
    assert run.prefill_s == pytest.approx(expected, rel=1e-12) and run.prefill_s > 80
    assert run.decode_s == pytest.approx(4 * (sc.emulated_compute_s + sc.t_ring_s), rel=1e-12)


def check_budget_covers_the_prefill(resolve_fn) -> None:
    """What the issue asks of auto: the 81 s prefill alone is over the 40 s budget, so D = 1, without a calibration,
    and the run says why (the predicted run, its prefill and its decode)."""
    sc = slow_700b()

    async def must_not_run(calibration):
        raise AssertionError("calibrated although the prefill alone is over the budget")

    said = []
    chosen = trio.run(lambda: resolve_fn(sc, "auto", compensate=False, run=must_not_run, log=said.append))
    assert chosen.factor == 1.0 and chosen.requested == "auto" and chosen.budget_s == BUDGET_S
    assert "prefill 81 s" in chosen.reason and "over the 40 s budget" in chosen.reason, chosen.reason
    assert said == [f"dilation: D = 1 ({chosen.reason})"]
    # with a measured calibration too, the cap is the budget over the whole predicted run
    calibration = Calibration(base_ms=(1.0,) * 3, overhead_ms=4.0, compute_s=0.033)
    capped = choose(sc, calibration, budget_s=10 * BUDGET_S)
    whole = forecast(sc, 0.033).total_s
    assert capped.cap == max(1, math.floor(10 * BUDGET_S / whole)) == 4, capped.reason
    assert "prefill 81 s" in capped.reason


def test_auto_dilation_counts_the_prompt_s_bytes_against_the_budget():
    check_budget_covers_the_prefill(resolve)


def test_a_chooser_that_forgets_the_prefill_is_caught(monkeypatch):
    """The planted regression: the decode laps alone (0.2 s) would leave auto D = 64 of the 40 s budget."""
    real = dilation.forecast

    def decode_only(scenario, compute_s):
        return dilation.RunForecast(0.0, real(scenario, compute_s).decode_s, real(scenario, compute_s).laps)

    monkeypatch.setattr(dilation, "forecast", decode_only)
    with pytest.raises(AssertionError):
        check_budget_covers_the_prefill(resolve)


def test_the_forecast_s_prefill_is_what_the_prompt_takes_on_virtual_time():
    """The forecast against a run: the first prompt's TTFT (framing and the real passes aside) at 100 Mbit/s."""
    sc = load_scenario("table2-regional", ['geometry.preset="seed-700b"', "decode.prompt_tokens=512",
                                           "network.rate_mbit=100", "decode.tokens=3"])
    summary = trio.run(lambda: run_scenario(sc, "virtual", log=lambda m: None))
    assert forecast(sc, sc.emulated_compute_s).prefill_s == pytest.approx(summary.ttft.measured_s, rel=1e-4)


def test_d_never_goes_below_one_however_small_the_budget():
    sc = slow_700b()
    assert dilation.budget_cap(sc, 0.033, budget_s=1e-3) == 1.0
    assert choose(sc, Calibration((1.0,) * 3, 50.0, 0.033), budget_s=1e-3).factor == 1.0
