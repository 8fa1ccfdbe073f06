"""A checkpoint's shards: cut by stage they load as the original does (exact tier, no network), and as real bytes
over the relay's links every node's files arrive whole and no faster than the links allow (fidelity tier)."""

from __future__ import annotations

import os

import pytest
import trio

from agents.weights import manifest
from testbed import api
from testbed.launch.weights import Route, distribute, predict_node_s


@pytest.mark.exact
def test_a_checkpoint_cut_by_stage_decodes_as_the_original(tmp_path):
    from agents.hf.build import build_checkpoint
    from agents.hf.checkpoint import Checkpoint
    from agents.weights.shards import assemble, shard_by_stage

    src = build_checkpoint(tmp_path / "hf", "llama", layers=3, hidden=64, heads=4, vocab=512)
    local = api.scenario("geo-ring", overrides=[f'model="hf:{src}"'])
    files = shard_by_stage(src, tmp_path / "origin", local.layer_ranges(Checkpoint.open(src).shape.n_layer))
    assert [names[0] for names in files] == ["stage0.safetensors", "stage1.safetensors", "stage2.safetensors"]
    nodes = []
    for i, names in enumerate(files):  # each node holds only its own stage's file and the shared ones
        nodes.append(tmp_path / f"node{i}")
        nodes[-1].mkdir()
        for name in names:
            os.link(tmp_path / "origin" / name, nodes[-1] / name)
    ring = assemble(nodes, tmp_path / "ring")
    fetched = api.run("geo-ring", shaper="virtual", tokens=8, overrides=[f'model="hf:{ring}"'])
    assert fetched.text == api.run("geo-ring", shaper="virtual", tokens=8, overrides=[f'model="hf:{src}"']).text


@pytest.mark.fidelity
def test_shards_cross_the_relay_whole_and_no_faster_than_their_links(tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    files = []
    for i, size in enumerate((3 * 2**20 + 5, 2**20 + 7, 2**20 + 11)):
        (origin / f"stage{i}.safetensors").write_bytes(os.urandom(size))
        files.append([f"stage{i}.safetensors"])
    (origin / "config.json").write_text('{"n_layer": 3}')
    files = [names + ["config.json"] for names in files]
    routes = [Route(30.0, 20.0), Route(10.0, 20.0), Route(25.0, 20.0)]
    done = trio.run(lambda: distribute(routes, files, origin, tmp_path / "nodes", streams=4))
    manifest_bytes = len(manifest.dumps(manifest.build(origin)))
    for node, names in zip(done.nodes, files):
        for name in names:
            assert (tmp_path / "nodes" / f"node{node.node}" / name).read_bytes() == (origin / name).read_bytes()
        # the answers crossed link origin -> node (delay and rate): never faster than the closed form allows
        sizes = [(origin / name).stat().st_size for name in names]
        floor = predict_node_s(routes[node.node], sizes, 4, "tuned", False, manifest_bytes, manifest.CHUNK_BYTES)
        assert node.seconds > 0.97 * floor, (node.node, node.seconds, floor)


@pytest.mark.fidelity
def test_the_ring_serves_from_the_shards_its_nodes_fetched_and_decodes_as_the_local_run():
    """[weights] on the relay: each stage's shard of the byte model crosses its link from the origin, verified, and
    its agent serves from it (agents.weights.stages: exactly its tensors); the greedy text is the local run's (the
    model's own weights on the virtual backend), and the fetched files are gone once the run ends."""
    import re
    from pathlib import Path

    from testbed.launch.launcher import run_scenario
    from testbed.scenario.config import scenario_from_dict
    from tests.ringutil import RUN_TIMEOUT_S, run

    regions = {"names": ["a", "b", "c"], "one_way_ms": [[0.0, 2.0, 3.0], [2.0, 0.0, 2.0], [3.0, 2.0, 0.0]]}
    raw = {"name": "weights-serve", "model": "target", "regions": regions, "decode": {"tokens": 6},
           "stages": [{"name": name, "region": name, "compute_ms": 1.0} for name in "abc"]}
    local = run(scenario_from_dict(raw))
    lines: list[str] = []

    async def served():
        with trio.fail_after(RUN_TIMEOUT_S):
            return await run_scenario(scenario_from_dict(raw | {"weights": {"origin": "b"}}), "userspace",
                                      log=lines.append)

    summary = trio.run(served)
    assert summary.extra["weights"]["how"] == "measured" and len(local.text) > 0
    assert summary.text == local.text, (summary.text, local.text)
    kept = [re.search(r"under (\S+) until the run ends", line) for line in lines]
    scratch = Path(next(m for m in kept if m).group(1))
    assert scratch.name.startswith("geo-ring-weights-") and not scratch.exists()
