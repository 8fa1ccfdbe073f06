"""The serve mode and the model's context (issue 54): a request never silently becomes a shorter one.

A fixed prompt or output that no request can have within the model's context (256 positions for the shipped byte
models) is an error naming the flag or key and the limit: the serve study exits 2 without a traceback, a run's entry
refuses it before any request is served. Drawn lengths past the context are fitted one by one (the output at most half
the context, the prompt the rest); the run says how many, and every record carries the lengths asked for beside the
tokens computed.
"""

from __future__ import annotations

import pytest
import trio

from agents.modes.serve.requests import RequestRecord
from agents.modes.serve.settings import MAX_TOKENS
from agents.modes.serve.workload import WorkloadSpec, check_fits, fitted, generate
from agents.zoo.prompts import synthetic
from testbed import cli
from testbed.core.errors import ConfigError
from tests.test_serve_mode import serve_scenario, served
from tests.test_streams import greedy_reference

CONTEXT = 256  # the shipped target's block_size


@pytest.mark.parametrize("argv, flag, limit", [
    (["--prompt-tokens", "4000", "--output-tokens", "8"], "--prompt-tokens", "at most 248 prompt tokens"),
    (["--prompt-tokens", "250"], "--prompt-tokens", "at most 224 prompt tokens"),  # geo-ring's output: 32
    (["--output-tokens", "200"], "--output-tokens", "at most half of it, 128 tokens"),
])
def test_the_study_refuses_a_fixed_length_past_the_context_with_exit_2(argv, flag, limit, capsys):
    code = cli.main(["serve", "geo-ring", "--shaper", "virtual", "--rates", "1", "--requests", "4", *argv])
    out = capsys.readouterr()
    assert code == 2
    text = out.out + out.err
    assert f"{flag}: " in text and limit in text and "256 positions" in text and "Traceback" not in text


def test_a_fixed_length_that_fits_exactly_passes():
    check_fits(WorkloadSpec(prompt_tokens=248, output_tokens=8), CONTEXT, "target")
    check_fits(WorkloadSpec(prompt_tokens=128, output_tokens=128), CONTEXT, "target")
    with pytest.raises(ValueError, match="workload.prompt_tokens"):
        check_fits(WorkloadSpec(prompt_tokens=249, output_tokens=8), CONTEXT, "target")
    with pytest.raises(ValueError, match="workload.output_tokens"):
        check_fits(WorkloadSpec(prompt_tokens=8, output_tokens=129), CONTEXT, "target")


def test_a_run_refuses_a_fixed_prompt_past_the_context_naming_the_key(capsys):
    """Where the scenario loads (the mode card's check_context), before any agent starts: `testbed run` exits 2."""
    with pytest.raises(ConfigError) as info:
        serve_scenario(arrival="poisson", rate=50.0, requests=3, prompt_tokens=4000, output_tokens=8)
    assert info.value.key == "workload.prompt_tokens" and "a prompt of 4000 tokens" in str(info.value)
    assert "at most 248" in str(info.value)
    code = cli.main(["run", "geo-ring", "--shaper", "virtual", "--set", 'decode.mode="serve"', "--set",
                     "workload.prompt_tokens=4000", "--set", "workload.requests=2"])
    text = "".join(capsys.readouterr())
    assert code == 2 and "workload.prompt_tokens" in text and "at most 224" in text and "Traceback" not in text


def test_drawn_prompts_past_the_context_are_fitted_said_and_recorded():
    """Lognormal prompts around 300 tokens with 8-token outputs: the ones past 248 compute their first 248 tokens'
    worth of text, greedy as a solo run of that prompt; each record has both lengths; the run says how many."""
    workload = dict(arrival="poisson", rate=50.0, requests=6, prompt="lognormal", prompt_tokens=300,
                    prompt_spread=0.3, output_tokens=8, seed=2)
    asked = generate(WorkloadSpec(**workload), max_prompt=MAX_TOKENS, max_output=MAX_TOKENS)
    over = [s for s in asked if s.prompt_tokens > CONTEXT - 8]
    assert over and len(over) < len(asked)  # the seed draws both kinds
    scenario = serve_scenario(streams=3, **workload)  # greedy (decode.temperature's default, 0)
    _, records, _ = served(scenario)
    assert [r.requested_prompt_tokens for r in records] == [s.prompt_tokens for s in asked]
    assert [r.prompt_tokens for r in records] == [min(s.prompt_tokens, CONTEXT - 8) for s in asked]
    assert all(r.requested_output_tokens == r.output_tokens == 8 for r in records)
    for r in records:
        assert list(r.ids) == greedy_reference(synthetic(r.prompt_tokens, r.index), 8), r.index
    lines: list[str] = []
    from testbed.launch.launcher import run_scenario

    trio.run(lambda: run_scenario(scenario, "virtual", log=lines.append))
    said = [line for line in lines if "do not fit the model's context" in line]
    assert len(said) == 1 and f"{len(over)} of 6 requests" in said[0], lines


def test_fitted_keeps_the_output_within_half_the_context_and_the_prompt_in_the_rest():
    spec = generate(WorkloadSpec(requests=1, prompt_tokens=4000, output_tokens=300), max_prompt=MAX_TOKENS,
                    max_output=MAX_TOKENS)[0]
    assert (fitted(spec, CONTEXT).prompt_tokens, fitted(spec, CONTEXT).output_tokens) == (128, 128)
    short = generate(WorkloadSpec(requests=1, prompt_tokens=40, output_tokens=8), max_prompt=MAX_TOKENS,
                     max_output=MAX_TOKENS)[0]
    assert fitted(short, CONTEXT) == short


def test_an_old_record_without_the_requested_lengths_still_reads():
    record = RequestRecord(0, 0.0, 0.0, 0.1, (0.1,), 0.1, 5, 1, ids=(7,))
    text = record.to_json().replace(', "requested_prompt_tokens": null', "").replace(
        ', "requested_output_tokens": null', "")
    assert "requested" not in text and RequestRecord.from_json(text) == record


def test_a_run_without_a_workload_of_its_own_loads_for_its_endpoint():
    """requests = 0 and no duration: the endpoint's requests only, each checked as it comes (HTTP 400)."""
    from testbed import api

    scenario = api.scenario("geo-ring", overrides=['decode.mode="serve"', "workload.requests=0",
                                                   "workload.prompt_tokens=4000"])
    assert scenario.decode.mode == "serve"
