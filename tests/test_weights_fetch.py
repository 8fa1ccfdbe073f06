"""agents.weights: a checkpoint's files from an HTTP origin, every chunk verified, resumable after a kill."""

from __future__ import annotations

import hashlib
import json
import os
from functools import partial

import pytest
import trio

from agents.weights import manifest
from agents.weights.fetch import FetchError, fetch, ranges
from agents.weights.origin import serve_origin

CHUNK = manifest.CHUNK_BYTES


def test_ranges_cut_the_missing_chunks_into_contiguous_runs():
    assert ranges(list(range(8)), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ranges([0, 1, 2, 5, 6, 9], 8) == [[0], [1], [2], [5], [6], [9]]  # streams to spare: every chunk its own
    assert ranges([0, 2, 4, 6, 8], 2) == [[0, 2], [4, 6, 8]]  # more gaps than streams: neighbours share a request
    assert ranges([], 4) == []


def test_a_manifest_off_the_network_is_checked():
    good = {"files": [{"name": "a.bin", "size": 3, "chunk_bytes": 2, "chunks": ["0" * 64, "1" * 64]}]}
    assert manifest.parse(json.dumps(good).encode())["a.bin"].span(1) == (2, 3)
    for bad, what in ((dict(good["files"][0], name="../etc/passwd"), "plain file name"),
                      (dict(good["files"][0], chunks=["0" * 64]), "2 hex SHA-256"),
                      (dict(good["files"][0], size=-1), "size must be")):
        with pytest.raises(manifest.ManifestError, match=what):
            manifest.parse(json.dumps({"files": [bad]}).encode())
    with pytest.raises(manifest.ManifestError, match="not a manifest"):
        manifest.parse(b"\x80\x04pickle")


@pytest.fixture
def origin_root(tmp_path):
    root = tmp_path / "origin"
    root.mkdir()
    (root / "model.safetensors").write_bytes(os.urandom(5 * CHUNK + 12345))
    (root / "config.json").write_text('{"n_layer": 4}')
    return root


async def _with_origin(root, body):
    """body(url) with an origin serving `root`; its error as itself (not in the nursery's group)."""
    out = []
    try:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(partial(serve_origin, root))
            out.append(await body(f"http://{host}:{port}"))
            nursery.cancel_scope.cancel()
    except* FetchError as group:
        raise group.exceptions[0]
    return out[0]


async def test_fetch_verifies_every_chunk_and_refetches_a_corrupted_one(origin_root, tmp_path):
    dest = tmp_path / "node"
    corrupted = []

    def tamper(name, index, data):
        if name == "model.safetensors" and index == 2 and not corrupted:
            corrupted.append(index)
            return b"\0" + data[1:]
        return data

    reports = await _with_origin(origin_root, lambda url: fetch(url, dest, streams=4, tamper=tamper))
    for name in ("model.safetensors", "config.json"):
        assert (dest / name).read_bytes() == (origin_root / name).read_bytes()
        assert not (dest / f"{name}.partial").exists() and not (dest / f"{name}.progress").exists()
    model = next(r for r in reports if r.name == "model.safetensors")
    assert model.refetched_chunks == 1 and model.fetched_chunks == 6
    assert model.fetched_bytes == (origin_root / "model.safetensors").stat().st_size + CHUNK  # chunk 2 twice


async def test_a_corruption_that_persists_is_an_error_and_leaves_no_final_file(origin_root, tmp_path):
    dest = tmp_path / "node"
    with pytest.raises(FetchError, match="chunk 3 failed its SHA-256 check 3 times"):
        await _with_origin(origin_root, lambda url: fetch(
            url, dest, ["model.safetensors"], tamper=lambda n, i, d: d[::-1] if i == 3 else d))
    assert not (dest / "model.safetensors").exists()


async def test_a_killed_transfer_resumes_from_its_verified_chunks(origin_root, tmp_path):
    dest = tmp_path / "node"

    async def killed(url):
        with trio.CancelScope() as scope:
            def kill_after_three(name, index, data):
                kill_after_three.seen += 1
                if kill_after_three.seen == 3:
                    scope.cancel()
                return data
            kill_after_three.seen = 0
            await fetch(url, dest, ["model.safetensors"], streams=1, tamper=kill_after_three)
        return await fetch(url, dest, ["model.safetensors"], streams=2)

    report = (await _with_origin(origin_root, killed))[0]
    data = (origin_root / "model.safetensors").read_bytes()
    assert (dest / "model.safetensors").read_bytes() == data
    assert report.resumed_chunks >= 2 and report.fetched_chunks == 6 - report.resumed_chunks
    assert report.fetched_bytes < len(data)
    assert hashlib.sha256((dest / "model.safetensors").read_bytes()).digest() == hashlib.sha256(data).digest()
