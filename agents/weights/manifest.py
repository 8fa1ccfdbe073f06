"""What an origin holds: each file's size and the SHA-256 of each of its chunks (the last one short).

A manifest is JSON. A node reads it off the network, so `parse` trusts nothing in it: every field is checked and
every file name must be a plain name with no path in it, or a ManifestError says what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 1 << 20  # a chunk: the unit of verification and of resumption
MAX_MANIFEST_BYTES = 16 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}\Z")
_HEX = re.compile(r"[0-9a-f]{64}\Z")


class ManifestError(ValueError):
    """A manifest that is not one: what is wrong, and where."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    chunk_bytes: int
    chunks: tuple[str, ...]  # hex SHA-256 of each chunk, in order

    def span(self, index: int) -> tuple[int, int]:
        """Chunk `index`'s byte range [start, end)."""
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.size)

    def to_dict(self) -> dict:
        return {"name": self.name, "size": self.size, "chunk_bytes": self.chunk_bytes, "chunks": list(self.chunks)}


def chunk_hashes(path: Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, ...]:
    out = []
    with path.open("rb") as f:
        while block := f.read(chunk_bytes):
            out.append(hashlib.sha256(block).hexdigest())
    return tuple(out)


def build(root: Path, names: list[str] | None = None, chunk_bytes: int = CHUNK_BYTES) -> dict[str, FileEntry]:
    """The manifest of `names` under `root` (default: every regular file directly in it)."""
    names = sorted(p.name for p in root.iterdir() if p.is_file()) if names is None else names
    return {name: FileEntry(name, (root / name).stat().st_size, chunk_bytes, chunk_hashes(root / name, chunk_bytes))
            for name in names}


def dumps(entries: dict[str, FileEntry]) -> bytes:
    return json.dumps({"files": [e.to_dict() for e in entries.values()]}).encode()


def _int(item: dict, key: str, where: str, minimum: int) -> int:
    value = item.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ManifestError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def parse(data: bytes) -> dict[str, FileEntry]:
    """The manifest in `data` (JSON off the network), every field checked."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest of {len(data)} bytes is larger than {MAX_MANIFEST_BYTES}")
    try:
        files = json.loads(data)["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"not a manifest: {exc}") from exc
    if not isinstance(files, list):
        raise ManifestError("files must be a list")
    out = {}
    for i, item in enumerate(files):
        where = f"files[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not _NAME.match(item["name"]):
            raise ManifestError(f"{where}: name must be a plain file name")
        size, chunk = _int(item, "size", where, 0), _int(item, "chunk_bytes", where, 1)
        chunks = item.get("chunks")
        expected = -(-size // chunk)
        if not isinstance(chunks, list) or len(chunks) != expected or \
                not all(isinstance(h, str) and _HEX.match(h) for h in chunks):
            raise ManifestError(f"{where}: chunks must be {expected} hex SHA-256 digests")
        if item["name"] in out:
            raise ManifestError(f"{where}: {item['name']} is listed twice")
        out[item["name"]] = FileEntry(item["name"], size, chunk, tuple(chunks))
    return out
