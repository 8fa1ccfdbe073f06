"""A deterministic byte-level training corpus built offline from the Python standard library's own sources."""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import sysconfig
from dataclasses import dataclass

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
VAL_EVERY_NTH_FILE = 10  # one file in ten is held out, so validation is on unseen files
# Tests are repetitive fixtures, encodings/ is mostly code-point tables and pydoc_data/ one huge string:
# none of them looks like the code the models should learn.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"})
FILE_SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class Corpus:
    train: bytes
    val: bytes
    files: tuple[str, ...]  # stdlib-relative posix paths, in corpus order
    sha256: str  # of train + val, identifies the corpus in cache keys
    max_bytes: int

    def description(self) -> dict:
        return {
            "source": "python-stdlib-py",
            "python": sys.version.split()[0],
            "max_bytes": self.max_bytes,
            "n_files": len(self.files),
            "train_bytes": len(self.train),
            "val_bytes": len(self.val),
            "sha256": self.sha256,
        }


def stdlib_sources(root: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The stdlib's .py files, ordered by a hash of their path so every package is spread over the corpus."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if name not in EXCLUDED_DIRS]  # prune: test/ alone is huge
        paths.extend(pathlib.Path(dirpath, name) for name in filenames if name.endswith(".py"))
    # Alphabetical order would fill a capped corpus with a..m only; a path hash mixes topics, yet is stable.
    return sorted(paths, key=lambda p: (hashlib.sha256(p.relative_to(root).as_posix().encode()).hexdigest(), p))


def build_corpus(max_bytes: int = DEFAULT_MAX_BYTES, root: pathlib.Path | None = None) -> Corpus:
    """Concatenate stdlib sources up to max_bytes; every VAL_EVERY_NTH_FILE-th file goes to validation."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    train: list[bytes] = []
    val: list[bytes] = []
    files: list[str] = []
    total = 0
    for path in stdlib_sources(root):
        if total >= max_bytes:
            break
        text = path.read_bytes()[: max_bytes - total] + FILE_SEPARATOR
        (val if len(files) % VAL_EVERY_NTH_FILE == VAL_EVERY_NTH_FILE - 1 else train).append(text)
        files.append(path.relative_to(root).as_posix())
        total += len(text)
    if not train or not val:
        raise ValueError(f"build_corpus: too little text under {root} for a train/val split (max_bytes={max_bytes})")
    train_bytes, val_bytes = b"".join(train), b"".join(val)
    digest = hashlib.sha256(train_bytes + b"\0" + val_bytes).hexdigest()
    return Corpus(train=train_bytes, val=val_bytes, files=tuple(files), sha256=digest, max_bytes=max_bytes)
