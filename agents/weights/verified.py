"""What a node verified, and the check before a stage loads it: no stage serves a byte that is not verified.

A fetch (agents.weights.fetch) that completes writes RECORD into its directory: the manifest entries (each chunk's
SHA-256) of the files it verified. The launcher holds each stage's record to the origin's own manifest (`expect`: the
phase completed for that stage, against the hashes the origin was built with), and the agent re-hashes every file
of its record just before it loads them (`check`): a file changed on disk after its fetch, or missing, and the stage
refuses to serve.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from agents.weights.manifest import FileEntry, ManifestError, dumps, parse
from testbed.core.errors import TestbedError

RECORD = ".verified.json"  # a name no manifest entry can have (manifest._NAME: no leading dot)


class UnverifiedWeights(TestbedError):
    """Weights that were not verified, or no longer match what was: which directory and file, and why."""


def record(dest: Path, entries: list[FileEntry]) -> None:
    """Add `entries` (verified, under their final names in `dest`) to dest's record."""
    path = dest / RECORD
    try:
        known = _read(dest) if path.is_file() else {}
    except UnverifiedWeights:  # not a record (written by something else): this one starts afresh
        known = {}
    known.update({entry.name: entry for entry in entries})
    partial = path.with_name(RECORD + ".partial")
    partial.write_bytes(dumps(dict(sorted(known.items()))))
    partial.replace(path)  # whole or absent


def _read(directory: Path) -> dict[str, FileEntry]:
    path = directory / RECORD
    try:
        return parse(path.read_bytes())
    except FileNotFoundError:
        raise UnverifiedWeights(f"{directory}: no {RECORD}: its fetch did not complete") from None
    except (OSError, ManifestError) as exc:
        raise UnverifiedWeights(f"{path}: not a record of verified files ({exc})") from exc


def expect(directory: Path, entries: dict[str, FileEntry]) -> dict[str, FileEntry]:
    """Dir's record, which must hold every one of `entries` (the origin's manifest for the files its stage needs)
    with the same size and chunk hashes; its entries."""
    known = _read(directory)
    for name, entry in entries.items():
        if name not in known:
            raise UnverifiedWeights(f"{directory}: {name} was not verified (its fetch did not complete)")
        if known[name] != entry:
            raise UnverifiedWeights(f"{directory}: {name} was verified against other hashes than the origin's "
                                    "manifest")
    return known


def check(directory: Path) -> dict[str, Path]:
    """Re-hash every file of dir's record, chunk by chunk; its files (name -> path) when each matches, else
    UnverifiedWeights naming the first file and chunk that does not."""
    known = _read(directory)
    if not known:
        raise UnverifiedWeights(f"{directory}: its record of verified files is empty")
    for entry in known.values():
        path = directory / entry.name
        try:
            with path.open("rb") as f:
                if f.seek(0, 2) != entry.size:
                    raise UnverifiedWeights(f"{path}: {f.tell():,} bytes, verified as {entry.size:,}")
                f.seek(0)
                for index, digest in enumerate(entry.chunks):
                    start, end = entry.span(index)
                    if hashlib.sha256(f.read(end - start)).hexdigest() != digest:
                        raise UnverifiedWeights(f"{path}: chunk {index} (bytes {start:,}..{end - 1:,}) no longer "
                                                "matches its verified SHA-256")
        except OSError as exc:
            raise UnverifiedWeights(f"{path}: cannot re-check it ({exc})") from exc
    return {name: directory / name for name in known}
