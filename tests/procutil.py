"""What the process table says about one process: whether it still runs, its parent, its command line (title)."""

from __future__ import annotations


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))


def cmdline(pid: int) -> str:
    """/proc/PID/cmdline with its NULs as spaces: what `ps` and `pgrep -f` match (a forked agent's title)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
