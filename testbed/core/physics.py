"""The seed papers' closed forms, as pure functions (seconds, bytes, tokens/s)."""

from __future__ import annotations

import math


def b_hop(n_tok: int, d_model: int, bytes_per_elem: int) -> int:
    """Eq. 1: bytes of the hidden state crossing one pipeline cut."""
    if n_tok < 0 or d_model <= 0 or bytes_per_elem <= 0:
        raise ValueError(f"b_hop needs n_tok >= 0, d_model > 0, bytes_per_elem > 0, got {n_tok}, {d_model}, {bytes_per_elem}")
    return n_tok * d_model * bytes_per_elem


def wall_rate(compute_s: float, t_ring_s: float) -> float:
    """Eq. 2: single-stream decode rate r = 1 / (C + T_ring), tokens/s."""
    lap = compute_s + t_ring_s
    if lap <= 0:
        raise ValueError(f"C + T_ring must be positive, got {lap}")
    return 1.0 / lap


def ttft(prefill_compute_s: float, t_ring_s: float, prompt_bytes_per_hop: float = 0.0,
         bandwidth_bytes_s: float = math.inf, n_hops: int = 1) -> float:
    """Eq. 5: time to first token, C_prefill(P) + T_ring, plus the prompt's serialization over each hop."""
    xmit = 0.0 if math.isinf(bandwidth_bytes_s) else n_hops * prompt_bytes_per_hop / bandwidth_bytes_s
    return prefill_compute_s + t_ring_s + xmit


def gamma(alpha: float, k: int) -> float:
    """Eq. 6: expected tokens per speculation round, (1 - a^(K+1)) / (1 - a)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def gamma_mean(alpha: float, rounds_at: dict[int, int]) -> float:
    """Eq. 6 averaged over a run's rounds: Gamma(alpha, K) weighted by the rounds taken at each K (alpha capped at 1,
    as an estimate may exceed it)."""
    return sum(n * gamma(min(alpha, 1.0), k) for k, n in rounds_at.items()) / sum(rounds_at.values())


def spec_round_s(k: int, draft_s: float, compute_s: float, t_ring_s: float) -> float:
    """Eq. 7: one round = K local draft steps + one target traversal."""
    return k * draft_s + compute_s + t_ring_s


def spec_rate(alpha: float, k: int, draft_s: float, compute_s: float, t_ring_s: float) -> float:
    """Eq. 7/boxed: r_spec = Gamma(a, K) / (K c_d + C + T_ring)."""
    return gamma(alpha, k) / spec_round_s(k, draft_s, compute_s, t_ring_s)


def overlap_step_s(k: int, draft_s: float) -> float:
    """Overlapped speculation (agents.modes.overlap): the draft time between two rounds of a run, (K + 1) c_d (the
    guess of the target's next token, then the next K drafts)."""
    return (k + 1) * draft_s


def overlap_run_s(n: int, k: int, draft_s: float, lap_s: float, window: int) -> float:
    """A run of n overlapped rounds (verdict to verdict: every round a hit but the last), from the verdict that
    starts it to its last round's verdict. L = C + T_ring is a round's lap, send to verdict; delta = (K + 1) c_d.

    The first round leaves after K c_d; round j after max(its drafting, the verdict of round j - W) (at most W in
    flight), which solves to send_j = q max(L, W delta) + m delta with j - 1 = q W + m. So the run lasts
    K c_d + q max(L, W delta) + m delta + L for n - 1 = q W + m. Holds while every stage's work for a round is
    under delta (no round waits at a stage behind another: OverlapSummary.queue_free).
    """
    if n < 1 or window < 1:
        raise ValueError(f"a run has n >= 1 rounds and a window >= 1, got n={n}, window={window}")
    step = overlap_step_s(k, draft_s)
    q, m = divmod(n - 1, window)
    return k * draft_s + q * max(lap_s, window * step) + m * step + lap_s


def overlap_rate(gamma_k: float, hit: float, k: int, draft_s: float, compute_s: float, t_ring_s: float,
                 window: int) -> float:
    """Expected tok/s of overlapped speculation: Gamma / ((1 - h) E[run time]) for i.i.d. rounds of hit chance h.

    A run's rounds N ~ Geometric (P(N = n) = h^(n-1) (1 - h)), so E[tokens of a run] = Gamma / (1 - h) (Wald) and,
    from overlap_run_s with N - 1 = qW + m, E[q] = h^W / (1 - h^W), E[m] = h / (1 - h) - W h^W / (1 - h^W):
        E[run] = K c_d + L + max(L, W delta) E[q] + delta E[m].
    h = 0 is synchronous speculation, Gamma / (K c_d + C + T_ring); h -> 1 the window's or the draft's pace,
    Gamma W / max(L, W delta).
    """
    if not 0.0 <= hit <= 1.0:
        raise ValueError(f"a hit chance is in [0, 1], got {hit}")
    lap = compute_s + t_ring_s
    step = overlap_step_s(k, draft_s)
    if hit >= 1.0:
        return gamma_k * window / max(lap, window * step)
    hw = hit ** window
    runs_q = hw / (1 - hw)
    runs_m = hit / (1 - hit) - window * runs_q
    run = k * draft_s + lap + max(lap, window * step) * runs_q + step * runs_m
    return gamma_k / ((1 - hit) * run)


def overlap_bound(gamma_k: float, hit: float, k: int, draft_s: float, compute_s: float, t_ring_s: float) -> float:
    """overlap_rate as the window grows without end: Gamma / ((1 - h)(K c_d + C + T_ring) + h (K + 1) c_d). Every
    miss still costs a whole synchronous round; only the hits' rounds shrink to the draft's pace."""
    return gamma_k / ((1 - hit) * spec_round_s(k, draft_s, compute_s, t_ring_s) + hit * overlap_step_s(k, draft_s))


def best_k(alpha: float, draft_s: float, compute_s: float, t_ring_s: float, k_max: int = 64) -> tuple[int, float]:
    """K* maximizing r_spec over 1..k_max, with its rate (ties go to the smaller K)."""
    best = max(range(1, k_max + 1), key=lambda k: (spec_rate(alpha, k, draft_s, compute_s, t_ring_s), -k))
    return best, spec_rate(alpha, best, draft_s, compute_s, t_ring_s)


def tp_pp_latency_ratio(n_layers: int, n_nodes: int) -> float:
    """Eq. 8: lower bound of TP/PP critical-path latency per token, 4L/N."""
    if n_layers <= 0 or n_nodes <= 0:
        raise ValueError(f"need n_layers > 0 and n_nodes > 0, got {n_layers}, {n_nodes}")
    return 4.0 * n_layers / n_nodes


def tree_rate(expected_tokens: float, hop_latencies_s: list[float], n_nodes_tree: int, hidden_bytes: int,
              bandwidths_bytes_s: list[float], compute_s: float, return_s: float = 0.0) -> float:
    """Seed 001: tok/s = L(n) / T_lap(n), T_lap = sum[l_i + n s_h / BW_i] + compute(n) + T_return."""
    lap = sum(l + n_nodes_tree * hidden_bytes / bw for l, bw in zip(hop_latencies_s, bandwidths_bytes_s, strict=True))
    return expected_tokens / (lap + compute_s + return_s)


def survival_gamma(survival: list[float], k: int, alpha_tail: float) -> float:
    """Expected tokens per round from a measured survival curve: 1 + sum_{i<K} S_i.

    S_i is the probability that drafts 0..i are all accepted (seed 000's Gamma assumes S_i = a^(i+1), i.i.d.
    rejections; a trained draft's rejections are correlated, so its S_i falls faster or slower than that).
    Past the measured positions the curve is extended i.i.d. at `alpha_tail`: S_i = S_last * a^(i - last).
    """
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    total, last = 1.0, 1.0
    for i in range(k):
        last = survival[i] if i < len(survival) else last * alpha_tail
        total += last
    return total


def best_k_survival(survival: list[float], alpha_tail: float, draft_s: float, compute_s: float, t_ring_s: float,
                    k_max: int = 64) -> tuple[int, float]:
    """K* maximizing survival_gamma / (K c_d + C + T_ring) over 1..k_max, with its rate."""
    def rate(k: int) -> float:
        return survival_gamma(survival, k, alpha_tail) / spec_round_s(k, draft_s, compute_s, t_ring_s)

    best = max(range(1, k_max + 1), key=lambda k: (rate(k), -k))
    return best, rate(best)


def survival_all(survival: list[float], k: int, alpha_tail: float) -> float:
    """S_{K-1}: the chance that all K drafts of a round are accepted, from a survival curve extended by alpha_tail."""
    last = 1.0
    for i in range(k):
        last = survival[i] if i < len(survival) else last * alpha_tail
    return last


def best_k_overlap(survival: list[float], alpha_tail: float, guess: float, draft_s: float, lap_s: float, window: int,
                   k_max: int = 64) -> tuple[int, float]:
    """K* of overlapped speculation: overlap_rate with Gamma from the survival curve and h = S_{K-1} x guess (the
    guess of the target's next token right, given all K accepted), over 1..k_max, with its rate. A short K keeps h
    high, so K* sits below synchronous speculation's."""
    def rate(k: int) -> float:
        return overlap_rate(survival_gamma(survival, k, alpha_tail), min(survival_all(survival, k, alpha_tail) * guess,
                                                                          1.0 - 1e-12), k, draft_s, lap_s, 0.0, window)

    best = max(range(1, k_max + 1), key=lambda k: (rate(k), -k))
    return best, rate(best)


def survival_tail(survival: list[float], alpha: float) -> float:
    """Per-position acceptance to extend a measured survival curve with: its last conditional step, else alpha."""
    if len(survival) >= 2 and survival[-2] > 0:
        return min(1.0, survival[-1] / survival[-2])
    return alpha


SURVIVAL_MIN_ROUNDS = 8  # a position's acceptance is trusted from this many rounds that drafted it


def survival_curve(drafted_at: list[int], accepted_at: list[int], min_rounds: int = SURVIVAL_MIN_ROUNDS) -> list[float]:
    """S_i = accepted_at[i] / drafted_at[i] over the leading positions drafted in at least `min_rounds` rounds."""
    curve = []
    for drafted, accepted in zip(drafted_at, accepted_at):
        if drafted < min_rounds:
            break
        curve.append(accepted / drafted)
    return curve


def streams_rates(n_streams: int, stage_s: list[float], t_ring_s: float, batching: str = "none",
                  per_token_s: list[float] | None = None) -> tuple[float, float, list[float]]:
    """Seed 000, "Regimes": M streams in flight on one ring -> (per-stream tok/s, aggregate tok/s, utilization
    of each stage).

    Without batching every stage serves one frame at a time: stage i is a server of service time c_i, and M
    frames circulate through the N servers and the N hops (pure delays, T_ring in all). A frame alone in the
    ring laps in C + T_ring (C = sum c_i), so M frames carry M / (C + T_ring) tokens per second while the
    slowest stage has time for them; it serves at most 1 / c_max. For deterministic service times and
    delays the closed cyclic network settles exactly at the smaller of the two (the frames form a train
    spaced by c_max once the pipe is full):

        aggregate = min(M / (C + T_ring), 1 / c_max),   per-stream = aggregate / M,   U_i = aggregate * c_i.

    With continuous batching a stage runs everything queued as one forward pass costing c_i + p_i (b - 1)
    (p_i = per_token_ms: nearly flat in b for memory-bound decode). The streams mode starts the decode as
    one convoy of all M frames, and a convoy stays together (each stage receives it as one burst), so a lap
    costs every stage its batched cost once:

        lap = sum_i [c_i + p_i (M - 1)] + T_ring,   aggregate = M / lap,   per-stream = 1 / lap,
        U_i = [c_i + p_i (M - 1)] / lap.

    Every stage is idle while the convoy is elsewhere; the bottleneck's batched cost bounds what any
    schedule could reach, M / max_i [c_i + p_i (M - 1)] (batching_ceiling).
    """
    if n_streams < 1 or not stage_s:
        raise ValueError(f"need at least one stream and one stage, got {n_streams}, {len(stage_s)}")
    if batching == "none":
        cycle = sum(stage_s) + t_ring_s
        aggregate = min(n_streams / cycle, 1.0 / max(stage_s))
        return aggregate / n_streams, aggregate, [aggregate * c for c in stage_s]
    if batching == "continuous":
        per_token_s = per_token_s or [0.0] * len(stage_s)
        batched = [c + p * (n_streams - 1) for c, p in zip(stage_s, per_token_s, strict=True)]
        lap = sum(batched) + t_ring_s
        return 1.0 / lap, n_streams / lap, [b / lap for b in batched]
    raise ValueError(f"batching must be 'none' or 'continuous', got {batching!r}")


def batching_ceiling(n_streams: int, stage_s: list[float], per_token_s: list[float] | None = None) -> float:
    """The most tokens/s M streams can get through the bottleneck stage when it batches all of them."""
    per_token_s = per_token_s or [0.0] * len(stage_s)
    return n_streams / max(c + p * (n_streams - 1) for c, p in zip(stage_s, per_token_s, strict=True))


def ttft_hops(prefill_compute_s: float, hop_latencies_s: list[float], hop_bytes: list[int],
              hop_rates_bytes_s: list[float]) -> float:
    """Eq. 5 with Eq. 1 per hop: TTFT = C_prefill(P) + sum_i [l_i + B_i / W_i] (B_i: the prompt's hidden
    state crossing hop i, P x d_model x bytes plus framing; W_i: the hop's rate, inf when unlimited)."""
    xmit = sum(0.0 if math.isinf(w) else b / w for b, w in zip(hop_bytes, hop_rates_bytes_s, strict=True))
    return prefill_compute_s + sum(hop_latencies_s) + xmit


def pipelined_completion(service_s: list[list[float]]) -> float:
    """A deterministic tandem line: jobs k = 0.. (all ready at 0, in order) through FIFO servers j = 0.. in
    series, job k taking service_s[k][j] at server j. Departure D[k][j] = max(D[k-1][j], D[k][j-1]) + s[k][j]
    (a job starts at a server once it left the previous one and the previous job left this one); returns
    when the last job leaves the last server. One job: the sum of its service times."""
    previous: list[float] = []
    for row in service_s:
        current, ready = [], 0.0
        for j, s in enumerate(row):
            ready = max(ready, previous[j] if previous else 0.0) + s
            current.append(ready)
        previous = current
    return previous[-1] if previous else 0.0


def ttft_pipelined(service_s: list[list[float]], t_ring_s: float, head_s: float = 0.0) -> float:
    """Chunked prefill, chunks sent back to back (Sarathi-style, pipelined over the stages): TTFT = the last
    chunk through the tandem line of stage computes and hop serializations (pipelined_completion; service_s[k]
    alternates stage i's compute of chunk k and hop i's serialization of it), plus the hops' propagation
    delays (pure delays, which never hold a chunk back from the next), plus the head on the last chunk.
    With one chunk it is Eq. 5: C_prefill(P) + T_ring + serialization."""
    return pipelined_completion(service_s) + t_ring_s + head_s


def tp_token_s(link_s: dict[tuple[int, int], float], n_ranks: int, n_layers: int, segment_s: float,
               head_s: float = 0.0, allreduce: str = "ring", tokens: int = 16) -> float:
    """Tensor parallelism over links (seed 000, Eq. 8 made exact for an all-reduce algorithm): the steady-state
    time of one token when each of n_ranks ranks computes 2 L segments (segment_s each), every segment ending in
    an all-reduce, then the head (head_s). link_s[(i, j)]: one message's time from rank i to rank j (one-way delay
    plus its serialization).

    The ranks' clocks t_i evolve as a max-plus system (a rank waits for what it needs, then sends at once):
        ring (2 (N - 1) steps):  t_i <- max(t_i, t_{i-1} + l_{i-1,i})   reduce-scatter, then all-gather
        all-to-all (one step):   t_i <- max(t_i, max_j t_j + l_{j,i})
    On a uniform ring of one-way l that is 2 (N - 1) l a collective, 4 L (N - 1) l a token: 4 L (N - 1) / N
    times PP's N l, above Eq. 8's 4 L / N (which counts a collective as one round trip, 2 l); all-to-all is
    2 L l a token, 2 L / N times PP's: a direct exchange is one one-way latency, below the round trip the
    bound assumes. Returns the mean over `tokens` tokens after the first (the ranks start together).
    """
    if n_ranks < 2 or n_layers < 1 or tokens < 2:
        raise ValueError(f"need n_ranks >= 2, n_layers >= 1, tokens >= 2, got {n_ranks}, {n_layers}, {tokens}")
    if allreduce not in ("ring", "all-to-all"):
        raise ValueError(f"allreduce must be 'ring' or 'all-to-all', got {allreduce!r}")
    n = n_ranks
    t = [0.0] * n
    first_end = 0.0
    for token in range(tokens):
        for _segment in range(2 * n_layers):
            t = [x + segment_s for x in t]
            if allreduce == "ring":
                for _step in range(2 * (n - 1)):
                    t = [max(t[i], t[i - 1] + link_s[((i - 1) % n, i)]) for i in range(n)]
            else:
                t = [max([t[i]] + [t[j] + link_s[(j, i)] for j in range(n) if j != i]) for i in range(n)]
        t = [x + head_s for x in t]
        if token == 0:
            first_end = t[0]
    return (t[0] - first_end) / (tokens - 1)


def dsd_round_s(placement: str, k: int, draft_s: float, verify_s: float, rtt_s: float = 0.0,
                p_hit: float = 0.0, waits_s: tuple[float, ...] = ()) -> float:
    """Seeds 002/003: one speculation round (K drafts, one verification of them) by where the draft runs.

        colocated        K t_d + t_v                      draft and target on the server; the client's RTT
                                                          is paid once per request, not per round
        edge (sync)      K t_d + RTT + t_v                the drafts go up, the verdict comes back
        edge pipelined   p max(RTT + t_v, (K + 1) t_d) + (1 - p)(K t_d + RTT + t_v + w)

    Pipelined: while a round is verified the edge drafts its guess of the target's next token and K more; with
    probability p (all K accepted and the guess right, measured) they are the next round, sent as soon as both
    the verdict and they are there; otherwise the edge drafts afresh after the verdict, once the draft step in
    flight when the verdict landed is done (w: the rest of that step, 0 once all K + 1 steps are). So pipelining beats
    co-location only while RTT < p K t_d (for RTT + t_v >= (K + 1) t_d): the round trip must hide in the drafting
    window, seed 002's claim with the hit rate made explicit. Tokens per round are Gamma in every placement.

    w is a sawtooth in the wait: it jumps from 0 to a whole t_d where RTT + t_v crosses a multiple of t_d, so on
    such an edge a wait a microsecond long or short decides it. `waits_s`, the waits the edge measured (its missed
    rounds': send to verdict), give w as its mean over them (in_flight_rest_s); none: the sawtooth at RTT + t_v.
    """
    if placement == "colocated":
        return k * draft_s + verify_s
    if placement == "edge":
        return k * draft_s + rtt_s + verify_s
    if placement == "pipelined":
        wait = rtt_s + verify_s
        rests = [in_flight_rest_s(w, draft_s, k + 1) for w in waits_s or (wait,)]
        waste = sum(rests) / len(rests)
        return p_hit * max(wait, (k + 1) * draft_s) + (1 - p_hit) * (k * draft_s + wait + waste)
    raise ValueError(f"placement must be colocated, edge or pipelined, got {placement!r}")


def in_flight_rest_s(wait_s: float, step_s: float, steps: int) -> float:
    """The rest of the draft step in flight when a verdict lands `wait_s` after drafting began: the next multiple
    of `step_s` minus the wait; 0 once all `steps` are done (a wait past them), or without drafting."""
    if step_s <= 0:
        return 0.0
    n = math.ceil(wait_s / step_s - 1e-9)
    return n * step_s - wait_s if n <= steps else 0.0


def pipelined_crossover_rtt_s(k: int, draft_s: float, verify_s: float, p_hit: float, step_s: float = 1e-4) -> float:
    """The first RTT (scanning up from 0 in step_s) at which a pipelined edge round is no shorter than a co-located
    one: below it pipelining wins (0: it never does). The in-flight step makes the pipelined round a sawtooth in
    the RTT, hence a scan rather than a root."""
    target = dsd_round_s("colocated", k, draft_s, verify_s)
    rtt = 0.0
    while rtt <= 2 * target:
        if dsd_round_s("pipelined", k, draft_s, verify_s, rtt, p_hit) >= target:
            return rtt
        rtt += step_s
    return rtt


def capacity_multiplier(k: int, draft_s: float, verify_s: float) -> float:
    """Seed 002: a saturated server verifying only (the drafts offloaded to the clients) sustains
    (K t_d + t_v) / t_v = 1 + K t_d / t_v times the clients it sustains drafting and verifying, at the same rate."""
    return 1.0 + k * draft_s / verify_s


def dsd_beats_ar_below_rtt_s(gamma_: float, ar_token_s: float, k: int, draft_s: float, verify_s: float) -> float:
    """Seed 002's bounded window: synchronous DSD beats cloud autoregressive decoding (t_ar a token) per token,
    (K t_d + RTT + t_v) / Gamma < t_ar, only below RTT = Gamma t_ar - K t_d - t_v (a window that closes for a fast
    target, a low acceptance or a long draft). Negative: never."""
    return gamma_ * ar_token_s - k * draft_s - verify_s
