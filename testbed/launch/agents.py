"""An agent as the launcher holds it: its process, its control stream, and its last words when it fails."""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

import trio

STDERR_TAIL_LINES = 40
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt|Group)\b.*")  # "trio.BrokenResourceError: ..."


@dataclass
class AgentHandle:
    stage: int
    name: str
    process: trio.Process
    control: trio.lowlevel.FdStream
    stderr_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES))
    finished: bool = False  # it was told to finish (normal end): exiting is expected

    def cause(self, default: str) -> str:
        """default, and the agent's last words: the last exception line of a traceback if there is one."""
        lines = [line.strip(" |+-\t") for line in self.stderr_tail]  # exception groups draw boxes around lines
        lines = [line for line in lines if line]
        errors = [line for line in lines if EXCEPTION_LINE.match(line)]
        last = errors[-1] if errors else (lines[-1] if lines else None)
        return f"{default}; last output: {last}" if last else default
