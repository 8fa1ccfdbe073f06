"""A deterministic byte-level training corpus of code, docstrings and prose, built offline from the Python installation and Debian base files."""

from __future__ import annotations

import ast
import hashlib
import os
import pathlib
import sys
import sysconfig
import warnings
from dataclasses import dataclass

# Bytes of each kind of text, chosen so code dominates (the demo prompts are code) while docstrings and prose
# teach English, which both docstrings and comments need. Prose is everything on the list below (~0.9 MB).
CODE_MAX_BYTES = 3_000_000
DOCSTRING_MAX_BYTES = 800_000
DEFAULT_MAX_BYTES = CODE_MAX_BYTES  # kept for callers that ask for the code share alone
VAL_FRACTION = 0.1  # of each kind's bytes, held out as whole documents, so validation is on unseen text
# Tests are repetitive fixtures, encodings/ is mostly code-point tables and pydoc_data/ one huge string:
# none of them looks like the code the models should learn (pydoc_data's text is used as prose instead).
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"})
# Prose is a fixed list, not a directory scan: CI apt-installs packages later, which must not change the corpus.
# Debian's base-files ships these licence texts on every image; older versions of the same licence are left
# out, as they would put near-copies of validation text into training.
COMMON_LICENSES_DIR = pathlib.Path("/usr/share/common-licenses")
COMMON_LICENSES = ("Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.3", "GPL-2", "GPL-3", "LGPL-2.1", "MPL-2.0")
STDLIB_PROSE = (
    "LICENSE.txt",
    "idlelib/CREDITS.txt",
    "idlelib/HISTORY.txt",
    "idlelib/NEWS.txt",
    "idlelib/NEWS2x.txt",
    "idlelib/README.txt",
    "idlelib/TODO.txt",
    "idlelib/extend.txt",
)
DOC_SEPARATOR = b"\n\n"
KINDS = ("code", "docstrings", "prose")
CORPUS_VERSION = 2  # bump when the rules below change what goes into the corpus


@dataclass(frozen=True)
class KindStats:
    kind: str
    n_docs: int
    train_bytes: int
    val_bytes: int


@dataclass(frozen=True)
class Corpus:
    train: bytes
    val: bytes
    val_by_kind: tuple[tuple[str, bytes], ...]  # the validation split of each kind, in KINDS order
    kinds: tuple[KindStats, ...]
    sha256: str  # of train + val: identifies the corpus actually built on this machine

    def description(self) -> dict:
        """What was built, for the metadata and the printout (bytes of each kind)."""
        return {
            "sha256": self.sha256,
            "train_bytes": len(self.train),
            "val_bytes": len(self.val),
            "kinds": {s.kind: {"docs": s.n_docs, "train_bytes": s.train_bytes, "val_bytes": s.val_bytes} for s in self.kinds},
        }


def corpus_recipe() -> dict:
    """The rules the corpus is built by: part of the model recipe hash, computed without reading any file."""
    return {
        "version": CORPUS_VERSION,
        "python": sys.version.split()[0],  # the stdlib is the bulk of the corpus; another Python gives another corpus
        "code_max_bytes": CODE_MAX_BYTES,
        "docstring_max_bytes": DOCSTRING_MAX_BYTES,
        "val_fraction": VAL_FRACTION,
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "common_licenses": list(COMMON_LICENSES),
        "stdlib_prose": list(STDLIB_PROSE),
    }


def stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources(root: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The stdlib's .py files, ordered by a hash of their path so every package is spread over the corpus."""
    root = stdlib_root() if root is None else root
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if name not in EXCLUDED_DIRS]  # prune: test/ alone is huge
        paths.extend(pathlib.Path(dirpath, name) for name in filenames if name.endswith(".py"))
    # Alphabetical order would fill a capped corpus with a..m only; a path hash mixes topics, yet is stable.
    return sorted(paths, key=lambda p: (hashlib.sha256(p.relative_to(root).as_posix().encode()).hexdigest(), p))


def docstrings_of(source: bytes) -> bytes:
    """The module, class and function docstrings of one Python source, cleaned of indentation, in source order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a stdlib file written for another Python version: no docstrings from it
        return b""
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    texts = [doc for node in nodes if (doc := ast.get_docstring(node, clean=True))]
    return "\n\n".join(texts).encode("utf-8", errors="replace")


def _take(docs: list[bytes], max_bytes: int) -> list[bytes]:
    """Whole documents (plus separator) up to max_bytes; the last one is cut to fit."""
    taken: list[bytes] = []
    total = 0
    for doc in docs:
        if total >= max_bytes:
            break
        text = doc[: max_bytes - total] + DOC_SEPARATOR
        taken.append(text)
        total += len(text)
    return taken


def corpus_documents(root: pathlib.Path | None = None) -> dict[str, list[bytes]]:
    """Documents of each kind: stdlib files as code, docstrings of *other* stdlib files, and the prose list."""
    root = stdlib_root() if root is None else root
    sources = stdlib_sources(root)
    code = _take([p.read_bytes() for p in sources[: _files_for(sources, CODE_MAX_BYTES)]], CODE_MAX_BYTES)
    rest = sources[len(code) :]  # docstrings come from files not in the code share: no text is seen twice
    docstrings = _take([d for p in rest if (d := docstrings_of(p.read_bytes()))], DOCSTRING_MAX_BYTES)
    prose = _prose_documents(root)
    return {"code": code, "docstrings": docstrings, "prose": prose}


def _files_for(sources: list[pathlib.Path], max_bytes: int) -> int:
    """How many of sources (in order) it takes to reach max_bytes."""
    total = 0
    for count, path in enumerate(sources, start=1):
        total += path.stat().st_size + len(DOC_SEPARATOR)
        if total >= max_bytes:
            return count
    return len(sources)


def _prose_documents(root: pathlib.Path) -> list[bytes]:
    from pydoc_data.topics import topics  # the Language Reference and library docs, as pydoc's help() shows them

    paths = [COMMON_LICENSES_DIR / name for name in COMMON_LICENSES] + [root / name for name in STDLIB_PROSE]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"corpus: prose sources missing on this machine: {', '.join(missing)}")
    docs = [topics[key].encode("utf-8") + DOC_SEPARATOR for key in sorted(topics)]
    docs += [p.read_bytes() + DOC_SEPARATOR for p in paths]
    # Interleave by a hash of the text, so held-out documents are spread over licences, docs and notes.
    return sorted(docs, key=lambda d: hashlib.sha256(d).hexdigest())


def _split(docs: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """A document goes to validation while validation holds less than VAL_FRACTION of the bytes seen so far."""
    train: list[bytes] = []
    val: list[bytes] = []
    seen = held = 0
    for doc in docs:
        seen += len(doc)
        if held + len(doc) <= VAL_FRACTION * seen * 1.5 and held < VAL_FRACTION * seen:  # 1.5: no one giant file
            val.append(doc)
            held += len(doc)
        else:
            train.append(doc)
    return train, val


def build_corpus(root: pathlib.Path | None = None) -> Corpus:
    """All three kinds; about VAL_FRACTION of each kind's bytes, in whole documents, goes to validation."""
    train: list[bytes] = []
    val_parts: list[tuple[str, bytes]] = []
    stats: list[KindStats] = []
    for kind, docs in corpus_documents(root).items():
        kind_train, kind_val = _split(docs)
        if not kind_train or not kind_val:
            raise ValueError(f"build_corpus: too little {kind} text for a train/val split ({len(docs)} documents)")
        train.extend(kind_train)
        val_parts.append((kind, b"".join(kind_val)))
        stats.append(KindStats(kind, len(docs), sum(map(len, kind_train)), sum(map(len, kind_val))))
    # Training samples windows uniformly over the bytes; interleaving kinds by document keeps any window's
    # neighbourhood mixed, while the mix itself is set by the byte caps above.
    train.sort(key=lambda d: hashlib.sha256(d).hexdigest())
    train_bytes, val_bytes = b"".join(train), b"".join(v for _, v in val_parts)
    digest = hashlib.sha256(train_bytes + b"\0" + val_bytes).hexdigest()
    return Corpus(train=train_bytes, val=val_bytes, val_by_kind=tuple(val_parts), kinds=tuple(stats), sha256=digest)


def warn_if_differs(recorded_sha256: str, corpus: Corpus) -> None:
    if corpus.sha256 != recorded_sha256:
        warnings.warn(
            f"corpus: this machine builds corpus {corpus.sha256[:16]}, the shipped weights were trained on "
            f"{recorded_sha256[:16]} (another Python build or Debian base?); the weights still load",
            stacklevel=2,
        )
