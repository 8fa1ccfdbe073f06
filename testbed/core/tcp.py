"""TCP's own dynamics on one connection, as a flow model: a sequence of windows on the link's timeline.

A link's `transport` (the scenario's `[network] transport`) says what the sender's TCP does:

- `tuned` (the default): a warm, tuned long-haul connection. A frame takes its delay plus its bytes at the link's
  rate and no round trip of TCP's own: the seed papers' `l + n / B`, and what `netem.plan` tunes the kernel into.
- `kernel`: the kernel's defaults, what an untuned path does. `TcpFlow` below models it for the virtual backend and
  the userspace relay (the relay terminates each TCP connection, so it paces each chunk as the model says); the
  netem backend leaves the kernel's own TCP untuned.

The model (one direction of one connection; bytes, seconds):

    round      a window's worth of bytes leaves in a round; the next round starts one round trip later (when the
               first ACKs are back), or when more bytes arrive after that. A round's bytes still queue for the link
               (the link's next-free clock), so once the window holds the bandwidth-delay product the link streams
               at its rate and the rounds no longer show.
    slow start the window starts at INITIAL_WINDOW_SEGMENTS x MSS and grows by the bytes a round carried when that
               round used more than half of it (Linux grows cwnd only while cwnd-limited): it doubles each round
               under a bulk transfer, and stays put under small frames.
    cap        the window never exceeds `window_cap` bytes: the kernel's default buffers bound one stream at
               window_cap / RTT however fast the link (KERNEL_WINDOW_CAP_BYTES: tcp_rmem/tcp_wmem's defaults).
    idle       a connection that sent nothing for longer than its RTO (RTT + the minimum RTO, 200 ms: Linux's
               srtt + rttvar with rttvar floored at rto_min) restarts slow start: the window halves once per RTO
               idle, to no less than the initial window (RFC 2861, Linux's tcp_cwnd_restart).
    loss       each segment is lost with the link's loss probability (seeded). A round that lost one is
               delivered a round trip later (fast retransmit: the retransmission's round, everything after it held
               in order), and the window halves (Reno: ssthresh = cwnd / 2, then congestion avoidance: one MSS a
               round). Over many rounds this is the sawtooth behind Mathis' rate, MSS / RTT x sqrt(3/2) / sqrt(p).
               Linux's Reno with SACK and RACK does the same where it costs: one halving a lossy window
               (ssthresh = cwnd / 2), then one MSS a round, so a loss early in slow start leaves a long climb and
               a transfer's time is heavy-tailed; SACK retransmits only the lost segments, which the round's delay
               stands for. Checked against the kernel as an expectation (the mean over hundreds of seeds against
               the kernel's mean over tens of draws, testbed.studies.transport), with netem dropping single
               segments (the transport study's harness sets gso_max_segs 1: netem on a GSO packet drops a burst).

Congestion control is Reno: the netem backend sets it in each namespace of a `kernel` run
(net.ipv4.tcp_congestion_control), so the kernel runs what is modelled. Loss-free, Reno and Linux's default CUBIC
differ only in HyStart's early exit from slow start once the queue grows, after the link is already full.

What it leaves out, on purpose: the handshake (connections are open before a run's first lap), delayed ACKs (Linux
grows cwnd per acked segment, so a window still doubles a round), the receive buffer's autotuning (the cap stands
for where it ends), tail-loss probes and RTO backoff (a lost round costs one round trip).

`cold_transfer_s` is the closed form of a bulk transfer on a fresh connection, written apart from `TcpFlow` so each
checks the other (tests/test_tcp.py: exact to 1e-9 s).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

TRANSPORTS = ("tuned", "kernel")
MSS_BYTES = 1448  # a 1500-byte MTU less the IPv4, TCP and timestamp headers (netem.plan.SEGMENT_PAYLOAD_BYTES)
INITIAL_WINDOW_SEGMENTS = 10  # Linux's TCP_INIT_CWND (RFC 6928)
# One stream's window cap under the kernel's default buffers (tcp_rmem max 6 MiB, tcp_wmem max 4 MiB, of which the
# window gets a share after the per-skb overhead): the plateau of one stream at RTT 280 ms, 2.91-2.96 MB a round trip
# in two runs inside the user-mode-linux guest (kernel 6.1; `python -m testbed transport`, docs/transport.md). It
# is the kernel's: this box's own 6.18 allows tcp_rmem 32 MiB.
KERNEL_WINDOW_CAP_BYTES = 2_870_000
RTO_MIN_S = 0.2  # Linux's tcp_rto_min
MIN_WINDOW_SEGMENTS = 2  # Reno never halves below two segments


@dataclass(frozen=True)
class TcpParams:
    """One connection's constants: its round trip, the link's rate, the window's start and cap, the loss, the RTO."""

    rtt_s: float  # the path's round trip: this link's delay plus the way back's (ACKs)
    rate_bytes_s: float = math.inf
    initial_window: int = INITIAL_WINDOW_SEGMENTS * MSS_BYTES
    window_cap: int = KERNEL_WINDOW_CAP_BYTES
    loss: float = 0.0  # probability a segment is lost
    rto_min_s: float = RTO_MIN_S
    mss: int = MSS_BYTES
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rtt_s >= 0 or not self.rate_bytes_s > 0 or self.mss <= 0 \
                or not 0 < self.initial_window <= self.window_cap or not 0 <= self.loss < 1 or not self.rto_min_s > 0:
            raise ValueError(f"invalid TCP parameters {self}")

    @property
    def rto_s(self) -> float:
        return self.rtt_s + self.rto_min_s


class Bottleneck:
    """A link's timeline: the spans its rate is busy, shared by every connection over it.

    A flow books its window's bytes when they are written, which may be rounds ahead of now; another connection's
    bytes then take the first free spans from when they are ready (`book`), so several connections in slow start
    share the link as the kernel's do (their windows add up) instead of queueing behind each other's future rounds.
    One connection alone, or bytes that never leave a gap, see a plain next-free clock.
    """

    def __init__(self) -> None:
        self.starts: list[float] = []  # the busy spans [starts[i], ends[i]), disjoint, in order
        self.ends: list[float] = []
        self.open = 0  # flows over it now: the k-th open one draws its losses from seed + k

    @property
    def free(self) -> float:
        """When the last booked byte leaves."""
        return self.ends[-1] if self.ends else -math.inf

    def book(self, ready: float, seconds: float, now: float) -> tuple[float, float]:
        """Take `seconds` of the link's time from `ready` on, in its first free spans: (when the first byte
        leaves, when the last does). Spans that ended by `now` are forgotten (nothing can be booked before it)."""
        starts, ends = self.starts, self.ends
        gone = bisect.bisect_right(ends, now)
        if gone:
            del starts[:gone], ends[:gone]
        if seconds <= 0:
            return ready, ready
        i, t, left, first = bisect.bisect_right(ends, ready), ready, seconds, None
        while left > 0:
            if i < len(starts) and starts[i] <= t:  # inside a busy span: skip it
                t, i = ends[i], i + 1
                continue
            first = t if first is None else first
            if i < len(starts) and starts[i] < t + left:  # the gap ends first: fill it, go on after the span
                end = starts[i]
                left -= end - t
            else:
                end, left = t + left, 0.0
            if i > 0 and ends[i - 1] == t:  # joins the span before
                i -= 1
                ends[i] = end
            else:
                starts.insert(i, t)
                ends.insert(i, end)
            if i + 1 < len(starts) and starts[i + 1] == end:  # and the one after
                ends[i] = ends[i + 1]
                del starts[i + 1], ends[i + 1]
            t = end
        return first, t


class TcpFlow:
    """The sender's window on one connection: `send(arrival, n)` is when the last of n bytes, written at `arrival`,
    leaves the link (its serialization done); the caller adds the propagation delay (see the module doc). Flows
    given one `link` share its rate."""

    def __init__(self, params: TcpParams, link: Bottleneck | None = None) -> None:
        self.params = params
        self.link = Bottleneck() if link is None else link
        self._rng = random.Random(params.seed + self.link.open)  # each connection open at once its own draws
        self.link.open += 1
        self._open = True
        self.window = float(params.initial_window)
        self.ssthresh = math.inf
        self.round_start = -math.inf
        self.round_first = math.inf  # when the round's first byte left: its ACK starts the next round
        self.round_bytes = 0.0  # bytes sent in the current round
        self.last_sent = -math.inf  # when the last byte left
        self.hold = -math.inf  # a lost round's retransmission: nothing is delivered before it
        self.rounds = 0
        self.losses = 0
        self.restarts = 0
        self._lost_round = -1  # Linux recovers once per window: one halving a round

    def close(self) -> None:
        """The connection is gone: the next one over the link draws as this one did."""
        if self._open:
            self._open = False
            self.link.open -= 1

    def _restart_if_idle(self, arrival: float) -> None:
        idle = arrival - max(self.last_sent, self.round_start)
        rto = self.params.rto_s
        if not math.isfinite(idle) or idle <= rto:
            return
        self._grow()  # the last round's ACKs came back before the idleness
        self.round_bytes = 0.0
        floor = min(self.params.initial_window, self.window)
        window = self.window
        while idle > rto and window > floor:  # one halving per RTO of idleness (tcp_cwnd_restart)
            window /= 2
            idle -= rto
        self.window = max(window, floor)
        self.restarts += 1

    def _next_round(self, at: float) -> None:
        self._grow()
        self.round_start, self.round_first, self.round_bytes = at, math.inf, 0.0
        self.rounds += 1

    def _grow(self) -> None:
        if 2 * self.round_bytes > self.window:  # cwnd-limited: the round's ACKs grow the window
            if self.window < self.ssthresh:
                self.window = min(self.window + self.round_bytes, self.ssthresh)
            else:
                self.window += self.params.mss * self.round_bytes / self.window
            self.window = min(self.window, self.params.window_cap)

    def _lose(self, sent: float, left_link: float) -> None:
        """Seeded: did any of `sent` bytes' segments get lost? Then the round is delivered a round trip late and
        the window halves."""
        segments = math.ceil(sent / self.params.mss)
        if self._rng.random() >= 1.0 - (1.0 - self.params.loss) ** segments:
            return
        self.losses += 1
        self.hold = max(self.hold, left_link + self.params.rtt_s)
        if self._lost_round == self.rounds:  # the round is already in recovery
            return
        self._lost_round = self.rounds
        self.ssthresh = max(self.window / 2, MIN_WINDOW_SEGMENTS * self.params.mss)
        self.window = self.ssthresh

    def send(self, arrival: float, n_bytes: int) -> float:
        self._restart_if_idle(arrival)
        left = float(n_bytes)
        done = arrival
        while left > 0:
            round_end = (self.round_first if self.round_first < math.inf else self.round_start) + self.params.rtt_s
            if self.round_bytes >= self.window or arrival >= round_end and self.round_start < arrival:
                self._next_round(max(arrival, round_end))  # the window is spent, or the round's ACKs are back
            take = min(self.window - self.round_bytes, left)
            first, done = self.link.book(max(self.round_start, arrival), take / self.params.rate_bytes_s, arrival)
            if self.round_first == math.inf:
                self.round_first = first
            self.round_bytes += take
            left -= take
            if self.params.loss:
                self._lose(take, done)
        self.last_sent = max(self.last_sent, done)
        return max(done, self.hold)


def cold_transfer_s(n_bytes: int, params: TcpParams, one_way_s: float) -> float:
    """A bulk transfer of n bytes on a fresh connection, loss-free: from the write to the last byte's arrival.

    Round k carries w_k = min(IW 2^k, cap) bytes and lasts one RTT, until the round that holds the last byte or
    the first whose window fills the pipe (w_k >= rate x RTT), from which the link streams: with m that round and
    S_m the bytes of the rounds before it, T = m RTT + (n - S_m) / rate + one_way.
    """
    if n_bytes <= 0:
        return one_way_s
    pipe = params.rate_bytes_s * params.rtt_s
    sent, k = 0.0, 0
    while True:
        window = min(params.initial_window * 2.0 ** k, params.window_cap)
        if sent + window >= n_bytes or window >= pipe:
            return k * params.rtt_s + (n_bytes - sent) / params.rate_bytes_s + one_way_s
        sent += window
        k += 1


def window_limited_rate(params: TcpParams) -> float:
    """One stream's steady rate, bytes/s: the link's, or the window cap over the round trip if that is less."""
    return min(params.rate_bytes_s, params.window_cap / params.rtt_s if params.rtt_s > 0 else math.inf)


def mathis_rate(params: TcpParams) -> float:
    """Mathis et al. (1997): a Reno stream's rate under random loss p, MSS / RTT x sqrt(3/2) / sqrt(p), bytes/s,
    and never above the window-limited rate."""
    if params.loss <= 0 or params.rtt_s <= 0:
        return window_limited_rate(params)
    return min(window_limited_rate(params), params.mss / params.rtt_s * math.sqrt(1.5 / params.loss))


def return_delay_ms(links, link) -> float:
    """The delay `link`'s ACKs take back: the reverse link's, or the link's own where there is none (a path is as
    long both ways; netem's transport "kernel" delays the ACKs so: netem.plan.NetworkPlan.ack_qdiscs)."""
    back = [l.delay_ms for l in links if (l.src, l.dst) == (link.dst, link.src)]
    return back[0] if back else link.delay_ms


def link_params(links, link, rto_ms: float) -> TcpParams:
    """The TCP parameters of `link` among `links` (LinkSpec): its round trip, rate, loss and seed; the minimum RTO."""
    return TcpParams((link.delay_ms + return_delay_ms(links, link)) / 1e3, link.rate_bytes_s,
                     loss=link.loss_pct / 100, rto_min_s=rto_ms / 1e3, seed=link.seed)


def prompt_transfer_s(links, ring, hop_bytes: list[int], rto_ms: float) -> list[float]:
    """Per ring hop: a cold connection's transfer of the prompt's frame, less the hop's delay (slow start's rounds
    and the bytes at the rate the window allows: cold_transfer_s). Eq. 5's serialization term under transport
    "kernel"."""
    return [cold_transfer_s(n, link_params(links, link, rto_ms), 0.0) for link, n in zip(ring, hop_bytes, strict=True)]


class HopFlows:
    """A run's ring hops under transport "kernel", replayed: one TcpFlow per hop fed every frame the hop carried,
    at the moment it was sent, so a prediction counts what TCP's window made of each (the frame's time on the link,
    its delay aside). The stamps are the run's; the arithmetic is the model's (TcpFlow)."""

    def __init__(self, links, ring, rto_ms: float) -> None:
        self.flows = [TcpFlow(link_params(links, link, rto_ms)) for link in ring]

    def feed(self, sent_at: list[float], sizes: list[int]) -> list[float]:
        """Per hop: how long its frame of sizes[i] bytes, written at sent_at[i], took to leave the link."""
        out = []
        for flow, at, n in zip(self.flows, sent_at, sizes):
            start = max(at, flow.link.free)
            out.append(flow.send(at, n) - start if n else 0.0)
        return out
