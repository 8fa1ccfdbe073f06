"""The serve mode's workloads: seeded arrivals and lengths (agents.modes.serve.workload), and the two trace formats."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from agents.modes.serve.requests import RequestSpec
from agents.modes.serve.workload import TraceError, WorkloadSpec, generate, read_trace

DATA = Path(__file__).parent / "data" / "serve"
BOUNDS = {"max_prompt": 4096, "max_output": 4096}


def as_json(requests: list[RequestSpec]) -> str:
    return "\n".join(r.to_json() for r in requests)


def test_the_same_spec_gives_byte_identical_requests_and_another_seed_does_not():
    spec = WorkloadSpec(arrival="gamma", burstiness=0.5, rate=3.0, prompt="lognormal", prompt_tokens=200,
                        prompt_spread=0.5, output="normal", output_tokens=64, output_spread=10, requests=50, seed=7)
    assert as_json(generate(spec, **BOUNDS)) == as_json(generate(spec, **BOUNDS))
    assert as_json(generate(dataclasses.replace(spec, seed=8), **BOUNDS)) != as_json(generate(spec, **BOUNDS))


def test_requests_come_in_arrival_order_indexed_from_zero():
    requests = generate(WorkloadSpec(rate=5.0, requests=200, seed=1), **BOUNDS)
    assert [r.index for r in requests] == list(range(200))
    times = [r.arrival_s for r in requests]
    assert times == sorted(times) and times[0] > 0  # the first arrives after the first gap, as vLLM


def test_constant_arrivals_are_i_over_rate():
    requests = generate(WorkloadSpec(arrival="constant", rate=4.0, requests=5), **BOUNDS)
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_poisson_and_gamma_gaps_have_the_rate_and_the_burstiness():
    """Gaps Gamma(b, 1 / (rate b)): mean 1 / rate, squared coefficient of variation 1 / b (1 for Poisson)."""
    for arrival, burstiness, cv2 in (("poisson", 1.0, 1.0), ("gamma", 0.25, 4.0), ("gamma", 4.0, 0.25)):
        spec = WorkloadSpec(arrival=arrival, burstiness=burstiness, rate=2.0, requests=20000, seed=3)
        gaps = np.diff([0.0] + [r.arrival_s for r in generate(spec, **BOUNDS)])
        assert np.mean(gaps) == pytest.approx(0.5, rel=0.05)
        assert np.var(gaps) / np.mean(gaps) ** 2 == pytest.approx(cv2, rel=0.1)


def test_a_rate_sweep_keeps_the_lengths_and_stretches_the_arrivals():
    """Common random numbers: one seed gives the same lengths at every rate and the same pattern, scaled."""
    slow, fast = (generate(WorkloadSpec(rate=rate, output="uniform", output_spread=20, requests=30, seed=5), **BOUNDS)
                  for rate in (1.0, 4.0))
    assert [r.output_tokens for r in slow] == [r.output_tokens for r in fast]
    assert [r.arrival_s / 4 for r in slow] == pytest.approx([r.arrival_s for r in fast], rel=1e-12)


def test_a_duration_gives_every_arrival_before_it():
    requests = generate(WorkloadSpec(rate=50.0, requests=0, duration_s=20.0, seed=2), **BOUNDS)
    assert requests[-1].arrival_s < 20.0
    assert len(requests) == pytest.approx(1000, rel=0.1)
    constant = generate(WorkloadSpec(arrival="constant", rate=2.0, requests=0, duration_s=3.0), **BOUNDS)
    assert [r.arrival_s for r in constant] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


@pytest.mark.parametrize("kind, spread, sd", [("uniform", 50, 50 / 3 ** 0.5), ("normal", 40, 40),
                                              ("lognormal", 0.5, 300 * (np.exp(0.25) - 1) ** 0.5)])
def test_length_distributions_have_their_mean_and_spread(kind, spread, sd):
    spec = WorkloadSpec(prompt=kind, prompt_tokens=300, prompt_spread=spread, requests=20000, seed=4)
    prompts = np.array([r.prompt_tokens for r in generate(spec, **BOUNDS)])
    assert prompts.dtype.kind == "i" or all(isinstance(p, int) for p in prompts)
    assert prompts.mean() == pytest.approx(300, rel=0.02)
    assert prompts.std() == pytest.approx(sd, rel=0.05)


def test_lengths_are_integers_clipped_to_one_and_the_bound():
    spec = WorkloadSpec(output="normal", output_tokens=20, output_spread=50, requests=2000, seed=9)
    outputs = [r.output_tokens for r in generate(spec, max_prompt=4096, max_output=40)]
    assert all(type(n) is int for n in outputs)
    assert min(outputs) == 1 and max(outputs) == 40
    fixed = generate(WorkloadSpec(prompt_tokens=500, requests=3), max_prompt=256, max_output=64)
    assert [r.prompt_tokens for r in fixed] == [256] * 3 and [r.output_tokens for r in fixed] == [64] * 3


@pytest.mark.parametrize("field, value", [
    ("rate", 0.0), ("rate", -1.0), ("rate", float("inf")), ("burstiness", 0.0), ("arrival", "bursty"),
    ("prompt", "zipf"), ("output", "gaussian"), ("prompt_tokens", 0), ("output_tokens", 2.5), ("prompt_spread", -1),
    ("requests", -1), ("duration_s", -2.0), ("max_concurrency", -1), ("seed", -3), ("trace", "x.jsonl")])
def test_a_bad_field_is_named(field, value):
    with pytest.raises(ValueError, match=f"workload.{field}:"):
        WorkloadSpec(**{field: value})


def test_exactly_one_of_requests_and_duration_unless_a_trace():
    with pytest.raises(ValueError, match="workload.requests: .*exactly one"):
        WorkloadSpec(requests=0, duration_s=0.0)
    with pytest.raises(ValueError, match="exactly one"):
        WorkloadSpec(requests=10, duration_s=5.0)
    with pytest.raises(ValueError, match="workload.trace:"):
        WorkloadSpec(arrival="trace")
    WorkloadSpec(arrival="trace", trace="t.jsonl", requests=0)  # a trace replays every row


def test_json_lines_trace_is_sorted_and_starts_at_zero():
    requests = read_trace(DATA / "trace.jsonl")
    assert [(r.index, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0, 0.0, 128, 64), (1, 0.5, 32, 16), (2, 0.5, 64, 32), (3, 2.25, 8, 1)]  # ties keep the file's order


def test_azure_trace_times_from_the_first_row_with_seven_digit_fractions():
    requests = read_trace(DATA / "azure.csv")
    assert [r.prompt_tokens for r in requests] == [374, 1024, 396, 879, 91]
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 1e-6, 4.314579, 13.3194099, 13.3194101],
                                                            abs=1e-9)
    assert [r.output_tokens for r in requests] == [44, 12, 109, 1, 7]  # 0 generated tokens replays as 1


def test_a_trace_workload_replays_its_file_within_the_bounds():
    spec = WorkloadSpec(arrival="trace", trace=str(DATA / "azure.csv"), requests=0)
    requests = generate(spec, max_prompt=512, max_output=64)
    assert [r.prompt_tokens for r in requests] == [374, 512, 396, 512, 91]
    assert [r.output_tokens for r in requests] == [44, 12, 64, 1, 7]
    assert len(generate(dataclasses.replace(spec, requests=2), **BOUNDS)) == 2
    assert len(generate(dataclasses.replace(spec, duration_s=5.0), **BOUNDS)) == 3


@pytest.mark.parametrize("name, text, line, what", [
    ("bad.jsonl", '{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 4}\n{"arrival_s": 1, "prompt_tokens": 4',
     2, "not a JSON object"),
    ("bad.jsonl", '{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 4}\n\n[1, 2]', 3, "expected a JSON object"),
    ("bad.jsonl", '{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 0}', 1, "output_tokens: expected an integer"),
    ("bad.jsonl", '{"arrival_s": "soon", "prompt_tokens": 4, "output_tokens": 4}', 1, "arrival_s: expected a number"),
    ("bad.jsonl", '{"prompt_tokens": 4, "output_tokens": 4}', 1, "missing arrival_s"),
    ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,12,3\n2023-11-16 25:00:00,1,1\n",
     3, "TIMESTAMP: expected a time"),
    ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-4,3\n", 2,
     "ContextTokens: expected an integer"),
    ("bad.csv", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46,4,3\n", 1,
     "neither JSON lines nor.*missing column.*ContextTokens"),
])
def test_a_malformed_trace_line_names_the_file_and_the_line(tmp_path, name, text, line, what):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=f"{re.escape(str(path))}:{line}: {what}"):
        read_trace(path)


def test_an_empty_or_missing_trace_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(tmp_path / "empty.jsonl")
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "absent.jsonl")
    assert issubclass(TraceError, ValueError)


def test_requests_round_trip_through_json():
    requests = generate(WorkloadSpec(rate=2.0, requests=5, seed=11), **BOUNDS)
    assert [RequestSpec.from_json(json.dumps(r.to_dict())) for r in requests] == requests
