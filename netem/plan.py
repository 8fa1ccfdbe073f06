"""Pure planning of the kernel netem network: names, addresses and qdisc operations for a set of directed links.

Nothing here touches the kernel; `netem.kernel` applies a `NetworkPlan` with pyroute2.

Topology. One network namespace per stage, one veth pair per unordered pair of stages that has at
least one directed link (so any latency matrix works: rings, stars, full meshes), each pair on its
own /30. A directed link src -> dst is the egress root qdisc of the pair's end in src's namespace::

      namespace gr1a2b3-s0                         namespace gr1a2b3-s1
     +------------------------------+             +------------------------------+
     | agent 0, listens on 0.0.0.0  |             | agent 1, listens on 0.0.0.0  |
     |                              |  veth pair  |                              |
     | gr1a2b3-0-1 10.201.0.1/30 o==|=============|= o gr1a2b3-1-0 10.201.0.2/30 |
     |  egress: link 0->1 (netem)   |             |  egress: link 1->0 (if any)  |
     +------------------------------+             +------------------------------+
     agent 0 dials 10.201.0.2:<agent 1's port> to send to stage 1.

The qdisc tree on each shaped end (handles as ints: 0x10000 is 1:)::

    dev gr1a2b3-<src>-<dst>  (namespace gr1a2b3-s<src>)
    root 0x10000 (1:)  netem  delay D  jitter J  distribution normal  loss L%  limit N  [rate R]
                        (no child qdisc; a packet leaves when its time_to_send comes)

Why netem's own `rate` and not tbf/htb (with netem as child or parent): netem stamps each packet with
time_to_send = max(now + delay, time_to_send of the previous packet) + len / R, so a message of n
bytes arrives after delay + n / R with no token-bucket burst, which is exactly the seed papers'
l_i + n * s_h / BW_i; tbf would let its `burst` through at line rate (hiding the byte term of a
0.5-50 KB frame) unless the burst is made tiny, which costs precision at high rates. The same
max(...) keeps FIFO order when jitter is on: without a rate netem re-sorts jittered packets by
time_to_send and TCP pays for the reordering with dup-ACKs and spurious retransmits, so a jittered
link with no rate limit gets FIFO_RATE_MBIT (100 Gbit/s: 0.12 us per 1500-byte packet) purely to stay
in order, like the userspace relay (FIFO, Normal(0, jitter) jitter, delay + jitter >= 0). One qdisc
per direction is also one thing to read back.

Jitter is Normal(0, jitter_ms): we send netem the same 4096-entry normal table iproute2 ships as
/usr/lib/tc/normal.dist (NETEM_DIST_SCALE 8192), built here from statistics.NormalDist. Delay and
jitter also go as nanoseconds (TCA_NETEM_LATENCY64/JITTER64) so no precision is lost to psched
ticks; the seed goes as TCA_NETEM_PRNG_SEED, which kernels before 6.4 ignore (their netem draws
from the kernel's own PRNG, so kernel runs are not reproducible packet for packet).

Queue limit: netem's `limit` (packets) must hold everything in flight on the link, so
limit = max(DEFAULT_LIMIT_PACKETS, ceil(LIMIT_HEADROOM * packets/s * (delay + 4 * jitter))) with
packets/s = rate / MTU, and UNLIMITED_ASSUMED_MBIT for links without a rate.

Names (IFNAMSIZ: at most 15 characters) share the run prefix `gr` + 5 hex digits, so
`netem.clean` can find leftovers by prefix and touch nothing else:
namespaces `<prefix>-s<stage>`, veth ends `<prefix>-<here>-<there>`.
"""

from __future__ import annotations

import array
import hashlib
import ipaddress
import math
import re
import statistics
from dataclasses import dataclass, field
from functools import lru_cache

from testbed.core.records import BYTES_PER_MBIT, LinkSpec
from testbed.core.errors import ShapingError

PREFIX_ROOT = "gr"
SHORT_ID_LEN = 5
IFNAMSIZ = 15  # usable characters of a Linux interface name (16 with the NUL)
# Every object the testbed names matches this; `clean` removes only such names.
NAME_RE = re.compile(r"^gr[0-9a-f]{5}-(s\d+|\d+-\d+)$")

ADDRESS_POOL = ipaddress.IPv4Network("10.201.0.0/16")  # exists only inside our namespaces
SUBNET_PREFIXLEN = 30

ROOT_HANDLE = 0x10000  # 1:
TC_H_ROOT = 0xFFFFFFFF  # include/uapi/linux/pkt_sched.h
U32_MAX = 0xFFFFFFFF  # netem's 32-bit fields (rate, loss fraction); larger rates go as TCA_NETEM_RATE64

MTU_BYTES = 1500
DEFAULT_LIMIT_PACKETS = 1000  # netem's own default
LIMIT_HEADROOM = 1.5
JITTER_TAIL_SIGMAS = 4.0  # the normal table reaches about 3.9 sigma
UNLIMITED_ASSUMED_MBIT = 10_000.0  # packets/s assumed for limit sizing when a link has no rate
FIFO_RATE_MBIT = 100_000.0  # rate given to jittered unlimited links, only to keep netem FIFO
# A link's rate is payload goodput, as the relay and the virtual backend shape it and every prediction counts it;
# netem's counts each packet whole: Ethernet, IPv4 and TCP headers with timestamps (14 + 20 + 32 bytes) on at most
# MTU - 52 bytes of payload. The qdisc gets the rate that leaves the configured one to a full segment's payload.
WIRE_HEADER_BYTES = 66
SEGMENT_PAYLOAD_BYTES = MTU_BYTES - 52
HEADER_RATE_FACTOR = (SEGMENT_PAYLOAD_BYTES + WIRE_HEADER_BYTES) / SEGMENT_PAYLOAD_BYTES
MAX_DELAY_MS = 60_000.0
MAX_RATE_MBIT = 1_000_000.0

NETEM_DIST_SCALE = 8192  # include/uapi/linux/pkt_sched.h
NETEM_DIST_SIZE = 4096  # entries in iproute2's normal.dist
JITTER_DISTRIBUTION = "normal"

# A link is a warm, tuned long-haul connection: a frame takes its delay plus its bytes at the link's rate, with no
# round trips of TCP's own. So every pair route starts with a window that holds the largest frame (a 64 MiB prompt
# is 46,000 segments: initcwnd/initrwnd), and every socket's buffers hold it (tcp_rmem/tcp_wmem: the initial
# receive window is bounded by the receive buffer, the data in flight by the send buffer; taken only as used).
INITIAL_WINDOW_SEGMENTS = 65_535
SOCKET_BUFFER_BYTES = 256 * 2**20
# Per-namespace sysctls: a lap leaves every connection idle for a whole ring time, and Linux would
# otherwise restart slow start after each idle period (RFC 2861), adding round trips to every frame.
NAMESPACE_SYSCTLS = (("net/ipv4/tcp_slow_start_after_idle", "0"),
                     ("net/ipv4/tcp_rmem", f"4096 {SOCKET_BUFFER_BYTES} {SOCKET_BUFFER_BYTES}"),
                     ("net/ipv4/tcp_wmem", f"4096 {SOCKET_BUFFER_BYTES} {SOCKET_BUFFER_BYTES}"))
# transport "kernel" (testbed.core.tcp): the kernel's own defaults (initial window 10, its buffers, slow start after
# idle), with Reno as the congestion control, the one the flow model of the relay and the virtual links follows
# (and no metrics saved per destination: a fresh connection would start from a closed one's ssthresh, not cold)
KERNEL_SYSCTLS = (("net/ipv4/tcp_congestion_control", "reno"), ("net/ipv4/tcp_no_metrics_save", "1"))


@dataclass(frozen=True)
class NamespacePlan:
    """One network namespace, home of one agent."""

    stage: int
    name: str
    sysctls: tuple[tuple[str, str], ...] = NAMESPACE_SYSCTLS


@dataclass(frozen=True)
class VethPlan:
    """A point-to-point veth pair between stages a < b, each end in its stage's namespace."""

    a: int
    b: int
    namespace_a: str
    namespace_b: str
    ifname_a: str  # lives in namespace_a; the egress of link a -> b
    ifname_b: str  # lives in namespace_b; the egress of link b -> a
    address_a: str
    address_b: str
    prefixlen: int
    subnet: str  # "10.201.0.0/30"
    initial_window: int | None = INITIAL_WINDOW_SEGMENTS  # the pair route's initcwnd/initrwnd; None: the kernel's

    def end(self, stage: int) -> tuple[str, str, str]:
        """(namespace, ifname, address) of this pair's end in `stage`."""
        if stage == self.a:
            return self.namespace_a, self.ifname_a, self.address_a
        if stage == self.b:
            return self.namespace_b, self.ifname_b, self.address_b
        raise ShapingError(f"stage {stage} is not on the veth pair {self.a}-{self.b}")


@dataclass(frozen=True)
class NetemPlan:
    """The root netem qdisc that shapes one directed link (RTM_NEWQDISC on the src end)."""

    link: LinkSpec
    namespace: str
    ifname: str
    handle: int
    parent: int
    latency_ns: int
    jitter_ns: int
    loss_pct: float
    limit_packets: int
    rate_bytes_s: int  # 0: no rate (unshaped, in order)
    rate_is_fifo_only: bool  # True: rate_bytes_s is FIFO_RATE_MBIT, not a configured limit
    distribution: str | None  # "normal" when jitter > 0
    seed: int

    @property
    def delay_us(self) -> int:
        return round(self.latency_ns / 1000)

    @property
    def jitter_us(self) -> int:
        return round(self.jitter_ns / 1000)

    def pyroute2_parameters(self) -> dict:
        """Keyword arguments for pyroute2's sched_netem.get_parameters (delay/jitter in microseconds)."""
        params: dict = {"delay": self.delay_us, "jitter": self.jitter_us, "loss": self.loss_pct,
                        "limit": self.limit_packets}
        if self.rate_bytes_s:
            params["rate"] = min(self.rate_bytes_s, U32_MAX)  # the rest goes as TCA_NETEM_RATE64
        return params


@dataclass(frozen=True)
class NetworkPlan:
    """Everything `netem.kernel` creates for one run, in creation order."""

    prefix: str
    n_stages: int
    namespaces: tuple[NamespacePlan, ...]
    veths: tuple[VethPlan, ...]
    qdiscs: tuple[NetemPlan, ...]
    peer_hosts: dict[tuple[int, int], str] = field(default_factory=dict)  # (src, dst) -> dst's address
    transport: str = "tuned"  # testbed.core.tcp.TRANSPORTS: "kernel" leaves the kernel's TCP untuned
    # transport "kernel": a delay-only netem on the way back of every link that has no reverse link, so the ACKs
    # take the path's delay too (a round trip is twice the one-way delay, as testbed.core.tcp's flows assume)
    ack_qdiscs: tuple[NetemPlan, ...] = ()

    def namespace(self, stage: int) -> str:
        return self.namespaces[stage].name

    def pair(self, src: int, dst: int) -> VethPlan:
        a, b = min(src, dst), max(src, dst)
        for veth in self.veths:
            if (veth.a, veth.b) == (a, b):
                return veth
        raise ShapingError(f"no veth pair between stages {src} and {dst} (no link {src}->{dst} or back)")

    def qdisc(self, src: int, dst: int) -> NetemPlan:
        for q in self.qdiscs:
            if (q.link.src, q.link.dst) == (src, dst):
                return q
        raise ShapingError(f"no directed link {src}->{dst} in this plan")

    def names(self) -> list[str]:
        """Every kernel object name the plan creates (namespaces and both veth ends)."""
        out = [ns.name for ns in self.namespaces]
        for veth in self.veths:
            out += [veth.ifname_a, veth.ifname_b]
        return out


def short_run_id(run_id: str) -> str:
    """5 hex digits for the run prefix: the run id's own start when it is hex, else a hash of it."""
    text = str(run_id).lower()
    if re.fullmatch(r"[0-9a-f]{%d}.*" % SHORT_ID_LEN, text, re.S):
        return text[:SHORT_ID_LEN]
    return hashlib.sha1(str(run_id).encode()).hexdigest()[:SHORT_ID_LEN]


def run_prefix(run_id: str) -> str:
    """`gr` + 5 hex digits: the prefix of every object of this run."""
    return PREFIX_ROOT + short_run_id(run_id)


def namespace_name(prefix: str, stage: int) -> str:
    return f"{prefix}-s{stage}"


def veth_name(prefix: str, here: int, there: int) -> str:
    name = f"{prefix}-{here}-{there}"
    if len(name) > IFNAMSIZ:
        raise ShapingError(f"interface name {name!r} is longer than IFNAMSIZ ({IFNAMSIZ}); "
                           f"stage numbers {here} and {there} are too large for the prefix {prefix!r}")
    return name


def is_testbed_name(name: str, prefix: str = PREFIX_ROOT) -> bool:
    """True for names this module generates that also start with `prefix` (e.g. "gr" or "gr1a2b3")."""
    return name.startswith(prefix) and NAME_RE.match(name) is not None


@lru_cache(maxsize=1)
def normal_distribution_table() -> bytes:
    """netem's TCA_NETEM_DELAY_DIST for Normal(0, 1): int16 quantiles scaled by NETEM_DIST_SCALE.

    Same construction as iproute2's normal.c (every 4th point of a 16384-point inverse CDF), which is
    what `tc qdisc ... distribution normal` loads from /usr/lib/tc/normal.dist.
    """
    unit = statistics.NormalDist()
    points = NETEM_DIST_SIZE * 4
    values = []
    for k in range(NETEM_DIST_SIZE):
        p = max(4 * k, 0.5) / points
        values.append(max(-32768, min(32767, round(NETEM_DIST_SCALE * unit.inv_cdf(p)))))
    return array.array("h", values).tobytes()  # native little-endian int16, as the kernel reads it


def limit_packets(delay_ms: float, jitter_ms: float, rate_mbit: float) -> int:
    """netem `limit`: at least LIMIT_HEADROOM x packets/s x worst-case delay, never below netem's 1000."""
    rate = rate_mbit if rate_mbit > 0 else UNLIMITED_ASSUMED_MBIT
    packets_per_s = rate * BYTES_PER_MBIT / MTU_BYTES
    worst_delay_s = (delay_ms + JITTER_TAIL_SIGMAS * jitter_ms) / 1e3
    return max(DEFAULT_LIMIT_PACKETS, math.ceil(LIMIT_HEADROOM * packets_per_s * worst_delay_s))


def _check_number(link: LinkSpec, name: str, value: float, low: float, high: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ShapingError(f"link {link.name}: {name} must be a number in [{low:g}, {high:g}], got {value!r}")


def validate(links: list[LinkSpec], n_stages: int) -> None:
    """ShapingError naming the link and field for anything the kernel backend cannot build."""
    if not isinstance(n_stages, int) or isinstance(n_stages, bool) or n_stages < 1:
        raise ShapingError(f"n_stages must be a positive integer, got {n_stages!r}")
    seen: set[tuple[int, int]] = set()
    for link in links:
        if not isinstance(link, LinkSpec):
            raise ShapingError(f"expected LinkSpec, got {type(link).__name__}: {link!r}")
        for end in ("src", "dst"):
            stage = getattr(link, end)
            if not isinstance(stage, int) or isinstance(stage, bool) or not 0 <= stage < n_stages:
                raise ShapingError(f"link {link.name}: {end} must be a stage in 0..{n_stages - 1}, got {stage!r}")
        if link.src == link.dst:
            raise ShapingError(f"link {link.name}: a stage cannot link to itself")
        if (link.src, link.dst) in seen:
            raise ShapingError(f"link {link.name} is given twice")
        seen.add((link.src, link.dst))
        _check_number(link, "delay_ms", link.delay_ms, 0.0, MAX_DELAY_MS)
        _check_number(link, "jitter_ms", link.jitter_ms, 0.0, MAX_DELAY_MS)
        _check_number(link, "loss_pct", link.loss_pct, 0.0, 100.0)
        _check_number(link, "rate_mbit", link.rate_mbit, 0.0, MAX_RATE_MBIT)
        if 0 < link.rate_mbit * BYTES_PER_MBIT < 1:
            raise ShapingError(f"link {link.name}: rate_mbit {link.rate_mbit!r} is below 1 byte/s")
        if not isinstance(link.seed, int) or isinstance(link.seed, bool) or not 0 <= link.seed < 2**64:
            raise ShapingError(f"link {link.name}: seed must be an integer in [0, 2**64), got {link.seed!r}")


def plan_netem(link: LinkSpec, namespace: str, ifname: str) -> NetemPlan:
    """The root netem qdisc for one directed link (see the module docstring for the choices)."""
    if link.rate_mbit > 0:
        rate_bytes_s, fifo_only = round(link.rate_mbit * BYTES_PER_MBIT * HEADER_RATE_FACTOR), False
    elif link.jitter_ms > 0:
        rate_bytes_s, fifo_only = round(FIFO_RATE_MBIT * BYTES_PER_MBIT), True
    else:
        rate_bytes_s, fifo_only = 0, False
    return NetemPlan(
        link=link,
        namespace=namespace,
        ifname=ifname,
        handle=ROOT_HANDLE,
        parent=TC_H_ROOT,
        latency_ns=round(link.delay_ms * 1e6),
        jitter_ns=round(link.jitter_ms * 1e6),
        loss_pct=float(link.loss_pct),
        limit_packets=limit_packets(link.delay_ms, link.jitter_ms, link.rate_mbit),
        rate_bytes_s=rate_bytes_s,
        rate_is_fifo_only=fifo_only,
        distribution=JITTER_DISTRIBUTION if link.jitter_ms > 0 else None,
        seed=link.seed,
    )


def plan_network(links: list[LinkSpec], n_stages: int, run_id: str, transport: str = "tuned") -> NetworkPlan:
    """Namespaces, veth pairs, addresses and netem qdiscs for `links` (any directed graph on n_stages); `transport`
    "tuned" tunes each namespace's TCP into a warm long-haul connection, "kernel" leaves its defaults (but Reno)."""
    links = list(links)
    validate(links, n_stages)
    if transport not in ("tuned", "kernel"):
        raise ShapingError(f"transport must be \"tuned\" or \"kernel\", got {transport!r}")
    tuned = transport == "tuned"
    prefix = run_prefix(run_id)
    namespaces = tuple(NamespacePlan(stage, namespace_name(prefix, stage),
                                     NAMESPACE_SYSCTLS if tuned else KERNEL_SYSCTLS) for stage in range(n_stages))
    pairs = sorted({(min(l.src, l.dst), max(l.src, l.dst)) for l in links})
    subnets = ADDRESS_POOL.subnets(new_prefix=SUBNET_PREFIXLEN)
    capacity = 2 ** (SUBNET_PREFIXLEN - ADDRESS_POOL.prefixlen)
    if len(pairs) > capacity:
        raise ShapingError(f"{len(pairs)} stage pairs need more than the {capacity} /{SUBNET_PREFIXLEN} "
                           f"subnets of {ADDRESS_POOL}")
    veths = []
    for (a, b), subnet in zip(pairs, subnets):
        hosts = list(subnet.hosts())
        veths.append(VethPlan(
            a=a, b=b,
            namespace_a=namespaces[a].name, namespace_b=namespaces[b].name,
            ifname_a=veth_name(prefix, a, b), ifname_b=veth_name(prefix, b, a),
            address_a=str(hosts[0]), address_b=str(hosts[1]),
            prefixlen=SUBNET_PREFIXLEN, subnet=str(subnet), initial_window=INITIAL_WINDOW_SEGMENTS if tuned else None,
        ))
    by_pair = {(v.a, v.b): v for v in veths}
    qdiscs, acks = [], []
    peer_hosts = {}
    directed = {(l.src, l.dst) for l in links}
    for link in sorted(links, key=lambda l: (l.src, l.dst)):
        veth = by_pair[(min(link.src, link.dst), max(link.src, link.dst))]
        namespace, ifname, _ = veth.end(link.src)
        qdiscs.append(plan_netem(link, namespace, ifname))
        peer_hosts[(link.src, link.dst)] = veth.end(link.dst)[2]
        if not tuned and (link.dst, link.src) not in directed:
            namespace, ifname, _ = veth.end(link.dst)
            acks.append(plan_netem(LinkSpec(link.dst, link.src, link.delay_ms, seed=link.seed), namespace, ifname))
    return NetworkPlan(prefix, n_stages, namespaces, tuple(veths), tuple(qdiscs), peer_hosts, transport, tuple(acks))
