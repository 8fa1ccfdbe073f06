"""Runs every example of README.md and docs/: each `python` block in a fresh interpreter, each `bash` block in bash -e.

A fenced block's info string says what it is: `python` and `bash` (or `sh`, `shell`) run, `toml` is parsed, `text`
is output or a synopsis and is not run. A block that cannot run here (root, real time, minutes, several hosts) has
`<!-- illustrative: why -->` on the line before it; it is counted, not run. A fence without an info string fails.
Blocks run in a temporary directory, with the venv's bin first on PATH (so `python` is this interpreter).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.exact

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
NOT_RUN = {"text", "console", "toml"}
ILLUSTRATIVE = re.compile(r"^<!--\s*illustrative:\s*(?P<why>\S.*?)\s*-->$")
FENCE = re.compile(r"^(?P<fence>```+)(?P<info>[^`]*)$")
EXAMPLE_TIMEOUT_S = 120  # one example; the examples together take ~60 s of CPU (fidelity.md)


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, its text, and why it is not run (None: it runs)."""

    page: Path
    line: int
    lang: str
    text: str
    illustrative: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, in order (indented fences inside lists count too)."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i].strip())
        if not match:
            i += 1
            continue
        fence, lang = match["fence"], match["info"].strip().split(" ")[0]
        indent = len(lines[i]) - len(lines[i].lstrip())
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a fence that never closes")
        previous = lines[i - 1].strip() if i else ""
        marked = ILLUSTRATIVE.match(previous)
        text = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
        found.append(Block(page, i + 1, lang, text, marked["why"] if marked else None))
        i = end + 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]
RUNNABLE = [block for block in ALL if block.lang in RUN and block.illustrative is None]


def test_every_block_says_what_it_is():
    """A fence without a language, or with one the collector does not know, would be skipped silently."""
    unknown = [f"{b.name}: ```{b.lang}" for b in ALL if b.lang not in RUN and b.lang not in NOT_RUN]
    assert not unknown, f"fenced blocks of no known kind (python, bash, toml, text): {unknown}"
    marked_not_run = [b.name for b in ALL if b.illustrative is not None and b.lang not in RUN]
    assert not marked_not_run, f"illustrative marks on blocks that would not run anyway: {marked_not_run}"


def test_examples_are_counted():
    """The README's first Python example is the one runnable line a newcomer copies; the rest are counted."""
    readme = [b for b in ALL if b.page.name == "README.md" and b.lang == "python"]
    assert readme and readme[0].illustrative is None
    assert 'testbed.run("geo-ring", shaper="virtual", tokens=8)' in readme[0].text
    illustrative = [b for b in ALL if b.illustrative is not None]
    print(f"\n{len(RUNNABLE)} examples run, {len(illustrative)} illustrative, "
          f"{sum(b.lang == 'toml' for b in ALL)} toml blocks parsed")
    assert len(RUNNABLE) >= 10


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "toml"], ids=lambda b: b.name)
def test_toml_block_parses(block):
    tomllib.loads(block.text)


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_example_runs(block, tmp_path):
    """Run the block as a user would, from a scratch directory; it must exit 0."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep),
               GEO_RING_METRICS_PORT="0")  # examples run side by side (pytest-xdist): each exporter on a free port
    if RUN[block.lang] == "python":
        command = [sys.executable, "-c", block.text]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (f"{block.name} ({block.lang}) exited {done.returncode}\n--- block\n{block.text}"
                                  f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
