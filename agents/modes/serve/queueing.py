"""The serve mode's prediction beside every measured figure: a closed-form queueing model of the ring as a server.

The policy modelled (the serve runner's). A lap of b running requests costs L(b) = C + T_ring + P (b - 1) (C: the
stages' single-token passes, P: their per-extra-token costs). Running requests move as one convoy: each lap gives
each of them one token. A request arriving while fewer than c (the streams cap, and max_concurrency) are in the ring
is admitted at once: its prefill laps the ring as its own frame, its first token comes after f(P) (the solo TTFT,
Eq. 5), then it joins the convoy at the convoy's next departure (at once when there is no convoy). Otherwise it waits,
FIFO, for a slot; a slot frees when a request's last token is sampled. A request of n tokens holds its slot for
S = f(P) + w + (n - 1) tau, with w its join wait and tau its mean lap.

Light load (lambda -> 0): TTFT = f(P) and TPOT = L(1) = C + T_ring, exactly.

Below the knee. Little's law on the convoy: the others decoding beside a request number m = lambda E[n - 1] tau on
average (M/G/inf: Poisson arrivals see the time average), and L is linear in b, so its mean lap is
    tau = L(1) + P m = L(1) / (1 - P lambda E[n - 1]).
The join wait is the residual of the lap under way when the first token comes, if a convoy is running:
w = (1 - e^-m) tau / 2 (a request admitted from the queue joins phase-locked instead, as at the knee below), and
TPOT = tau + w / (n - 1). TPOT's spread across requests is the load's: a request's laps average the others present
over its life D = (n - 1) tau, whose variance for Poisson arrivals is
    Var = lambda E[min(D, D')^2 max(D, D') - min(D, D')^3 / 3] / D^2    (D' another request's),
2 m / 3 when every D is the same; scaled by the arrivals' squared coefficient of variation c_a^2 (1/b for gamma),
and none above the knee's lap plus its join wait (a phase-locked one, or below the knee up to a lap's).
E2EL = TTFT + (n - 1) TPOT.

The knee: c slots always busy. A slot frees at a lap's end and the next request takes it at once, so its first
token comes f after a departure and it joins ceil(f / tau) laps later: it holds the slot (n - 1 + ceil(f / tau)) tau,
phase-locked to the laps. The others decoding beside a request are (c - 1) E[(n - 1) tau] / E[S], so
    tau = L(1) + P (c - 1) E[n - 1] tau / E[S],    S = (n - 1 + ceil(f / tau)) tau    (S = f for n = 1)
is a small fixed point, and the saturation throughput is mu = c / E[S] requests/s (knee_rate). Its output rate is
a little under the streams ceiling c / L(c) (saturation_output_tok_s: every slot decoding), since a slot spends
ceil(f / tau) laps of every request on its prefill and join.

Where the cap binds (M/G/c with c = the cap, service S): the requests in the ring, k, are a birth-death chain whose
k holders each keep their slot S(k) = E[S] + E[n - 1] P ((k - 1) s - m) (s: the share of a slot's time spent
decoding; laps cost more as the convoy grows), S(c) = the knee's, so pi_k / pi_(k-1) = lambda S(k) / k below c and
the queue drains at mu above it. A request waits with probability Pr(k >= c) (Erlang-C's with state-dependent
service); given a wait, it is exponential with mean (c_a^2 + c_s^2) / (2 (mu - lambda)) (Allen-Cunneen's factor on
M/M/c's 1 / (c mu_1 - lambda); c_s^2 the spread of S across requests, nearly 0 for fixed lengths).

Above the knee an open-loop run's queue grows for the whole run: the k-th request is admitted when the (k - c)-th
leaves, about k / mu after the first arrival, so the request arriving at t waits (lambda / mu - 1) t: the wait grows
at (lambda - mu) / mu per second of arrivals ((lambda - mu) / lambda per second of the clock that admits them),
spread uniformly over [0, (lambda / mu - 1) T] for a run of span T, and the run lasts N / mu + E[S]. A finite run
near the knee cannot build up the stationary wait, which diverges there: the wait is also bounded by a reflected
Brownian queue's at the run's end, z sqrt(lambda (c_a^2 + c_s^2) T) / mu (z: the half-normal's quantile). The wait
quantile is max(fluid, min(stationary, that bound)): monotone in the rate.

Percentiles: each distinct (prompt, output) pair stands for its share of the workload with stratified points of
its TTFT, TPOT and E2EL (queueing wait and lap-average quantiles paired at fixed, seeded positions), and the
figures are the weighted percentiles of the points. No event simulation: a small closed form per rate (under a
millisecond for a list of a few thousand requests).

Checked against an event-by-event simulation of the policy (tests/test_serve_queueing.py, Poisson arrivals, a geo
ring of C = 30 ms, P = 1 ms, T_ring = 200 ms, c = 64): p50 TTFT and TPOT within 0.2% (128-token outputs) and 0.7%
(8-token) at 10-80% of the knee, p90 TPOT and p50 E2EL within 2%. Its weakest figure is the waiting tail near the
knee: p99 TTFT off by 10-60% at 70-90% of it with Poisson arrivals, and badly under bursty gamma ones (b = 0.5:
bursts fill the cap well below the knee, which Allen-Cunneen's c_a^2 scaling of the wait does not see).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agents.modes.serve.facts import Prediction
from agents.modes.serve.requests import RequestSpec
from agents.modes.serve.workload import WorkloadSpec, generate
from testbed.core.jsonrecord import JsonRecord

POINTS_BUDGET = 16384  # stratified points over all (prompt, output) pairs: percentiles within a fraction of a %
MAX_POINTS = 400  # per pair: p99 between the points at u = 0.98875 and 0.99125
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
    """The streams ceiling: every slot decoding, c tokens per lap of c, c / L(c)."""
    cap = model.cap if cap is None else cap
    return cap / model.lap_s(cap)


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
    service = _saturation(model, cap, one * model.prefill_s(round(mean_prompt)), one * (mean_output - 1), one)[1]
    return cap / service if service > 0 else math.inf


def _wait_probability(rate: float, holding_s: np.ndarray, saturation_rate: float) -> float:
    """P(all c slots busy) in the birth-death chain of the requests in the ring: with k in it each holds its slot
    for holding_s[k - 1] (laps cost more as the convoy grows), so pi_k / pi_(k-1) = rate S(k) / k below c; at c and
    above the queue drains at the knee's rate, a geometric tail of ratio rate / saturation_rate."""
    if rate <= 0:
        return 0.0
    if rate >= saturation_rate:
        return 1.0
    cap = len(holding_s)
    log_pi = np.concatenate([[0.0], np.cumsum(np.log(rate * holding_s / np.arange(1, cap + 1)))])  # pi_0 .. pi_c
    pi = np.exp(log_pi - log_pi.max())
    tail = pi[-1] / (1 - rate / saturation_rate)
    return float(tail / (pi[:-1].sum() + tail))


@functools.cache
def _strata(points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Midpoints u_k of `points` equal strata, their standard normal and half-normal quantiles, and a fixed
    pairing permutation."""
    u = (np.arange(points) + 0.5) / points
    normal = statistics.NormalDist()
    z = np.array([normal.inv_cdf(x) for x in u])
    half = np.array([normal.inv_cdf((1 + x) / 2) for x in u])
    return u, z, half, np.random.default_rng(points).permutation(points)


def _overlap(life: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """For each life T: E over another request's life D of the integral of (D - |s - t|)+ over s, t in [0, T],
    min(T, D)^2 max(T, D) - min(T, D)^3 / 3, by prefix sums over the sorted lives (no pairs x pairs matrix)."""
    order = np.argsort(life, kind="stable")
    d, w = life[order], weight[order]
    sums = [np.concatenate([[0.0], np.cumsum(w * d ** k)]) for k in range(4)]  # sum of w d^k over the i shortest
    shorter = np.searchsorted(d, life, side="right")
    below2, below3 = sums[2][shorter], sums[3][shorter]
    above0, above1 = sums[0][-1] - sums[0][shorter], sums[1][-1] - sums[1][shorter]
    return life * below2 - below3 / 3 + life ** 2 * above1 - life ** 3 / 3 * above0


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> list[float]:
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    centres = (np.cumsum(w) - w / 2) / w.sum()
    return [float(np.interp(q / 100, centres, v)) for q in qs]


def _arrival_cv2(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(np.var(gaps) / np.mean(gaps) ** 2) if len(gaps) >= 2 and np.mean(gaps) > 0 else 1.0


def _arrivals_of(model: RingModel, workload: Sequence[RequestSpec] | WorkloadSpec, rate: float | None,
                 max_prompt: int, max_output: int) -> tuple[Sequence[RequestSpec], int, float, float, float]:
    """predict's requests and their arrivals: (requests, cap, arrivals' squared coefficient of variation, rate,
    span from the first arrival to the last)."""
    cap, cv2 = model.cap, None
    if isinstance(workload, WorkloadSpec):
        if workload.max_concurrency:
            cap = min(cap, workload.max_concurrency)
        if rate is not None and workload.arrival != "trace":
            workload = dataclasses.replace(workload, rate=rate)
        cv2 = {"poisson": 1.0, "gamma": 1.0 / workload.burstiness, "constant": 0.0}.get(workload.arrival)
        workload = generate(workload, max_prompt=max_prompt, max_output=max_output)
    if not workload:
        raise ValueError("predict: the workload has no requests")
    times = np.array([r.arrival_s for r in workload])
    count, span = len(workload), float(times.max() - times.min())
    lam = rate if rate is not None else ((count - 1) / span if span > 0 else 0.0)
    if not lam >= 0:
        raise ValueError(f"predict: rate must be >= 0, got {lam}")
    span = (count - 1) / lam if rate is not None and lam > 0 else span
    return workload, cap, _arrival_cv2(times) if cv2 is None else cv2, lam, span


def _figures(name: str, values: np.ndarray, mask: np.ndarray | None = None, *,
             point_weight: np.ndarray) -> dict[str, float]:
    """Mean, median, p90 and p99 (ms) of predicted values [pairs, points] weighted by point_weight (mask: which)."""
    flat, w = values.ravel() * 1e3, point_weight
    if mask is not None:
        if not mask.any():
            return {f"{s}_{name}_ms": 0.0 for s in ("mean", "median", "p90", "p99")}
        flat, w = flat[mask], w[mask]
    median, p90, p99 = _weighted_percentiles(flat, w, (50, 90, 99))
    return {f"mean_{name}_ms": float(flat @ w / w.sum()), f"median_{name}_ms": median,
            f"p90_{name}_ms": p90, f"p99_{name}_ms": p99}


def _wait_s(waiting: float, lam: float, mu: float, cv2_sum: float, span: float, u: np.ndarray,
            half: np.ndarray) -> np.ndarray:
    """The wait for a slot at quantiles u: the fluid growth above the knee, else the smaller of the stationary wait
    (Allen-Cunneen's tail, c_a^2 + c_s^2 = cv2_sum) and the reflected Brownian bound the run's span allows."""
    stationary = np.full(len(u), math.inf) if waiting >= 1 else np.zeros(len(u))
    if 0 < waiting < 1:
        tail = u > 1 - waiting
        stationary[tail] = cv2_sum / (2 * (mu - lam)) * np.log(waiting / (1 - u[tail]))
    brownian = half * math.sqrt(lam * cv2_sum * span) / mu
    fluid = u * max(0.0, lam / mu - 1) * span
    return np.maximum(fluid, np.minimum(stationary, brownian))


def _tpot_s(model: RingModel, cap: int, laps: np.ndarray, prefill: np.ndarray, weight: np.ndarray, join: np.ndarray,
            waiting: float, convoy_share: float, tau: float, tau_sat: float, others_rate: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair's TPOT: (mean, standard deviation, the knee's, which none exceeds) in s. A request admitted from the
    queue (probability `waiting`) is admitted at a lap's end and joins phase-locked, as at the knee. Its spread is the
    load's: the others' mean over its life D = K tau (M/G/inf; others_rate: c_a^2 x min(lambda, mu)) and the join's
    (uniform over a lap)."""
    decoding = laps > 0
    per_lap = np.where(decoding, laps, 1)
    join_mean = np.where(decoding, waiting * _locked_join_s(prefill, tau, cap) + (1 - waiting) * join, 0.0)
    life = laps * tau
    others_var = np.where(decoding, others_rate * _overlap(life, weight) / np.where(decoding, life, 1) ** 2, 0.0)
    join_var = convoy_share * tau ** 2 / 3 - (convoy_share * tau / 2) ** 2
    tpot_sd = np.sqrt(model.per_token_s ** 2 * others_var + join_var / per_lap ** 2)
    # the slowest: a request at the knee, joining phase-locked, or (below it) one that waited the most a join can
    join_high = np.maximum(_locked_join_s(prefill, tau_sat, cap), convoy_share * tau if waiting < 1 else 0.0)
    return tau + join_mean / per_lap, tpot_sd, tau_sat + join_high / per_lap


def predict(model: RingModel, workload: Sequence[RequestSpec] | WorkloadSpec, *, rate: float | None = None,
            max_prompt: int = LENGTH_BOUND, max_output: int = LENGTH_BOUND) -> Prediction:
    """The predicted figures of a workload: its requests, or a WorkloadSpec (its requests made by generate(), its
    max_concurrency applied to the cap); `rate` overrides the arrival rate (a request list's span scales to it)."""
    workload, cap, cv2, lam, span = _arrivals_of(model, workload, rate, max_prompt, max_output)
    count = len(workload)

    pairs = collections.Counter((r.prompt_tokens, r.output_tokens) for r in workload)  # in first-seen order
    weight = np.array(list(pairs.values()), dtype=float) / count
    prefill = np.array([model.prefill_s(p) for p, _ in pairs])
    outputs = np.array([n for _, n in pairs], dtype=float)
    laps = outputs - 1  # K: the decode laps of each pair
    mean_laps = float(weight @ laps)

    # The convoy: the open fixed point, capped where every slot is busy (the knee's closed system).
    l1, p = model.lap_s(1), model.per_token_s
    tau_sat, service_sat = _saturation(model, cap, prefill, laps, weight)
    mu = cap / service_sat if service_sat > 0 else math.inf
    tau_open = l1 / (1 - p * lam * mean_laps) if p * lam * mean_laps < 1 else math.inf
    tau = min(tau_open, tau_sat)
    sat_others = (cap - 1) * mean_laps * tau_sat / service_sat
    others = (tau - l1) / p if p > 0 else min(lam * mean_laps * tau, sat_others)
    convoy_share = 1 - math.exp(-others) if cap > 1 else 0.0
    join = np.where(laps > 0, convoy_share * tau / 2, 0.0)
    service = prefill + join + laps * tau
    mean_s = float(weight @ service)
    load = lam * mean_s
    service_cv2 = float(weight @ (service - mean_s) ** 2) / mean_s ** 2 if mean_s > 0 else 0.0

    # The wait for a slot: one quantile function of u for every pair (FIFO), the max of the fluid growth above the
    # knee and the smaller of the stationary wait and what the run's length allows near the knee.
    points = int(min(MAX_POINTS, max(16, POINTS_BUDGET // len(pairs))))
    u, z, half, pairing = _strata(points)
    share = mean_laps * tau / mean_s if mean_s > 0 else 0.0
    holding = mean_s + mean_laps * p * ((np.arange(cap) * share) - others)  # S(k): k - 1 others, share decoding
    holding[-1] = max(holding[-1], service_sat)
    waiting = _wait_probability(lam, holding, mu)
    wait = _wait_s(waiting, lam, mu, cv2 + service_cv2, span, u, half)

    # TPOT: the mean lap and the join wait's share (_tpot_s); no request decodes slower than at the knee.
    decoding = laps > 0
    tpot_mean, tpot_sd, tpot_high = _tpot_s(model, cap, laps, prefill, weight, join, waiting, convoy_share, tau,
                                            tau_sat, cv2 * min(lam, mu))
    ttft = prefill[:, None] + wait[None, :]  # [pairs, points]
    tpot = np.clip(tpot_mean[:, None] + tpot_sd[:, None] * z[None, :], l1, tpot_high[:, None])
    e2el = ttft + laps[:, None] * tpot[:, pairing]
    figures = functools.partial(_figures, point_weight=np.repeat(weight / points, points))

    # The run lasts from the first arrival to the last finish: the last arrival's wait and service, or (above the
    # knee) every request through the cap at the knee's rate.
    duration = max(span + float(wait.mean()), count / mu) + mean_s
    return Prediction(
        rate_req_s=lam, knee_rate_req_s=mu, regime="below the knee" if lam < mu else "above the knee",
        offered_load=min(load, float(cap)), running_mean=1 + min(others, sat_others), wait_probability=waiting,
        lap_ms=tau * 1e3, **figures("ttft", ttft), **figures("tpot", tpot, np.repeat(decoding, points)),
        **figures("e2el", e2el), **figures("queue", np.broadcast_to(wait, ttft.shape)), duration_s=duration,
        request_throughput=count / duration, output_throughput=float(outputs @ (weight * count)) / duration,
        saturation_output_tok_s=saturation_output_tok_s(model, cap))
