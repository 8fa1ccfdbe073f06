"""The nodes' shared notes: torchrun's c10d rendezvous store (a TCPStore), behind a small Trio interface.

torchrun (torch.distributed.run) forms the group: it assigns ranks, hosts the store on the rendezvous
endpoint and supervises the worker process on each host. Every node of a run reads and writes these keys
(under one prefix per run and restart):

    node/<stage>     JSON: the node's rank, host name, address, agent port, clock-server port, scenario digest
    ready/<stage>    its agent dialled its peers and is serving
    alive/<stage>    a counter the node bumps every HEARTBEAT_S (the entry watches it)
    failed           the first failure any node saw, in words (every node stops on it)
    done             the entry's run completed

Values are short strings; nothing is unpickled. Every store call runs in a worker thread, one at a time,
with the store's own timeout bounding it, so a dead store host cannot hang the event loop.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass

import trio

from testbed.core.errors import PeerTimeout, TestbedError

HEARTBEAT_S = 0.25
STORE_CALL_TIMEOUT_S = 5.0
POLL_S = 0.1


class StoreLost(TestbedError):
    """The rendezvous store cannot be reached (its host is gone)."""


@dataclass(frozen=True)
class NodeInfo:
    stage: int
    rank: int
    hostname: str
    address: str
    agent_port: int
    clock_port: int
    digest: str

    def to_json(self) -> str:
        return json.dumps(vars(self))

    @classmethod
    def from_json(cls, text: bytes | str) -> "NodeInfo":
        data = json.loads(text)
        return cls(**{key: data[key] for key in cls.__dataclass_fields__})

    def label(self, name: str = "") -> str:
        """'node 2 (new-york, rank 1, host-c 10.0.0.3)': how errors name a node."""
        named = f"{name}, " if name else ""
        return f"node {self.stage} ({named}rank {self.rank}, {self.hostname} {self.address})"


def torchrun_store():
    """(store, rank, world size) of the torchrun group this process runs in (torch.distributed's env://)."""
    missing = [key for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if key not in os.environ]
    if missing:
        raise TestbedError(f"testbed.hosts.node runs under torchrun (it reads {', '.join(missing)} from the environment): "
                           "torchrun --nnodes=N --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT "
                           "-m testbed.hosts.node SCENARIO")
    import torch.distributed as dist

    store, rank, world = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=60)))
    prefix = f"geo-ring/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store = dist.PrefixStore(prefix, store)
    store.set_timeout(datetime.timedelta(seconds=STORE_CALL_TIMEOUT_S))
    return store, rank, world


class NodeStore:
    """Async access to the store; `store` is anything with set/get/check/add (a TCPStore or a test's dict)."""

    def __init__(self, store) -> None:
        self._store = store
        self._lock = trio.Lock()

    async def _call(self, method: str, *args):
        async with self._lock:
            try:
                return await trio.to_thread.run_sync(getattr(self._store, method), *args, abandon_on_cancel=True)
            except (RuntimeError, OSError) as exc:  # torch raises DistStoreError (a RuntimeError) on a lost store
                raise StoreLost(f"the rendezvous store stopped answering ({method}): {exc}") from exc

    async def set(self, key: str, value: str) -> None:
        await self._call("set", key, value)

    async def get(self, key: str) -> str:
        return (await self._call("get", key)).decode()

    async def has(self, key: str) -> bool:
        return bool(await self._call("check", [key]))

    async def bump(self, key: str) -> int:
        return int(await self._call("add", key, 1))

    async def count(self, key: str) -> int:
        """A counter's value (0 before the first bump)."""
        return int(await self._call("add", key, 0))

    async def wait_for(self, keys: list[str], timeout_s: float, what: str, *, abort_key: str = "failed") -> None:
        """Poll until every key exists; raise naming the missing ones after `timeout_s`, or on `abort_key`."""
        deadline = trio.current_time() + timeout_s
        while True:
            if await self._call("check", keys):
                return
            if await self.has(abort_key):
                raise TestbedError(await self.get(abort_key))
            if trio.current_time() > deadline:
                missing = [key for key in keys if not await self._call("check", [key])]
                raise PeerTimeout(f"{what}: no {', '.join(missing)} in the rendezvous store within {timeout_s:.0f} s")
            await trio.sleep(POLL_S)

    async def fail(self, message: str) -> None:
        """Tell every node the run failed (the first message wins); never raises."""
        try:
            with trio.move_on_after(STORE_CALL_TIMEOUT_S):
                if await self._call("add", "failed-count", 1) == 1:
                    await self.set("failed", message)
        except StoreLost:
            pass


class Heartbeats:
    """The entry's view of every node's heartbeat counter: which have stopped moving, and for how long."""

    def __init__(self, store: NodeStore, stages: list[int]) -> None:
        self.store = store
        self.seen: dict[int, tuple[int, float]] = {stage: (-1, trio.current_time()) for stage in stages}

    async def stale(self, timeout_s: float) -> list[int]:
        """Stages whose counter has not moved for `timeout_s` since it first moved (reads every counter once); a
        node that has not beaten yet is not stale (the start's own timeouts bound how long it may take)."""
        now = trio.current_time()
        out = []
        for stage, (count, since) in self.seen.items():
            value = await self.store.count(f"alive/{stage}")
            if value != count:
                self.seen[stage] = (value, now)
            elif value > 0 and now - since > timeout_s:
                out.append(stage)
        return out
