"""[weights] as a run's first phase: checked where the scenario is built, and on the virtual backend each stage's time
to ready is the weights study's prediction for the same shards, links and transport (testbed.launch.weights)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from testbed import cli
from testbed.core.errors import ConfigError
from testbed.launch.collector import RunCollector
from testbed.launch.runlog import RunLog
from testbed.launch.weights import WeightsPhase, modelled_phase, weights_metrics
from testbed.scenario.config import scenario_from_dict
from testbed.studies.weights import inputs, predict
from testbed.studies.weights.simulate import Strategy
from tests.ringutil import EXACT, run

pytestmark = pytest.mark.exact

REGIONS = {"names": ["virginia", "ireland", "tokyo"],
           "one_way_ms": [[0.0, 40.3, 72.7], [40.5, 0.0, 106.2], [72.9, 106.0, 0.0]]}  # asymmetric on purpose


def raw_scenario(weights: dict | None = None, **extra) -> dict:
    raw = {"name": "weights-ring", "model": "target-deep", "regions": REGIONS,
           "stages": [{"name": name, "region": name, "compute_ms": 4.0} for name in ("virginia", "ireland", "tokyo")],
           "decode": {"tokens": 3}, **extra}
    return raw | ({"weights": weights} if weights is not None else {})


@pytest.mark.parametrize("transport", ["tuned", "kernel"])
@pytest.mark.parametrize("strategy,streams", [("one", 1), ("parallel", 8), ("parallel", 3)])
def test_the_modelled_ready_time_is_the_weights_studys_prediction(transport, strategy, streams):
    weights = {"origin": "ireland", "strategy": strategy, "origin_up_mbit": 800.0, "down_mbit": 300.0}
    weights |= {"streams": streams} if strategy == "parallel" else {}
    scenario = scenario_from_dict(raw_scenario(weights, geometry={"preset": "llama-3.1-8b"},
                                               network={"transport": transport}))
    phase = modelled_phase(scenario, "virtual")
    # the study's own inputs and closed form, given the same origin, rates, delays and transport
    links = inputs.Links("ireland", 800.0 * inputs.MBIT, 300.0 * inputs.MBIT, 300.0 * inputs.MBIT, 0.5e-3)
    net = inputs.network(scenario, ["virginia", "ireland", "tokyo"], links, transport)
    expected = predict.predict(net, Strategy(strategy, streams), 64 * 2**20)
    assert phase.shard_bytes == tuple(nd.shard_bytes for nd in net.nodes)
    assert phase.ready_s == pytest.approx(expected.node_s, rel=1e-12)
    assert phase.ring_ready_s == pytest.approx(expected.ring_s, rel=1e-12)
    assert phase.predicted_s == phase.ready_s and phase.how == "modelled"
    if transport == "kernel" and streams == 1:  # one cold stream per node: far from the link's rate on this path
        assert phase.ready_s[2] > 1.5 * phase.shard_bytes[2] / (300.0 * inputs.MBIT)


def test_a_virtual_run_loads_its_weights_first_and_reports_them():
    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}))
    log = RunLog(scenario)
    summary = run(scenario, runlog=log)
    phase = WeightsPhase.from_dict(summary.extra["weights"])
    assert phase == log.weights and phase.backend == "virtual" and phase.streams == 8
    assert phase.shard_bytes[0] > phase.shard_bytes[1] > 0  # the entry's embeddings and head: the byte model's cut
    assert phase.ready_s == tuple(modelled_phase(scenario, "virtual").ready_s)
    assert abs(summary.error_pct) < EXACT * 100  # the decode that follows is the wall's, to the exact tier's 1e-6
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: [log]))
    for name, ready, predicted in zip(phase.stages, phase.ready_s, phase.predicted_s):
        labels = {"stage": name}
        assert registry.get_sample_value("testbed_weights_ready_seconds", labels | {"kind": "modelled"}) == ready
        assert registry.get_sample_value("testbed_weights_ready_seconds", labels | {"kind": "predicted"}) == predicted
    assert list(weights_metrics(None)) == []


@pytest.mark.parametrize("weights,key,why", [
    ({}, "weights.origin", "required"),
    ({"origin": "mars"}, "weights.origin", "unknown region 'mars'"),
    ({"origin": "virginia", "strategy": "swarm"}, "weights.strategy", "expected one of one, parallel"),
    ({"origin": "virginia", "strategy": "one", "streams": 4}, "weights.streams", "one stream per node"),
    ({"origin": "virginia", "streams": 0}, "weights.streams", "expected an integer in [1, 64]"),
    ({"origin": "virginia", "down_mbit": -5}, "weights.down_mbit", "expected a number"),
    ({"origin": "virginia", "chunk": 4}, "weights.chunk", "unknown key"),
    ("virginia", "weights", "expected a table"),
])
def test_bad_weights_input_is_refused_naming_the_key(weights, key, why):
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict(raw_scenario(weights), "w.toml")
    assert caught.value.key == key and why in str(caught.value)


def test_the_origins_delays_need_the_stages_regions():
    raw = {"stages": [{"name": "a"}, {"name": "b"}], "network": {"hops_ms": [5.0, 5.0]}, "weights": {"origin": "a"}}
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict(raw)
    assert caught.value.key == "weights.origin" and "[regions]" in str(caught.value)


def test_the_cli_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "w.toml"
    path.write_text('[[stages]]\nname = "a"\n[[stages]]\nname = "b"\n[weights]\norigin = "nowhere"\n')
    assert cli.main(["run", str(path), "--shaper", "virtual", "--no-dashboard"]) == 2
    out = capsys.readouterr().out
    assert "weights.origin" in out and "[regions]" in out


# --- serving from the verified shards: what the relay's and netem's agents load (the real bytes: test_weights_relay)


def fetched_as_the_phase_leaves_it(scenario, root):
    """What measured_phase leaves without its links: the model cut by stage into root/origin, each node's files
    copied into root/nodes/node<i> with its record of what it verified, as a completed fetch writes it."""
    import shutil

    from agents.weights import manifest, verified
    from testbed.launch.weights import cut_checkpoint
    from testbed.launch.weights_dirs import Fetched

    files = cut_checkpoint(scenario, root / "origin")
    entries = manifest.build(root / "origin")
    fetched = Fetched(root, files, entries)
    for i, names in enumerate(files):
        fetched.node(i).mkdir(parents=True)
        for name in names:
            shutil.copyfile(root / "origin" / name, fetched.node(i) / name)
        verified.record(fetched.node(i), [entries[name] for name in names])
    return fetched


@pytest.mark.parametrize("head", ["entry", "last"])
def test_each_stage_loads_exactly_its_own_tensors_from_its_verified_shard(tmp_path, head):
    import torch

    from agents.process.shared import shared_model
    from agents.weights.stages import byte_prefixes
    from agents.zoo.train import load_model
    from testbed.launch.weights import stage_extras
    from testbed.launch.weights_dirs import stage_dirs

    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}, placement={"head": head}))
    dirs = stage_dirs(scenario, fetched_as_the_phase_leaves_it(scenario, tmp_path))
    assert len(set(dirs)) == 3 and all(dirs)  # a byte model: each stage its own node's shard
    whole = load_model("target-deep").state_dict()
    extras = stage_extras(scenario)
    assert extras == [True, False, head == "last"]  # as the launcher's specs ask shared_model
    for (first, last), extra, directory in zip(scenario.layer_ranges(16), extras, dirs):
        prefixes = byte_prefixes(first, last, extra)
        state = shared_model("target-deep", (first, last, extra), directory).state_dict()
        own = {key: value for key, value in state.items() if key.startswith(prefixes)}
        assert own.keys() == {key for key in whole if key.startswith(prefixes)} and len(own) >= 6 * (last - first)
        for key, value in own.items():
            assert torch.equal(value, whole[key]), key


def test_a_strict_stage_refuses_a_shard_that_is_not_its_own(tmp_path):
    from agents.process.shared import shared_model
    from agents.weights.verified import UnverifiedWeights
    from testbed.launch.weights_dirs import stage_dirs

    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}))
    dirs = stage_dirs(scenario, fetched_as_the_phase_leaves_it(scenario, tmp_path))
    first, last = scenario.layer_ranges(16)[0]
    with pytest.raises(UnverifiedWeights, match="missing .*transformer.h.0"):
        shared_model("target-deep", (first, last, True), dirs[1])  # the entry's layers from stage 1's shard


def test_stages_whose_fetch_did_not_complete_or_verified_other_hashes_fail_the_run_before_it_serves(tmp_path):
    from agents.weights import verified
    from testbed.launch.weights_dirs import stage_dirs

    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}))
    fetched = fetched_as_the_phase_leaves_it(scenario, tmp_path)
    (fetched.node(1) / verified.RECORD).unlink()  # its fetch was killed: no record
    with pytest.raises(verified.UnverifiedWeights, match="stage ireland .*did not complete"):
        stage_dirs(scenario, fetched)
    name = fetched.files[2][0]
    other = fetched.origin[name]
    verified.record(fetched.node(1), [fetched.origin[fetched.files[1][0]]])
    verified.record(fetched.node(2), [dataclasses.replace(other, chunks=("0" * 64,) * len(other.chunks))])
    with pytest.raises(verified.UnverifiedWeights, match="stage tokyo .*other hashes than the origin's manifest"):
        stage_dirs(scenario, fetched)


def test_a_shard_changed_after_its_verification_makes_the_stage_refuse_to_serve(tmp_path):
    """The agent hashes its files again before it loads them: a byte changed on disk since its fetch verified it
    and the stage reports the error instead of listening; the run fails naming the stage, file and chunk."""
    from testbed.core.errors import AgentFailed
    from testbed.launch.launcher import Launcher, prepare
    from testbed.launch.weights_dirs import stage_dirs

    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}))
    fetched = fetched_as_the_phase_leaves_it(scenario, tmp_path)
    dirs = stage_dirs(scenario, fetched)
    shard = fetched.node(1) / fetched.files[1][0]
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40  # one bit of a weight, after its verification
    shard.write_bytes(bytes(data))

    class FromShards(Launcher):  # the virtual backend keeps the model's own weights: here it is handed the shards
        def agent_specs(self, n_layers):
            return [dataclasses.replace(s, weights=dirs[s.stage]) for s in super().agent_specs(n_layers)]

    async def main():
        shaper, _ = await prepare(scenario, "virtual", log=lambda message: None)
        await FromShards(scenario, shaper, RunLog(scenario), log=lambda message: None).run()

    import trio

    from testbed.core.errors import leaf_errors

    with pytest.raises(BaseException) as caught:
        trio.run(main)
    failures = [str(e) for e in leaf_errors(caught.value) if isinstance(e, AgentFailed)]
    assert len(failures) == 1 and "agent 1 (ireland) failed: UnverifiedWeights" in failures[0]
    assert f"{shard}: chunk 0" in failures[0] and "no longer matches its verified SHA-256" in failures[0]


def test_a_null_model_fetches_its_models_bytes_and_loads_none(tmp_path):
    from agents.process.shared import shared_model
    from agents.zoo.null import NullModel
    from testbed.launch.weights_dirs import stage_dirs

    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}, model="null:target-deep"))
    fetched = fetched_as_the_phase_leaves_it(scenario, tmp_path)
    assert fetched.origin[fetched.files[0][0]].size > 400_000  # target-deep's entry: its bytes cross the links
    assert stage_dirs(scenario, fetched) == ("", "", "")
    assert isinstance(shared_model("null:target-deep", (0, 6, True), str(fetched.node(0))), NullModel)


def test_a_checkpoints_stages_load_their_share_from_the_assembled_verified_files(tmp_path):
    import torch

    from agents.hf.build import build_checkpoint
    from agents.hf.model import load_hf
    from agents.process.shared import shared_model
    from agents.weights import verified
    from testbed.launch.weights_dirs import stage_dirs

    src = build_checkpoint(tmp_path / "hf", "llama", layers=3, hidden=32, heads=4, vocab=512)
    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}, model=f"hf:{src}"))
    dirs = stage_dirs(scenario, fetched_as_the_phase_leaves_it(scenario, tmp_path / "w"))
    shared = {"config.json", "tokenizer.json", "model.safetensors.index.json"}
    assert len(set(dirs)) == 1
    assert shared | {f"stage{i}.safetensors" for i in range(3)} <= set(verified.check(Path(dirs[0])))
    original, x = load_hf(f"hf:{src}").load(0, 3, True), torch.randn(1, 2, 32)
    for stage, (first, last) in enumerate(scenario.layer_ranges(3)):
        model = shared_model(f"hf:{src}", (first, last, stage == 0), dirs[stage])
        assert model.name == f"hf:{src}" and set(model.layers) >= set(range(first, last))
        assert torch.equal(model.run_layers(x, first, last), original.run_layers(x, first, last))
    entry, ids = shared_model(f"hf:{src}", (*scenario.layer_ranges(3)[0], True), dirs[0]), torch.tensor([[1, 2, 3]])
    assert torch.equal(entry.head(entry.embed(ids, 0)), original.head(original.embed(ids, 0)))


@pytest.mark.parametrize("ends", ["unverified", "interrupted"])
def test_the_fetched_files_last_the_run_and_go_on_every_exit_path(tmp_path, monkeypatch, ends):
    """first_phase on real bytes (its links faked here): the files are there while the run uses them, and gone
    after a stage fails its check before serving, or after a Ctrl-C in the run."""
    import types

    import trio

    from agents.weights import verified
    from testbed.launch import weights

    scenario = scenario_from_dict(raw_scenario({"origin": "virginia"}))
    seen = []

    async def fetched_over_fake_links(scenario, shaper_kind, dilation, log, scratch):
        seen.append(scratch)
        fetched = fetched_as_the_phase_leaves_it(scenario, scratch)
        if ends == "unverified":
            (fetched.node(2) / verified.RECORD).unlink()
        return modelled_phase(scenario, shaper_kind), fetched

    monkeypatch.setattr(weights, "measured_phase", fetched_over_fake_links)

    async def main():
        async with weights.first_phase(scenario, types.SimpleNamespace(name="userspace", in_process=False), 1.0,
                                       lambda line: None) as (_, dirs):
            assert [Path(d).parent for d in dirs] == [seen[0] / "nodes"] * 3 and all(map(Path.is_dir, map(Path, dirs)))
            raise KeyboardInterrupt

    with pytest.raises(verified.UnverifiedWeights if ends == "unverified" else KeyboardInterrupt):
        trio.run(main)
    assert seen and seen[0].name.startswith("geo-ring-weights-") and not seen[0].exists()
