"""Virtual backend: every agent a Trio task in one process on simulated time, every link an in-memory relay.

`--shaper virtual` runs the same agents, modes, wire frames (encoded to bytes and decoded), run log, summary and
collector as the other backends; only the seam differs (testbed.core.transport): agents listen and dial on one
`MemoryNetwork`, and each directed link src -> dst takes the bytes its sender puts in (in pieces of the relay's
RELAY_CHUNK), gives each piece the userspace relay's `LinkTiming` deadline (delay, seeded jitter, loss with the RTO,
rate as a next-free clock, the schedule) on Trio's clock, and hands it to the receiver at that deadline: one task a
link, no relay task reading a stream in between. The launcher runs the whole run under
`trio.testing.MockClock(autojump_threshold=0)` (testbed.core.virtual_time), so:

- the forward passes are real (the tokens are the model's) but take no simulated time: a stage's compute is its
  emulated cost, and a stage with `compute_ms = 0` computes in zero time;
- every wait ends exactly on time: the measured figures are the model's, with no overhead, and time dilation
  does not apply (a virtual run is always exact);
- the same scenario and seed give the same lap records and summary, byte for byte, but for the wall-clock
  fields named in `WALL_CLOCK_FIELDS`.
"""

from __future__ import annotations

import collections
import contextlib

import trio

from netem.base import Shaper, ShaperOptions
from netem.userspace import RELAY_CHUNK, LinkTiming, describe_timing, realized_propagation
from testbed.core.clock import TRIO
from testbed.core.tcp import Bottleneck
from testbed.core.records import Address, LinkSpec
from testbed.core.transport import VIRTUAL_HOST, MemoryNetwork, MemoryStream

# What a virtual run means, as the JSON summary says it (shaper_facts.virtual).
MEANING = {
    "clock": "trio.testing.MockClock(autojump_threshold=0): simulated time, every agent a Trio task in one process",
    "forward_passes": "real (the tokens are the model's), taking no simulated time",
    "compute": "each stage's emulated cost only (compute_ms, cost_ms, prefill_ms_per_token, draft_ms); "
               "compute_ms = 0 computes in zero time",
    "links": "the relay's LinkTiming on in-memory streams: delay, seeded jitter, loss with the RTO, rate, schedule",
    "dilation": "not applied: a virtual run is exact",
}
# Fields of the JSON summary that read the box's clock or the process's usage, not simulated time: the only ones
# two virtual runs of one scenario and seed may differ in.
WALL_CLOCK_FIELDS = ("agents", "history")


class VirtualShaper(Shaper):
    """Links as in-memory relays on simulated time; the launcher runs its agents as tasks (see the module doc)."""

    name = "virtual"

    def __init__(self, links: list[LinkSpec], n_stages: int, run_id: str,
                 options: ShaperOptions | None = None) -> None:
        super().__init__(links, n_stages, run_id, options)
        self.reason = self.reason or "virtual backend requested"  # netem.select says why, as for the others
        self.transport = MemoryNetwork()  # agents listen and dial here (testbed.core.transport)
        self.clock = TRIO
        self._timings: list[LinkTiming] = []
        self._origin: float | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    async def setup(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())

    def agent_listen_host(self, stage: int) -> str:
        return VIRTUAL_HOST

    async def connect(self, listen: dict[int, Address]) -> dict[tuple[int, int], Address]:
        assert self._nursery is not None, "connect() before setup()"
        peers = {}
        for link in self.links:
            listener, port = await self.transport.listen(VIRTUAL_HOST)
            await self._nursery.start(trio.serve_listeners, self._relay_to(link, listen[link.dst]), [listener])
            peers[(link.src, link.dst)] = (VIRTUAL_HOST, port)
        return peers

    def _relay_to(self, link: LinkSpec, target: Address):
        events = tuple(e.to_dict() for e in self.schedule if (e.src, e.dst) == (link.src, link.dst))
        link_clock = Bottleneck()  # the link's rate, shared by its connections

        async def handle(upstream: MemoryStream) -> None:
            downstream = await self.transport.connect(target)
            timing = LinkTiming.from_spec(link, self.options.loss_rto_ms, events, self.options.transport,
                                          self.return_delay_ms(link), link_clock)
            timing.origin = self._origin
            self._timings.append(timing)
            await shaped_link(upstream, downstream, timing)

        return handle

    async def realized_propagation(self) -> dict[str, tuple[float, int]]:
        return realized_propagation(self._timings)

    async def start_schedule(self, origin: float, nursery=None) -> None:
        self._origin = origin
        for timing in self._timings:
            timing.origin = origin

    def plan_lines(self) -> list[str]:
        return [f"in-memory link {link.name} on simulated time: "
                + describe_timing(link, self.options.loss_rto_ms, self.options.transport,
                                  self.return_delay_ms(link)).replace(" through 127.0.0.1", "")
                for link in sorted(self.links, key=lambda l: (l.src, l.dst))] + [
            f"schedule at {e.at_s:g} s: {e.describe()}" for e in self.schedule]

    def describe(self) -> dict:
        return {**super().describe(), "virtual": {**MEANING, "wall_clock_fields": list(WALL_CLOCK_FIELDS)}}

    async def aclose(self) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()  # the relays end at once: nothing of theirs waits on the box
        await stack.aclose()  # not in a shield: a cancel scope opened here would sit inside the nursery's own


async def shaped_link(upstream: MemoryStream, downstream: MemoryStream, timing: LinkTiming) -> None:
    """Deliver what the sender puts into `upstream` to `downstream`, each piece at its LinkTiming deadline (the
    arrival is the moment it was put); the sender's close reaches the receiver after its last piece, and the
    receiver's close breaks the sender's next put. Closes both at the end."""
    queue: collections.deque[tuple[float, bytes] | None] = collections.deque()
    lot = trio.lowlevel.ParkingLot()

    def sink(data: bytes) -> None:
        if not data:
            queue.append(None)
        now = trio.current_time()
        for offset in range(0, len(data), RELAY_CHUNK):
            piece = data[offset:offset + RELAY_CHUNK]
            queue.append((timing.deadline(now, len(piece)), piece))
        lot.unpark_all()

    upstream.incoming.divert(sink)
    try:
        while True:
            while not queue:
                await lot.park()
            item = queue.popleft()
            if item is None:
                return
            await trio.sleep_until(item[0])
            downstream.outgoing.put(item[1])
    except trio.BrokenResourceError:
        return
    finally:
        timing.close()
        await trio.aclose_forcefully(upstream)
        await trio.aclose_forcefully(downstream)
