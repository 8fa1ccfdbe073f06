"""The release deadline of each chunk on one directed link: the arithmetic the userspace relay and the virtual
backend share (netem.userspace's module doc says what it does to a chunk; testbed.core.tcp what transport "kernel"
adds)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from testbed.core.errors import ShapingError
from testbed.core.records import LOSS_RTO_MS, LinkSpec, mbit_to_bytes_s
from testbed.core.tcp import Bottleneck, TcpFlow, TcpParams

DEFAULT_RTO_MS = LOSS_RTO_MS


@dataclass
class LinkTiming:
    """Pure release-deadline arithmetic for one directed link (see the module docstring)."""

    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0  # probability a chunk needs a retransmission
    rate_bytes_s: float = math.inf
    rto_s: float = DEFAULT_RTO_MS / 1e3
    seed: int = 0
    link: str = ""  # its LinkSpec's name (the realized delays are reported by it)

    events: tuple[dict, ...] = ()  # testbed.scenario.schedule.LinkEvent fields, by at_s: applied once `origin` is set
    origin: float | None = None  # the clock's time the schedule counts from (the launcher sends it at run start)
    # transport "kernel": the sender's TCP as testbed.core.tcp models it (its window, slow start, idle restart and
    # loss recovery decide when each chunk leaves; the rate's next-free clock and the per-chunk RTO give way to it)
    flow: TcpFlow | None = None
    # the link's next-free clock: shared by every connection over the link (they share its rate)
    link_clock: Bottleneck = field(default_factory=Bottleneck)

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0 or not 0 <= self.loss <= 1 or self.rate_bytes_s <= 0:
            raise ShapingError(f"invalid link timing {self}")
        self._rng = random.Random(self.seed)
        self._last_deadline = -math.inf
        self._pending = sorted(self.events, key=lambda e: e["at_s"])
        self._up_at = -math.inf  # a partition: nothing leaves before this
        self.drawn = [0.0, 0]  # every chunk's propagation delay as drawn (jitter included), summed; chunks
        self._flow_delay = self.delay_s  # the delay the flow's round trip was built with

    @classmethod
    def from_spec(cls, link: LinkSpec, rto_ms: float = DEFAULT_RTO_MS, events: tuple[dict, ...] = (),
                  transport: str = "tuned", return_delay_ms: float = 0.0,
                  link_clock: Bottleneck | None = None) -> "LinkTiming":
        """One connection over `link`. `transport` "kernel" gives it a TcpFlow whose round trip is the link's delay
        plus `return_delay_ms`, the way back's (testbed.core.tcp.return_delay_ms). Connections given one
        `link_clock` share the link's rate."""
        rate = link.rate_bytes_s
        link_clock = Bottleneck() if link_clock is None else link_clock
        flow = None
        if transport == "kernel":
            flow = TcpFlow(TcpParams((link.delay_ms + return_delay_ms) / 1e3, rate, loss=link.loss_pct / 100,
                                     rto_min_s=rto_ms / 1e3, seed=link.seed), link_clock)
        return cls(link.delay_ms / 1e3, link.jitter_ms / 1e3, link.loss_pct / 100, rate, rto_ms / 1e3, link.seed,
                   link.name, events, flow=flow, link_clock=link_clock)

    def _apply(self, arrival: float) -> None:
        """Swap in every scheduled change due by `arrival` (a moving network: testbed.scenario.schedule)."""
        while self._pending and self.origin is not None and self.origin + self._pending[0]["at_s"] <= arrival:
            event = self._pending.pop(0)
            at = self.origin + event["at_s"]
            if event.get("down_s"):
                self._up_at = max(self._up_at, at + event["down_s"])
                continue
            if event.get("delay_ms") is not None:
                self.delay_s = event["delay_ms"] / 1e3
            if event.get("jitter_ms") is not None:
                self.jitter_s = event["jitter_ms"] / 1e3
            if event.get("loss_pct") is not None:
                self.loss = event["loss_pct"] / 100
            if event.get("rate_mbit") is not None:
                self.rate_bytes_s = mbit_to_bytes_s(event["rate_mbit"])
            if self.flow is not None:  # the flow's round trip keeps the way back's share
                params = self.flow.params
                back = params.rtt_s - self._flow_delay
                self.flow.params = replace(params, rtt_s=self.delay_s + back, rate_bytes_s=self.rate_bytes_s,
                                           loss=self.loss)
                self._flow_delay = self.delay_s

    def close(self) -> None:
        """The connection over this link ended (its flow leaves the link's count of open ones)."""
        if self.flow is not None:
            self.flow.close()

    def deadline(self, arrival: float, n_bytes: int) -> float:
        self._apply(arrival)
        arrival = max(arrival, self._up_at)  # the link is down: held until it is back, then sent in order
        if self.flow is not None:
            left_link = self.flow.send(arrival, n_bytes)
        else:
            left_link = self.link_clock.book(arrival, n_bytes / self.rate_bytes_s, arrival)[1]
        propagation = self.delay_s
        if self.jitter_s:
            propagation = max(0.0, propagation + self._rng.gauss(0.0, self.jitter_s))
        self.drawn[0] += propagation
        self.drawn[1] += 1
        deadline = left_link + propagation
        if self.flow is None and self.loss and self._rng.random() < self.loss:
            deadline += self.rto_s
        deadline = max(deadline, self._last_deadline)
        self._last_deadline = deadline
        return deadline
