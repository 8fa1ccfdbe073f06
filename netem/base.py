"""The shaper interface: directed links in, peer addresses out, guaranteed teardown."""

from __future__ import annotations

import abc
from dataclasses import dataclass

from testbed.core.clock import MONOTONIC, Clock
from testbed.core.errors import ShapingError
from testbed.core.records import LOSS_RTO_MS, Address, LinkSpec
from testbed.core import tcp
from testbed.core.tcp import TRANSPORTS

DEFAULT_LOSS_RTO_MS = LOSS_RTO_MS  # testbed.core.records: Linux's minimum TCP retransmission timeout


@dataclass(frozen=True)
class ShaperOptions:
    """Settings every backend is built with; a backend ignores what its medium decides for itself.

    loss_rto_ms: what a lost chunk costs on the userspace relay (it is delivered this much later, as
    TCP would after a retransmission timeout). Kernel netem drops real packets and the kernel's own
    TCP retransmits them, so the kernel backend ignores it.
    """

    loss_rto_ms: float = DEFAULT_LOSS_RTO_MS
    # testbed.scenario.schedule.LinkEvent objects (src, dst, at_s, to_dict(), describe()): the links' changes over time,
    # counted from the origin start_schedule is given
    schedule: tuple = ()
    # what the senders' TCP does (testbed.core.tcp.TRANSPORTS): "tuned", a warm long-haul connection (a frame takes
    # its delay and its bytes at the rate), or "kernel", the kernel's defaults (slow start, the window's cap, idle
    # restart, loss recovery: modelled on the relay and the virtual links, the kernel's own on netem)
    transport: str = "tuned"

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ShapingError(f"ShaperOptions.transport must be one of {', '.join(TRANSPORTS)}, "
                               f"got {self.transport!r}")
        if not isinstance(self.loss_rto_ms, (int, float)) or isinstance(self.loss_rto_ms, bool) \
                or not self.loss_rto_ms > 0:
            raise ShapingError(f"ShaperOptions.loss_rto_ms must be a positive number of ms, got {self.loss_rto_ms!r}")


@dataclass(frozen=True)
class ScheduleChange:
    """One change of a link schedule as the medium took it, in seconds from the schedule's origin (box clock).

    The kernel takes a `tc qdisc change` somewhere between `sent_s` (the request left) and `landed_s` (it was
    acknowledged and read back): milliseconds apart on a real kernel, up to a second or two inside user-mode-linux
    while the agents' compute keeps its one vCPU busy.
    """

    link: str  # "0->1"
    what: str  # the event as the schedule describes it, or "0->1 back up"
    due_s: float
    sent_s: float
    landed_s: float


class Shaper(abc.ABC):
    """A backend that places agents on an emulated network.

    Life cycle, driven by the launcher::

        async with shaper:                       # __aenter__ -> setup(); __aexit__ -> aclose()
            netns  = shaper.agent_netns(stage)             # where agent `stage` runs (forked into it), or
            prefix = shaper.agent_command_prefix(stage)    # how to start it as a fresh process there
            host   = shaper.agent_listen_host(stage)       # where agent `stage` binds (port 0 is fine)
            ...agents start and report their bound (host, port)...
            peers  = await shaper.connect(listen)          # {(src, dst): address src dials to reach dst}

    plan_lines() says what setup()/connect() would do, before and without doing it (no root needed).
    aclose() must remove everything the backend created, on every exit path, and be idempotent.
    """

    name: str = "abstract"
    reason: str = ""  # why this backend was chosen, in one plain line (printed by the launcher)
    probe: str = ""  # what the capability probe found, step by step, when one ran (--verbose; shaper_facts)
    # A simulated backend (netem.virtual) sets `transport` (testbed.core.transport: how its agents listen and dial) and
    # its `clock`: the launcher then runs the agents as tasks in its own process, on simulated time.
    transport = None
    clock: Clock = MONOTONIC
    # Its links are the kernel's TCP over the delay (netem): a connection's receive window starts at most 64 KiB
    # (Linux caps the first one at U16_MAX whatever initrwnd and tcp_rmem say) and grows a round trip at a time,
    # so the entry warms every hop with one prompt-sized frame before the first lap (agents.process.ring.RingClient.warm).
    warm_windows: bool = False

    @property
    def in_process(self) -> bool:
        """Agents run as Trio tasks in the launcher, on `transport` and `clock` (a simulated backend)."""
        return self.transport is not None

    def __init__(self, links: list[LinkSpec], n_stages: int, run_id: str,
                 options: ShaperOptions | None = None) -> None:
        self.links = list(links)
        self.n_stages = n_stages
        self.run_id = run_id
        self.options = ShaperOptions() if options is None else options
        if not isinstance(self.options, ShaperOptions):
            raise ShapingError(f"options must be a ShaperOptions, got {type(self.options).__name__}")
        self.schedule_changes: list[ScheduleChange] = []  # a backend whose changes take time to land fills it

    async def setup(self) -> None:
        """Create whatever must exist before agents start (namespaces, veths, qdiscs)."""

    def agent_command_prefix(self, stage: int) -> list[str]:
        """argv prefix that runs a command where agent `stage` lives (e.g. inside its namespace)."""
        return []

    def agent_netns(self, stage: int) -> str | None:
        """The network namespace (its path) agent `stage` runs in, entered by a forked agent (agents.forkserver);
        None: the launcher's own."""
        return None

    def agent_listen_host(self, stage: int) -> str:
        """The host address agent `stage` should bind its listener to."""
        return "127.0.0.1"

    @abc.abstractmethod
    async def connect(self, listen: dict[int, Address]) -> dict[tuple[int, int], Address]:
        """Given each agent's bound listener, return the address `src` dials to reach `dst` over the link."""

    @abc.abstractmethod
    def plan_lines(self) -> list[str]:
        """What this backend would set up, one human-readable line per step (pure: no root, no kernel)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Tear everything down. Idempotent; must not raise for things already gone."""

    @property
    def schedule(self) -> tuple:
        return self.options.schedule

    def return_delay_ms(self, link: LinkSpec) -> float:
        """The way back's delay for `link`'s ACKs (testbed.core.tcp.return_delay_ms): a transport "kernel" flow's
        round trip is link.delay_ms + this."""
        return tcp.return_delay_ms(self.links, link)

    async def start_schedule(self, origin: float, nursery=None) -> None:
        """The run starts now (`origin`, on the box's monotonic clock): apply the schedule's changes from here on
        (a backend that needs tasks for it starts them in `nursery`, cancelled when the run ends)."""
        if self.schedule:
            raise ShapingError(f"the {self.name} backend cannot change links during a run")

    async def realized_propagation(self) -> dict[str, tuple[float, int]]:
        """Per link name, the mean propagation delay (s, on the clock the links run on: dilated where the run is)
        its chunks drew so far and how many: the seeded jitter as it came out. {} where the backend does not know
        (the kernel draws its own)."""
        return {}

    def describe(self) -> dict:
        """Facts for the JSON summary (backend-specific extras welcome)."""
        return {"backend": self.name, "reason": self.reason, **({"probe": self.probe} if self.probe else {})}

    async def __aenter__(self) -> "Shaper":
        try:
            await self.setup()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
