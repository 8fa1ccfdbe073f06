"""The serve mode's prediction beside every measured figure: a closed-form queueing model of the ring as a server.

The policy modelled (the serve runner's). A lap of b running requests costs L(b) = C + T_ring + P (b - 1) (C: the
stages' single-token passes, P: their per-extra-token costs). Running requests move as one convoy: each lap gives
each of them one token. A request arriving while fewer than c (the streams cap, and max_concurrency) are in the ring
is admitted at once: its prefill laps the ring as its own frame, its first token comes after f(P) (the solo TTFT,
Eq. 5), then it joins the convoy at the convoy's next departure (at once when there is no convoy). Otherwise it waits,
FIFO, for a slot; a slot frees when a request's last token is sampled. A request of n tokens holds its slot for
S = f(P) + w + (n - 1) tau, with w its join wait and tau its mean lap.

Light load (lambda -> 0): TTFT = f(P) and TPOT = L(1) = C + T_ring, exactly.

The closed forms. Below the knee, Little's law on the convoy: the others decoding beside a request number
m = lambda E[n - 1] tau on average (M/G/inf), and L is linear in b, so the mean lap is
    tau = L(1) + P m = L(1) / (1 - P lambda E[n - 1]).
At the knee c slots are always busy: a slot frees at a lap's end and the next request takes it at once, so its
first token comes f after a departure and it joins ceil(f / tau) laps later; it holds the slot
(n - 1 + ceil(f / tau)) tau, phase-locked to the laps, and with the others decoding beside it
(c - 1) E[(n - 1) tau] / E[S],
    tau = L(1) + P (c - 1) E[n - 1] tau / E[S],    S = (n - 1 + ceil(f / tau)) tau    (S = f for n = 1)
is a small fixed point; the saturation throughput is mu = c / E[S] requests/s (knee_rate), a little under the
streams ceiling c / L(c) (saturation_output_tok_s: every slot decoding) since a slot spends ceil(f / tau) laps of
every request on its prefill and join. These give the summary figures (the knee, the regime, the mean lap).

The run, replayed through them (the figures). A stationary queue is the wrong reference for a run: a run starts
empty and lasts N requests, and near the knee it has not built up the stationary wait (which diverges there); at
90-99% of the knee a 100-request run's median request does not wait at all. So the model takes the workload's own
arrivals and lengths (the same seed draws the same ones as the run) and, for each request:
- its admission: the Kiefer-Wolfowitz recursion of a FIFO queue of c slots, in arrival order: a request takes the
  slot that frees first, at max(its arrival, that slot's free time), and holds it S = f + w + (n - 1) tau_k
  (a heap of c free times, O(N log c)); above the knee the same recursion gives the fluid growth, the request
  arriving at t waiting about (lambda / mu - 1) t;
- its join wait w: phase-locked (as at the knee) if it came from the queue; else, if a convoy is decoding when its
  first token comes, the lap's residual, a phase in [0, 1) of its lap (stratified over the requests, seeded); else 0;
- its mean lap tau_k = L(1) + P m_k + E_k, with m_k the mean number of the others decoding over its own decode life
  (the integral of the lives' count, piecewise linear between their edges), and E_k the prompts' passes it meets
  (where RingModel.prompt_passes_s gives them): a prompt's pass of f_s on stage s is under way when the convoy comes
  to that stage with probability f_s / tau, and then holds it for half of f_s on average, so each prompt admitted
  during the request's life D_k = K tau_k costs its laps sum_s f_s^2 / (2 tau) in all: E_k = sum_j sum_s f_s,j^2 /
  (2 D_k). It matters where a stage's pass over a prompt costs about what its decode pass does (memory-bound
  roofline stages) and prompts come every lap or so; on the geo ring (C 33 ms, T_ring 280 ms, 1.5 req/s) it is
  0.1% of a lap. It leaves out the prompts' own wait behind the convoy's passes (their TTFT).
The three depend on each other: REPLAY_ROUNDS rounds of the fixed point, from every lap at tau. Then TTFT =
f + wait, TPOT = tau_k + w / (n - 1), E2EL = TTFT + (n - 1) TPOT, and the figures are the requests' percentiles as
the measured ones are taken. No laps are simulated: one pass of the recursion and a few array operations a round
(75 ms for the 6,000 requests of a 10-minute trace at 10 req/s).

Light load (lambda -> 0): no wait, no convoy: TTFT = f(P) and TPOT = L(1) = C + T_ring, exactly.

Speculation while serving (decode.speculate = K). Every running request drafts K tokens a lap and the lap verifies
K + 1 positions of each, so the lap is the same form with C = K c_d + the stages' passes over K + 1 positions and P
what one more request's K + 1 positions (and drafts) add; each request keeps Gamma tokens a lap on average
(tokens_per_lap). A request of n tokens rides the convoy N laps, about (n - 1) / Gamma: its own where they are known
(a run's, or drawn_laps: lap_law's quantiles, the acceptance's spread; lap_law counts i.i.d. acceptance lap by lap and
drops the last lap's surplus, so a short output keeps fewer than Gamma a lap), else (n - 1) / Gamma. Everything
above holds with N in place of n - 1 (the slot's holding, the others decoding, the knee), and TPOT = (N tau_k + w) /
(n - 1): light load TPOT = L(1) / Gamma, the streams ceiling c Gamma / L(c). Checked against the same simulation
run for each request's laps (p50 and p90 within 1%; the mean laps alone miss the p90 TPOT by 10%) and against the
virtual serve run with a calibrated draft (tests/test_serve_mode.py: p50 TTFT and TPOT within 1%).

Checked against an event-by-event simulation of the policy (tests/test_serve_queueing.py: a geo ring of C = 30 ms,
P = 1 ms, T_ring = 200 ms, c = 64): Poisson arrivals at 10-99% of the knee, 1,500 requests, 128- and 8-token
outputs: p50 TTFT and TPOT within 1.1%, p90 TPOT and p50 E2EL within 2%, p90 TTFT within 8%; runs of 100 requests
at 50-99% of the knee within 1.4% at p50 and p99; gamma arrivals (b = 0.5, 0.25: bursts that fill the cap below
the knee) within 1% at p50 and p99. What it leaves out: the lap's exact phase (a join's wait is a stratified draw,
not the run's lap boundary), the laps' own variation within a request's life (its TPOT is its mean lap), and a
prompt's wait behind the convoy's passes and the other prompts at each stage (its TTFT: on two 4090s holding
Llama-3.1-8B at 20-40 req/s, 32-token prompts, the run's p50 TTFT is 28-67 ms against the model's 18.6, while its
p50 TPOT is within 1.3% at 5-40 req/s in a run of 300 requests, -4.6% at 60, and -5.4% at 40 with another seed;
without E_k it was 1.5-20% short; tests/test_serve_mode.py). Where the prompts alone would fill a stage (their passes' share
over 1 at the knee's rate) the model has no steady lap, and says nothing of it: the knee counts slots, not stages.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agents.modes.serve.facts import Prediction
from agents.modes.serve.requests import RequestSpec
from agents.modes.serve.workload import WorkloadSpec, generate
from testbed.core.jsonrecord import JsonRecord

REPLAY_ROUNDS = 4  # rounds of the replay's fixed point (admission, join, lap): the third changes p50s by < 0.1%
LENGTH_BOUND = 2 ** 31  # generate()'s bounds when predict() makes a WorkloadSpec's requests: no clipping


@dataclass(frozen=True)
class RingModel:
    """The ring as the serve model sees it: per-lap costs, the streams cap, and the solo TTFT of a prompt length (a
    function, or a table {prompt_tokens: s} interpolated linearly and extended along its end segments)."""

    compute_s: float  # C: the stages' single-token passes, summed
    per_token_s: float  # P: their per-extra-token costs, summed
    t_ring_s: float  # the ring's network time per lap
    cap: int  # requests in the ring at once (streams cap and KV budget)
    ttft_s: Callable[[int], float] | Mapping[int, float]
    tokens_per_lap: float = 1.0  # Gamma: a request's tokens a lap (speculation; 1: plain decode)
    # for each stage, its passes over a prompt of this many tokens (one, or one a chunk; s): the prompts' share of the
    # convoy's laps (None: not charged)
    prompt_passes_s: Callable[[int], Sequence[Sequence[float]]] | None = None

    def __post_init__(self) -> None:
        if not (self.compute_s >= 0 and self.t_ring_s >= 0 and self.compute_s + self.t_ring_s > 0):
            raise ValueError(f"RingModel: need C, T_ring >= 0 and C + T_ring > 0, "
                             f"got {self.compute_s}, {self.t_ring_s}")
        if not self.per_token_s >= 0:
            raise ValueError(f"RingModel.per_token_s: expected >= 0, got {self.per_token_s}")
        if not (isinstance(self.cap, int) and self.cap >= 1):
            raise ValueError(f"RingModel.cap: expected an integer >= 1, got {self.cap!r}")
        if not callable(self.ttft_s) and not (isinstance(self.ttft_s, Mapping) and self.ttft_s):
            raise ValueError("RingModel.ttft_s: expected a function of prompt tokens or a non-empty table")
        if not self.tokens_per_lap >= 1:
            raise ValueError(f"RingModel.tokens_per_lap: expected >= 1, got {self.tokens_per_lap}")

    def decode_laps(self, output_tokens: int | float) -> float:
        """A request's mean decode laps: its tokens after the first at Gamma a lap, (n - 1) / Gamma."""
        return (output_tokens - 1) / self.tokens_per_lap

    def lap_s(self, batch: float) -> float:
        """L(b) = C + T_ring + P (b - 1)."""
        return self.compute_s + self.t_ring_s + self.per_token_s * (batch - 1)

    def prefill_s(self, prompt_tokens: int) -> float:
        """The solo TTFT of a prompt of this length."""
        if callable(self.ttft_s):
            return float(self.ttft_s(prompt_tokens))
        xs = sorted(self.ttft_s)
        if len(xs) == 1:
            return float(self.ttft_s[xs[0]])
        i = min(max(int(np.searchsorted(xs, prompt_tokens)), 1), len(xs) - 1)
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.ttft_s[x0], self.ttft_s[x1]
        return float(y0 + (y1 - y0) * (prompt_tokens - x0) / (x1 - x0))


def saturation_output_tok_s(model: RingModel, cap: int | None = None) -> float:
    """The streams ceiling: every slot decoding, c Gamma tokens per lap of c, c Gamma / L(c)."""
    cap = model.cap if cap is None else cap
    return cap * model.tokens_per_lap / model.lap_s(cap)


def _locked_join_s(prefill: np.ndarray, lap: float, cap: int) -> np.ndarray:
    """The join wait of a request admitted at a lap's end: its first token comes f later, a convoy leaves every lap
    (none with one slot: it departs at once). Its prompt leaves just behind the convoy and queues behind it at every
    stage, so a prefill of a whole number of laps comes back just after the convoy left: it waits the next lap."""
    return (np.floor(prefill / lap + 1e-9) + 1) * lap - prefill if cap > 1 else np.zeros_like(prefill)


def _saturation(model: RingModel, cap: int, prefill: np.ndarray, laps: np.ndarray,
                weight: np.ndarray) -> tuple[float, float]:
    """(tau, E[S]) with c slots always busy: a slot frees at a lap's end and is refilled at once, so a request of K
    decode laps holds it for (K + ceil(f / tau)) laps (f + K L(1) when c = 1: no convoy to wait for); the others
    decoding beside one are (c - 1) E[K tau] / E[S]."""
    l1, tau, service = model.lap_s(1), model.lap_s(cap), float(weight @ prefill)
    for _ in range(64):  # a contraction (P (c - 1) E[K] / E[S] < 1), but ceil() may flip at the root: bounded
        holding = np.where(laps > 0, laps * tau + prefill + _locked_join_s(prefill, tau, cap), prefill)
        service = float(weight @ holding)
        share = float(weight @ laps) * tau / service if service > 0 else 0.0
        new = l1 + model.per_token_s * (cap - 1) * share
        if abs(new - tau) <= 1e-14 * tau:
            break
        tau = new
    return tau, service


def knee_rate(model: RingModel, mean_prompt: float, mean_output: float, cap: int | None = None) -> float:
    """Requests/s where the cap binds: the saturation throughput c / E[S] for requests of these lengths."""
    cap = model.cap if cap is None else cap
    one = np.ones(1)
    service = _saturation(model, cap, one * model.prefill_s(round(mean_prompt)), one * model.decode_laps(mean_output),
                          one)[1]
    return cap / service if service > 0 else math.inf


def _arrivals_of(model: RingModel, workload: Sequence[RequestSpec] | WorkloadSpec, rate: float | None,
                 max_prompt: int, max_output: int) -> tuple[Sequence[RequestSpec], int, float, np.ndarray]:
    """predict's requests and their arrivals: (requests, cap, rate, each request's arrival time: a request list's
    pattern stretched to `rate` where one is given)."""
    cap = model.cap
    if isinstance(workload, WorkloadSpec):
        if workload.max_concurrency:
            cap = min(cap, workload.max_concurrency)
        if rate is not None and workload.arrival != "trace":
            workload = dataclasses.replace(workload, rate=rate)
        workload = generate(workload, max_prompt=max_prompt, max_output=max_output)
    if not workload:
        raise ValueError("predict: the workload has no requests")
    times = np.array([r.arrival_s for r in workload])
    count, span = len(workload), float(times.max() - times.min())
    lam = rate if rate is not None else ((count - 1) / span if span > 0 else 0.0)
    if not lam >= 0:
        raise ValueError(f"predict: rate must be >= 0, got {lam}")
    if rate is not None and lam > 0 and span > 0:  # a request list stretched to the rate: its pattern kept
        times = times.min() + (times - times.min()) * ((count - 1) / lam / span)
        span = (count - 1) / lam
    return workload, cap, lam, times


def _figures(name: str, values: np.ndarray) -> dict[str, float]:
    """Mean, median, p90 and p99 (ms) of per-request values, as the measured figures take them (numpy, linear)."""
    if not len(values):
        return {f"{s}_{name}_ms": 0.0 for s in ("mean", "median", "p90", "p99")}
    ms = values * 1e3
    median, p90, p99 = np.percentile(ms, (50, 90, 99))
    return {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(median), f"p90_{name}_ms": float(p90),
            f"p99_{name}_ms": float(p99)}


def _slot_starts(times: np.ndarray, hold_now: np.ndarray, hold_queued: np.ndarray, cap: int) -> np.ndarray:
    """Each request's admission: the Kiefer-Wolfowitz recursion of a FIFO queue of `cap` slots, in arrival order. A
    request takes the slot that frees first, at its arrival or that time, and holds it hold_now (admitted at once)
    or hold_queued (from the queue: phase-locked to the laps)."""
    free = [-math.inf] * cap
    starts = np.empty(len(times))
    for k in np.argsort(times, kind="stable"):
        start = max(float(times[k]), heapq.heappop(free))
        starts[k] = start
        heapq.heappush(free, start + float(hold_queued[k] if start > times[k] else hold_now[k]))
    return starts


def _decoding_others(begin: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each decode life [begin, end): (the mean number of the others decoding over it, whether another is
    decoding at its beginning). The integral of the count of lives is piecewise linear between their edges."""
    edges = np.concatenate([begin, end])
    order = np.argsort(edges, kind="stable")
    x, step = edges[order], np.concatenate([np.ones(len(begin)), -np.ones(len(end))])[order]
    after = np.cumsum(step)  # lives running just after each edge
    area = np.concatenate([[0.0], np.cumsum(after[:-1] * np.diff(x))])  # their integral up to each edge

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(x, t, side="right") - 1
        return area[i] + after[i] * (t - x[i])  # every t is an edge or after the first one

    life = end - begin
    mean = np.where(life > 0, (integral(end) - integral(begin)) / np.where(life > 0, life, 1) - 1, 0.0)
    running = np.searchsorted(np.sort(begin), begin, side="left") - np.searchsorted(np.sort(end), begin, side="right")
    return np.maximum(mean, 0.0), running > 0


@dataclass(frozen=True)
class _Replay:
    """The run's requests through the closed forms: each one's admission, join wait and mean lap (s)."""

    starts: np.ndarray
    join: np.ndarray
    lap: np.ndarray


def _prompts_in(starts: np.ndarray, per_request: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each decode life [begin, end): the sum of per_request's rows ([requests, ...]) over the prompts admitted
    within it."""
    order = np.argsort(starts, kind="stable")
    at = starts[order]
    summed = np.concatenate([np.zeros((1, *per_request.shape[1:])), np.cumsum(per_request[order], axis=0)])
    return summed[np.searchsorted(at, end, side="left")] - summed[np.searchsorted(at, begin, side="left")]


def _prompt_costs(model: RingModel, workload: Sequence[RequestSpec]) -> np.ndarray:
    """[requests, 2, stages]: each request's prompt passes on each stage, summed and squared-and-summed (zeros where
    the model does not charge them)."""
    if model.prompt_passes_s is None:
        return np.zeros((len(workload), 2, 1))
    by_length: dict[int, np.ndarray] = {}
    for r in workload:
        if r.prompt_tokens not in by_length:
            passes = [np.asarray(stage, dtype=float) for stage in model.prompt_passes_s(r.prompt_tokens)]
            by_length[r.prompt_tokens] = np.array([[p.sum() for p in passes], [(p * p).sum() for p in passes]])
    return np.array([by_length[r.prompt_tokens] for r in workload])


def _prompts_met(starts: np.ndarray, costs: np.ndarray, begin: np.ndarray, life: np.ndarray) -> np.ndarray:
    """E_k: what the prompts admitted during each decode life D_k add to its laps, on average, to first order: a
    prompt's pass f on a stage is under way when the convoy comes with probability f / tau and holds it f / 2 more,
    so the prompts cost the life sum f^2 / (2 tau) and each lap sum f^2 / (2 D_k). Their queue among themselves is
    left out (it would divide by 1 - rho, rho their share of the stage: measured, that overshoots as much as this
    undershoots at rho 0.4, and neither holds where the prompts alone fill a stage: see the module)."""
    within = _prompts_in(starts, costs[:, 1], begin, begin + life)  # [lives, stages]: the squared passes met
    return within.sum(axis=1) / (2 * np.where(life > 0, life, 1.0))


def _replay(model: RingModel, cap: int, times: np.ndarray, prefill: np.ndarray, laps: np.ndarray, tau: float,
            phase: np.ndarray, costs: np.ndarray) -> _Replay:
    """Admissions by the FIFO recursion; a first token that finds a convoy running waits `phase` of its lap, one
    from the queue joins phase-locked; a request's lap is L(1) + P x the others decoding over its life, plus the
    prompts' passes it meets (costs: _prompt_costs). The three
    depend on each other: a few rounds of the fixed point, from every lap at tau."""
    decoding, lap = laps > 0, np.full(len(times), tau)
    base, join = lap, np.zeros(len(times))  # base: the lap without the prompts' passes (what phase-locks a join)
    for _ in range(REPLAY_ROUNDS):
        holding = prefill + laps * lap
        starts = _slot_starts(times, holding + join, holding + _locked_join_s(prefill, base, cap), cap)
        first = starts + prefill
        begin = first + join
        others, running = _decoding_others(begin[decoding], (begin + laps * lap)[decoding])
        queued = starts > times
        join = np.zeros(len(times))
        join[decoding] = np.where(queued[decoding], _locked_join_s(prefill, base, cap)[decoding],
                                  np.where(running, phase[decoding] * lap[decoding], 0.0))
        met = _prompts_met(starts, costs, (first + join)[decoding], (laps * lap)[decoding])
        base = np.full(len(times), model.lap_s(1))
        base[decoding] = model.lap_s(1) + model.per_token_s * others
        lap = base.copy()
        lap[decoding] += met
    return _Replay(starts=starts, join=join, lap=lap)


def predict(model: RingModel, workload: Sequence[RequestSpec] | WorkloadSpec, *, rate: float | None = None,
            max_prompt: int = LENGTH_BOUND, max_output: int = LENGTH_BOUND,
            laps: Sequence[float] | np.ndarray | None = None) -> Prediction:
    """The predicted figures of a workload: its requests, or a WorkloadSpec (its requests made by generate(), its
    max_concurrency applied to the cap); `rate` overrides the arrival rate (a request list's span scales to it).
    `laps`: each request's decode laps where they are known (a speculating run's own, or drawn_laps()); else
    (n - 1) / Gamma each."""
    workload, cap, lam, times = _arrivals_of(model, workload, rate, max_prompt, max_output)
    count = len(workload)
    prefill = np.array([model.prefill_s(r.prompt_tokens) for r in workload])
    tokens = np.array([r.output_tokens - 1 for r in workload], dtype=float)  # each request's tokens after its first
    laps = (tokens / model.tokens_per_lap if laps is None else np.asarray(laps, dtype=float))
    if laps.shape != tokens.shape or np.any((laps > 0) != (tokens > 0)):
        raise ValueError("predict: laps must give each request's decode laps, > 0 where it has tokens after its first")

    # The knee (every slot busy) and the open convoy's mean lap by Little's law (the closed forms' summary figures).
    pairs = collections.Counter(zip((r.prompt_tokens for r in workload), laps.tolist()))
    weight = np.array(list(pairs.values()), dtype=float) / count
    tau_sat, service_sat = _saturation(model, cap, np.array([model.prefill_s(p) for p, _ in pairs]),
                                       np.array([k for _, k in pairs], dtype=float), weight)
    mu = cap / service_sat if service_sat > 0 else math.inf
    l1, p, mean_laps = model.lap_s(1), model.per_token_s, float(laps.mean())
    tau = min(l1 / (1 - p * lam * mean_laps) if p * lam * mean_laps < 1 else math.inf, tau_sat)
    others = (tau - l1) / p if p > 0 else min(lam * mean_laps * tau, (cap - 1) * mean_laps * tau_sat / service_sat)

    # The run replayed through them: each request's wait, join and lap (its TPOT: its decode over its tokens).
    phase = (np.random.default_rng(count).permutation(count) + 0.5) / count  # the lap's phase at a first token
    run = _replay(model, cap, times, prefill, laps, tau, phase, _prompt_costs(model, workload))
    decoding = tokens > 0
    waits = run.starts - times
    ttft = prefill + waits
    decode = laps * run.lap + run.join
    tpot = decode[decoding] / tokens[decoding]
    e2el = ttft + decode
    duration = float((run.starts + prefill + decode).max() - times.min())
    return Prediction(
        rate_req_s=lam, knee_rate_req_s=mu, regime="below the knee" if lam < mu else "above the knee",
        offered_load=min(lam * float((prefill + laps * tau).mean()), float(cap)), running_mean=1 + others,
        wait_probability=float(np.mean(waits > 0)), lap_ms=tau * 1e3, **_figures("ttft", ttft),
        **_figures("tpot", tpot), **_figures("e2el", e2el), **_figures("queue", waits),
        duration_s=duration, request_throughput=count / duration if duration > 0 else math.inf,
        output_throughput=float(tokens.sum() + count) / duration if duration > 0 else math.inf,
        saturation_output_tok_s=saturation_output_tok_s(model, cap))


@functools.lru_cache(maxsize=256)
def lap_law(tokens: int, alpha: float, k: int) -> tuple[float, ...]:
    """The law of the laps a speculating request needs to keep `tokens` tokens (its tokens after the first): each lap
    keeps j of its K drafts and the rule's next token, P(j) = alpha^j (1 - alpha) for j < K and alpha^K for all K
    (i.i.d. acceptance), and the last lap's surplus is dropped. Entry N is P(N laps), N = 0..tokens."""
    if tokens <= 0:
        return (1.0,)
    gain = np.array([alpha ** j * (1 - alpha) for j in range(k)] + [alpha ** k])  # index j: j + 1 tokens
    law, short = np.zeros(tokens + 1), np.zeros(tokens)  # short[t]: t tokens kept so far, fewer than `tokens`
    short[0] = 1.0
    for n in range(1, tokens + 1):
        kept = np.zeros(tokens)
        kept[1:] = np.convolve(short, gain)[:tokens - 1]
        law[n] = short.sum() - kept.sum()
        short = kept
        if short.sum() < 1e-15:
            break
    return tuple(law)


def mean_laps(tokens: int, alpha: float, k: int) -> float:
    """E[laps] of lap_law: tokens / Gamma(alpha, K) for a long output, more for a short one (the surplus dropped)."""
    return float(np.arange(tokens + 1 if tokens > 0 else 1) @ np.array(lap_law(tokens, alpha, k)))


def drawn_laps(requests: Sequence[RequestSpec], alpha: float, k: int, seed: int = 0) -> np.ndarray:
    """Each request's decode laps drawn from lap_law: the requests of one output length take its quantiles at
    stratified points (in a seeded order), so a run of N requests carries the law's spread, not N random draws'."""
    out = np.zeros(len(requests))
    tokens = np.array([r.output_tokens - 1 for r in requests])
    rng = np.random.default_rng(seed)
    for m in np.unique(tokens):
        at = np.flatnonzero(tokens == m)
        cdf = np.cumsum(lap_law(int(m), alpha, k))
        points = (rng.permutation(len(at)) + 0.5) / len(at)
        out[at] = np.minimum(np.searchsorted(cdf, points * cdf[-1], side="left"), len(cdf) - 1)
    return out
