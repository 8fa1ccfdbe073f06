"""vLLM's serving figures from request records (agents.modes.serve.slo), checked against hand-computed values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.modes.serve.requests import RequestRecord
from agents.modes.serve.slo import Goodput, ServingMetrics, markdown_table, per_request_lines, serving_metrics


def record(index, arrival, admitted, token_times, prompt=10, aborted=False, finished=None):
    return RequestRecord(index=index, arrival=arrival, admitted=admitted,
                         first_token=token_times[0] if token_times else None, token_times=tuple(token_times),
                         finished=finished if finished is not None else (token_times[-1] if token_times else None),
                         prompt_tokens=prompt, output_tokens=len(token_times), aborted=aborted)


# Three completed requests and one aborted (times in s):
#   0: arrives 0.0, admitted 0.0, tokens at 0.3, 0.5, 0.7, 0.9  -> TTFT 300, TPOT 200, E2EL 900, ITL 200 x 3
#   1: arrives 1.0, admitted 1.5, tokens at 2.0, 2.1            -> TTFT 1000, TPOT 100, E2EL 1100, queue 500
#   2: arrives 2.0, admitted 2.0, one token at 2.4              -> TTFT 400, no TPOT, E2EL 400
#   3: arrives 2.5, aborted at 3.5 after one token at 3.0        -> in no latency; the run ends at 3.5
RECORDS = [record(0, 0.0, 0.0, [0.3, 0.5, 0.7, 0.9], prompt=100), record(1, 1.0, 1.5, [2.0, 2.1], prompt=20),
           record(2, 2.0, 2.0, [2.4], prompt=7), record(3, 2.5, 2.5, [3.0], prompt=50, aborted=True, finished=3.5)]


def test_figures_follow_vllms_definitions():
    m = serving_metrics(RECORDS)
    assert (m.completed, m.aborted, m.total_input_tokens, m.total_output_tokens) == (3, 1, 127, 7)
    assert m.duration_s == pytest.approx(3.5)  # the last finish (the aborted one) - the first arrival
    assert m.request_throughput == pytest.approx(3 / 3.5)
    assert m.output_throughput == pytest.approx(7 / 3.5)
    assert m.total_token_throughput == pytest.approx(134 / 3.5)
    assert m.mean_ttft_ms == pytest.approx((300 + 1000 + 400) / 3)
    assert m.median_ttft_ms == pytest.approx(400)
    assert m.mean_tpot_ms == pytest.approx(150) and m.median_tpot_ms == pytest.approx(150)
    assert m.p99_tpot_ms == pytest.approx(np.percentile([200, 100], 99))
    assert m.mean_itl_ms == pytest.approx((200 * 3 + 100) / 4)
    assert m.p90_itl_ms == pytest.approx(np.percentile([200, 200, 200, 100], 90))
    assert m.mean_e2el_ms == pytest.approx((900 + 1100 + 400) / 3)
    assert m.std_e2el_ms == pytest.approx(np.std([900, 1100, 400]))
    assert m.mean_queue_ms == pytest.approx(500 / 3) and m.median_queue_ms == pytest.approx(0)
    assert m.p99_ttft_ms == pytest.approx(np.percentile([300, 1000, 400], 99))
    assert m.request_goodput is None and m.slo_attainment_pct is None


def test_goodput_counts_requests_meeting_every_target():
    m = serving_metrics(RECORDS, Goodput.parse("ttft:500 tpot:250"))
    # 0 meets both; 1 misses TTFT; 2 has one token (its TPOT meets); 3 was aborted (never good)
    assert m.request_goodput == pytest.approx(2 / 3.5)
    assert m.slo_attainment_pct == pytest.approx(50.0)
    assert serving_metrics(RECORDS, Goodput.parse("e2el:1000")).slo_attainment_pct == pytest.approx(50.0)
    assert serving_metrics(RECORDS, Goodput.parse("tpot:150")).slo_attainment_pct == pytest.approx(50.0)


def test_good_is_at_or_under_the_target():
    alone = RECORDS[0]  # TTFT 300, TPOT 200, E2EL 900
    assert Goodput(ttft_ms=300.0, tpot_ms=200.0, e2el_ms=900.0).good(alone)
    assert not Goodput(e2el_ms=899.9).good(alone)
    assert Goodput(tpot_ms=0.0).good(RECORDS[2])  # one token: no TPOT to miss
    assert not Goodput(ttft_ms=1e9).good(RECORDS[3])


@pytest.mark.parametrize("text, expected", [
    ("ttft:300 tpot:50 e2el:2000", Goodput(300.0, 50.0, 2000.0)), ("tpot:12.5", Goodput(tpot_ms=12.5)),
    ("  e2el:0   ttft:1e3 ", Goodput(ttft_ms=1000.0, e2el_ms=0.0)), (["ttft:300", "tpot:50"], Goodput(300.0, 50.0))])
def test_goodput_parses_vllms_form(text, expected):
    assert Goodput.parse(text) == expected
    assert Goodput.parse(str(expected)) == expected


@pytest.mark.parametrize("text, blamed", [
    ("", "at least one"), ("itl:30", "'itl:30'"), ("ttft:-1", "'ttft:-1'"), ("ttft:", "'ttft:'"), ("ttft", "'ttft'"),
    ("tpot:fast", "'tpot:fast'"), ("ttft:nan", "'ttft:nan'"), ("ttft:1 ttft:2", "given twice")])
def test_a_bad_goodput_names_the_bad_part(text, blamed):
    with pytest.raises(ValueError, match=blamed):
        Goodput.parse(text)


def test_no_records_is_a_clear_error():
    with pytest.raises(ValueError, match="no request records"):
        serving_metrics([])


def test_only_aborted_requests_give_zero_latencies():
    m = serving_metrics([RECORDS[3]])
    assert (m.completed, m.aborted, m.mean_ttft_ms, m.request_throughput) == (0, 1, 0.0, 0.0)


def test_metrics_round_trip_and_render():
    m = serving_metrics(RECORDS, Goodput.parse("ttft:500"))
    assert ServingMetrics.from_json(m.to_json()) == m
    table = markdown_table(m)
    assert table.startswith("| Metric | Value |\n|---|---:|\n")
    assert "| Successful requests | 3 |" in table and "| Request goodput (req/s) | 0.57 |" in table
    assert "| Median TTFT (ms) | 400.00 |" in table and "| P99 ITL (ms) |" in table
    assert "goodput" not in markdown_table(serving_metrics(RECORDS))


def test_per_request_lines_carry_each_records_own_figures():
    lines = per_request_lines(RECORDS).splitlines()
    assert len(lines) == 4
    rows = [json.loads(line) for line in lines]
    assert rows[0]["ttft_ms"] == pytest.approx(300) and rows[0]["tpot_ms"] == pytest.approx(200)
    assert rows[1]["queue_ms"] == pytest.approx(500) and rows[1]["e2el_ms"] == pytest.approx(1100)
    assert rows[2]["tpot_ms"] is None and rows[3]["aborted"] is True
    figures = ("ttft_ms", "tpot_ms", "e2el_ms", "queue_ms")
    assert [RequestRecord.from_dict({k: v for k, v in row.items() if k not in figures}) for row in rows] == RECORDS


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5), st.floats(0.01, 2),
                          st.lists(st.floats(0.001, 1), min_size=0, max_size=20)), min_size=1, max_size=12))
def test_every_decode_gap_is_one_itl_and_tpot_is_their_mean(requests):
    records = []
    for i, (arrival, wait, prefill, gaps) in enumerate(requests):
        first = arrival + wait + prefill
        records.append(record(i, arrival, arrival + wait, list(first + np.concatenate([[0.0], np.cumsum(gaps)]))))
    m = serving_metrics(records)
    gaps = [g for *_, request_gaps in requests for g in request_gaps]
    assert m.mean_itl_ms == pytest.approx(np.mean(gaps) * 1e3 if gaps else 0.0, rel=1e-6, abs=1e-9)
    tpots = [np.mean(g) * 1e3 for *_, g in requests if g]
    assert m.mean_tpot_ms == pytest.approx(np.mean(tpots) if tpots else 0.0, rel=1e-6, abs=1e-9)
    assert m.duration_s == pytest.approx(max(r.finished for r in records) - min(r.arrival for r in records))
