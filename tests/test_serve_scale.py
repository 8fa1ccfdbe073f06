"""The serve mode at scale (issue 54): what makes a long trace fast on virtual time must not change what it measures.

The entry samples every returned request in a few batched calls (ServeMode.sample_rows); its tokens are those
StreamsMode.sample draws one request at a time, bit for bit, and each request's generator ends where it would. A
sampled serve run gives the same records either way. A run on simulated time ends with one line: the tokens it
generated over the box's wall seconds (testbed.launch.summarize.simulated_rate), figured from the run itself.
"""

from __future__ import annotations

import re

import pytest
import torch
import trio

from agents.modes.serve.facts import ServeLap
from agents.modes.serve.runner import Request, ServeMode
from agents.modes.serve.requests import RequestSpec
from agents.modes.streams.runner import StreamsMode
from testbed.launch.runlog import RunLog
from testbed.scenario.config import scenario_from_dict
from tests.ringutil import run
from tests.test_serve_mode import serve_scenario

RATE_LINE = re.compile(r"virtual time: (\d+) tokens in ([\d.]+) s wall \(([\d.]+) s simulated\): (\d+) simulated "
                       r"tokens per wall second")


class Sampler:
    """What ServeMode.sample_rows and StreamsMode.sample read of a mode: its config's temperature."""

    def __init__(self, temperature: float) -> None:
        self.config = type("Config", (), {"temperature": temperature})()


def requests(n: int, seed: int) -> list[Request]:
    return [Request(RequestSpec(i, 0.0, 1, 1), [1], 0.0, torch.Generator().manual_seed(seed + i)) for i in range(n)]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_the_batched_sampler_draws_what_the_streams_sampler_draws(temperature, n):
    torch.manual_seed(n)
    logits = torch.randn(n, 256) * 4
    mode = Sampler(temperature)
    one_by_one, batched = requests(n, 11), requests(n, 11)
    expected = [StreamsMode.sample(mode, r, row) for r, row in zip(one_by_one, logits)]
    assert ServeMode.sample_rows(mode, logits, batched) == expected
    for a, b in zip(one_by_one, batched):  # each generator where the one-by-one draws left it
        assert torch.equal(torch.rand(4, generator=a.generator), torch.rand(4, generator=b.generator))


def test_a_sampled_run_is_the_run_the_one_by_one_sampler_makes(monkeypatch):
    scenario = scenario_from_dict({"stages": [{"name": f"s{i}", "compute_ms": 10.0} for i in range(3)],
                                   "network": {"hops_ms": [5.0, 5.0, 5.0]},
                                   "decode": {"mode": "serve", "streams": 3, "temperature": 0.8},
                                   "workload": {"arrival": "poisson", "rate": 30.0, "requests": 6, "prompt_tokens": 10,
                                                "output_tokens": 6, "seed": 5}}, "<test>")

    def records() -> list[str]:
        log = RunLog(scenario)
        run(scenario, runlog=log)
        ended = [r for lap in log.laps if isinstance(lap.facts, ServeLap) for r in lap.facts.ended]
        return [r.to_json() for r in sorted(ended, key=lambda r: r.index)]

    batched = records()
    monkeypatch.setattr(ServeMode, "sample_rows",
                        lambda self, logits, reqs: [self.sample(r, row) for r, row in zip(reqs, logits)])
    assert records() == batched


def test_a_virtual_run_ends_with_its_simulated_tokens_per_wall_second():
    from testbed.launch.launcher import run_scenario

    lines: list[str] = []
    scenario = serve_scenario(streams=2, arrival="poisson", rate=20.0, requests=4, prompt_tokens=8, output_tokens=5)
    log = RunLog(scenario)
    summary = trio.run(lambda: run_scenario(scenario, "virtual", runlog=log, log=lines.append))
    found = [m for line in lines if (m := RATE_LINE.fullmatch(line))]
    assert len(found) == 1, lines
    tokens, wall_s, simulated_s, rate = found[0].groups()
    assert int(tokens) == summary.generated_tokens == summary.serve.measured.total_output_tokens == 20
    # the simulated seconds the laps spanned: the first one's start to the last one's end (streams in flight overlap,
    # so not the sum of their laps, summary.wall_s)
    span = max(lap.end for lap in log.laps) - min(lap.start for lap in log.laps)
    assert float(simulated_s) == pytest.approx(span, abs=0.005) and span < summary.wall_s
    assert float(wall_s) > 0
    # the rate is the tokens over the wall the line names (the wall rounded to 10 ms as printed, the rate to 1)
    wall = float(wall_s)
    assert int(tokens) / (wall + 0.005) - 1 <= int(rate) <= int(tokens) / max(wall - 0.005, 1e-9) + 1


def test_greedy_requests_in_a_wide_convoy_decode_their_solo_tokens():
    """Twenty requests on a cap of 12 (prompts of 8-40 tokens, outputs of 4-10, slots reused): the convoy's decode
    attends over the stages' cache arenas (agents.zoo.model.CacheArena), and every request's tokens are the target's
    greedy continuation of its prompt alone."""
    from agents.zoo.prompts import synthetic
    from tests.test_serve_mode import served
    from tests.test_streams import greedy_reference

    _, records, _ = served(serve_scenario(streams=12, arrival="poisson", rate=400.0, requests=20, prompt="uniform",
                                          prompt_tokens=24, prompt_spread=16, output="uniform", output_tokens=7,
                                          output_spread=3, seed=4))
    assert len(records) == 20 and max(r.prompt_tokens for r in records) > min(r.prompt_tokens for r in records)
    for r in records:
        assert list(r.ids) == greedy_reference(synthetic(r.prompt_tokens, r.index), r.output_tokens), r.index
