"""Processes, the same way everywhere: stopping a child (the relay, an agent, the fork server), and moving the
calling thread into a network namespace (a forked agent; the kernel backend's sysctl and ethtool threads)."""

from __future__ import annotations

import ctypes
import os

import trio

CLONE_NEWNET = 0x40000000  # include/uapi/linux/sched.h; os.setns and os.CLONE_NEWNET arrive in Python 3.12

_libc = ctypes.CDLL(None, use_errno=True)


def enter_netns(path: str) -> None:
    """setns(2) the calling thread into the network namespace at `path` (/run/netns/NAME)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


async def stop_process(process: trio.Process, grace_s: float) -> None:
    """Close stdin, then SIGTERM, then SIGKILL: a child is always reaped within ~2 x grace_s."""
    if process.stdin is not None:
        await trio.aclose_forcefully(process.stdin)
    with trio.move_on_after(grace_s / 2):
        await process.wait()
    if process.poll() is None:
        process.terminate()
        with trio.move_on_after(grace_s):
            await process.wait()
    if process.poll() is None:
        process.kill()
        await process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            await trio.aclose_forcefully(pipe)
