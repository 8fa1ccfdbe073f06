"""A checkpoint's shards as real bytes over the relay's links: each node fetches its stage's file from the origin,
the files together load as the original, and the links shaped the answers (testbed.launch.weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from agents.hf.build import build_checkpoint
from agents.hf.checkpoint import Checkpoint
from agents.weights import manifest
from agents.weights.shards import assemble, shard_by_stage
from testbed import api
from testbed.launch.weights import Route, distribute, predict_node_s

pytestmark = pytest.mark.fidelity


def test_shards_cross_the_relay_and_the_ring_decodes_as_from_the_local_checkpoint(tmp_path):
    src = build_checkpoint(tmp_path / "hf", "llama", layers=3, hidden=64, heads=4, vocab=512)
    local = api.scenario("geo-ring", overrides=[f'model="hf:{src}"'])
    files = shard_by_stage(src, tmp_path / "origin", local.layer_ranges(Checkpoint.open(src).shape.n_layer))
    routes = [Route(30.0, 20.0), Route(10.0, 20.0), Route(25.0, 20.0)]
    done = trio.run(lambda: distribute(routes, files, tmp_path / "origin", tmp_path / "nodes", streams=4))
    for node, names in zip(done.nodes, files):
        for name in names:
            assert (tmp_path / "nodes" / f"node{node.node}" / name).read_bytes() == \
                (tmp_path / "origin" / name).read_bytes()
        # the answers crossed link origin -> node (delay and rate): never faster than the closed form allows
        sizes = [(tmp_path / "origin" / name).stat().st_size for name in names]
        floor = predict_node_s(routes[node.node], sizes, 4, "tuned", False,
                               len(manifest.dumps(manifest.build(tmp_path / "origin"))), manifest.CHUNK_BYTES)
        assert node.seconds > 0.97 * floor, (node.node, node.seconds, floor)
    ring = assemble([tmp_path / "nodes" / f"node{i}" for i in range(3)], tmp_path / "ring")
    fetched = api.run("geo-ring", shaper="virtual", tokens=8, overrides=[f'model="hf:{ring}"'])
    assert fetched.text == api.run("geo-ring", shaper="virtual", tokens=8, overrides=[f'model="hf:{src}"']).text
