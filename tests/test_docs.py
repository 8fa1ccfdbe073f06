"""The documentation site: `mkdocs build --strict` passes, and every subcommand and public API function has a section."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.exact

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS_TIMEOUT_S = 120  # the build takes ~3 s here


def docs_text() -> str:
    return "\n".join(page.read_text() for page in sorted(DOCS.rglob("*.md")))


def test_mkdocs_build_strict(tmp_path):
    """No broken link or anchor, no docstring the API reference cannot render (mkdocs.yml: validation, strict)."""
    import importlib.util

    assert importlib.util.find_spec("mkdocs"), "the docs extra is not installed: make setup (pip install -e '.[docs]')"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=MKDOCS_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_every_subcommand_has_a_section():
    """A heading that names it (`run`, or `python -m testbed run`) on some page."""
    from testbed.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    headings = [line for line in docs_text().splitlines() if line.startswith("#")]
    missing = [name for name in commands.choices
               if not any(re.search(rf"(`{re.escape(name)}`|testbed {re.escape(name)}\b)", h) for h in headings)]
    assert not missing, f"subcommands without a docs section (a heading that names them): {missing}"


def test_every_public_api_function_has_a_section():
    """An mkdocstrings entry (`::: testbed.api.NAME`, `::: testbed.NAME`) or a heading naming `testbed.NAME`."""
    import testbed

    text = docs_text()
    public = [name for name in testbed.__all__ if callable(getattr(testbed, name))]
    missing = [name for name in public
               if not re.search(rf"^(::: testbed\.(api\.|core\.errors\.)?{name}$|#+ .*`testbed\.{name}`)", text, re.M)]
    assert not missing, f"public API names without a docs section: {missing}"


def test_readme_is_a_front_page():
    """The README stays short: the reference lives in docs/ (issue 55)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
