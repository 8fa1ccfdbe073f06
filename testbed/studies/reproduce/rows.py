"""The published deployments (../shared/PUBLISHED.md) the testbed can express, each as a ring built from what its
source states, and the ones it cannot, with why. A source that leaves the compute out gives it through a row of its
own: the same system on a link whose latency is all but zero, C = 1 / rate - T_ring."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedRow:
    """One published measurement, and the ring that expresses it."""

    number: int  # the row of PUBLISHED.md
    system: str
    setup: str
    published_tok_s: float  # single-stream decode (the figure as published, or its midpoint where it is a range)
    source: str
    nodes: int  # stages of the ring
    rtt_ms: float  # the link's round trip, as published (a range's midpoint); a hop's one-way is half of it
    compute_tok_s: float = 0.0  # the compute comes from this rate, published on a ring of `compute_hops` hops ...
    compute_hops: int = 0
    compute_rtt_ms: float = 0.0  # ... of this round trip: C = 1 / compute_tok_s - compute_hops x compute_rtt_ms / 2
    rate_mbit: float = 0.0  # the link's rate, where the source states it (0: not limiting)
    d_model: int = 0  # the hidden state's width, where the source names the model (0: not stated)
    published_range: tuple[float, float] = (0.0, 0.0)  # where the source gives a range (0, 0: a single figure)
    assumed: str = ""  # what the source leaves out and how it was filled in
    why_apart: str = ""  # what the source's system does that the physics leaves out, where they differ


ROWS = (
    PublishedRow(1, "exo", "4 x Mac Studio M3 Ultra, Thunderbolt 5 with RDMA", 25.4, "exo issue #2295", nodes=4,
                 rtt_ms=(0.38 + 0.95) / 2, compute_tok_s=25.4, compute_hops=4, compute_rtt_ms=(0.38 + 0.95) / 2, assumed="the model is not named: C from this row (1 / 25.4 - T_ring)"),
    PublishedRow(2, "exo", "the same 4 nodes and model, TCP over Wi-Fi", 8.7, "exo issue #2295", nodes=4,
                 rtt_ms=(4.9 + 54) / 2, compute_tok_s=25.4, compute_hops=4, compute_rtt_ms=(0.38 + 0.95) / 2,
                 assumed="RTT 4.9-54 ms: its midpoint; C from row 1",
                 why_apart="Wi-Fi's round trip is a spread (4.9-54 ms), not its midpoint: the rate falls with the mean "
                           "hop time, which a contended radio link pushes up; TCP's recovery from Wi-Fi losses adds "
                           "whole RTOs"),
    PublishedRow(4, "exo", "a cluster at ~24 tok/s over Thunderbolt falling back to Tailscale", (2.5 + 7.9) / 2,
                 "exo issue #1723", nodes=2, rtt_ms=(40 + 70) / 2, compute_tok_s=24.0, compute_hops=2, compute_rtt_ms=0.5, published_range=(2.5, 7.9),
                 assumed="nodes not stated: 2; C from the 24 tok/s it had over Thunderbolt (< 1 ms); Tailscale's "
                         "40-70 ms RTT: its midpoint",
                 why_apart="Tailscale relays (DERP) and WireGuard add per-packet cost beyond the RTT, and exo's "
                           "ring may hold more nodes than assumed"),
    PublishedRow(5, "llama.cpp RPC", "TinyLlama 1.1B F16, one CUDA GPU, local", 63.0, "llama.cpp PR #6829",
                 nodes=1, rtt_ms=0.0, compute_tok_s=63.0, d_model=2048, assumed="C = 1 / 63"),
    PublishedRow(6, "llama.cpp RPC", "the same through an RPC server on localhost", 60.0, "llama.cpp PR #6829",
                 nodes=2, rtt_ms=0.05, compute_tok_s=63.0, d_model=2048,
                 assumed="loopback RTT 50 us; C from row 5; the hidden state in f32 (llama.cpp's activations)",
                 why_apart="llama.cpp's RPC backend makes several calls per token (set tensor, graph compute, get "
                           "tensor), each a round trip, and serializes the graph: its per-token cost is the "
                           "protocol's, not the link's"),
    PublishedRow(7, "llama.cpp RPC", "the same through an RPC server over gigabit Ethernet", 42.0,
                 "llama.cpp PR #6829", nodes=2, rtt_ms=0.2, rate_mbit=1000.0, compute_tok_s=63.0, d_model=2048,
                 assumed="a gigabit LAN's RTT: 0.2 ms; C from row 5",
                 why_apart="the RPC protocol's round trips per token (row 6) now each cost a LAN round trip, and "
                           "the graph and tensors it ships per call cross the wire too"),
)

NOT_EXPRESSED = (
    (3, "exo, 16 concurrent streams", "the per-stream batching cost of the Macs is not stated (the streams "
                                      "aggregate needs it)"),
    (8, "distributed-llama, TP over 1 GbE", "the per-node compute and node count are not in the row; the testbed's "
                                            "TP mode runs the byte model only"),
    (9, "distributed-llama, 70B on 8 Raspberry Pi 4B", "tensor parallel with a quantized model's compute on the Pi "
                                                       "not stated"),
    (10, "prima.cpp vs llama.cpp/exo/dllama", "four systems' scheduling over Wi-Fi; devices and links not stated"),
    (11, "Petals, public swarm", "a swarm's servers, links and load vary and are not stated"),
    (12, "SpecEdge", "draft and verify times, K and the link are not stated (the dsd study measures the same "
                     "trade-off with them given)"),
    (13, "distributed-llama, 8B Q40 TP on 4 x Raspberry Pi 5", "its transfer time (75.34 ms for 1.6 MB a token, "
                                                               "where 1 Gbit/s carries it in 13 ms) is the Pis' "
                                                               "sync protocol, not stated as links; the TP mode runs "
                                                               "the byte model only"),
    (14, "distributed-llama, 8B Q40 TP on 2 x Raspberry Pi 5", "as row 13 (56.39 ms for 544 kB a token)"),
    (15, "llama.cpp RPC, round trips a token", "a protocol's count of round trips, not a rate: the probe of the "
                                               "deployment search (issue 53) is to measure it"),
)
