"""Time dilation: run a scenario D times slower on the box, report it in the scenario's own time.

The testbed's own costs per hop (a process woken after sleeping pays 0.4-1 ms on these VMs; sockets, the
relay, framing) do not grow with the delays and computes they ride on. Time-warped emulation (Gupta et
al., NSDI'06) multiplies every link delay, jitter, emulated compute and real forward pass by D (link rates
divided by D), then divides every measured time by D: the fixed costs shrink by D, the scenario does not
change. `scale` changes the scenario; dilation does not.

`--dilation auto` calibrates first: a short run of the same ring, plain decode at zero configured delay,
measures what a lap costs beyond compute (the overhead O, with each hop's base one-way latency); then D is
the smallest whole number with O / D <= TARGET_OVERHEAD of the lap C + T_ring, capped at DILATION_MAX and
by the run-time budget (the dilated run, its prefill and its decode, may take at most BUDGET_S: forecast), so a
short ring gets a large D and a long one, where O is already small, or one whose prompt is long on slow links,
gets 1-2. A mode whose overhead is off the ring calibrates as itself
(ModeInfo.own_calibration): edge speculation's is in the clients' two hops and the entry's hand-off a round, so
its calibration is the same clients at a zero round trip, its lap a round, O what a round took beyond its physics;
the streams mode's lap carries M frames over every hop, so its calibration is its own M streams at zero delay.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Awaitable, Callable

from agents.modes import MODES
from agents.modes.speculative.settings import SpecSettings
from agents.process.codec import emulated_payload_bytes
from agents.zoo.configs import model_config
from testbed.core import physics, tcp
from testbed.core.decode import DecodeConfig
from testbed.core.errors import ConfigError
from testbed.core.summary import DilationSummary, RunSummary
from testbed.scenario.config import Scenario

TARGET_OVERHEAD = 0.003  # the overhead auto aims at, as a fraction of the lap
DILATION_MAX = 64.0
BUDGET_S = 40.0  # auto keeps the dilated run (its prefill and tokens x lap, times D) within this many seconds (--budget-s)
MAX_BUDGET_S = 86_400.0
CALIBRATION_TOKENS = 12


def parse_dilation(value: str | float) -> float | str:
    """--dilation: "auto" or a number >= 1."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        factor = float(value)
    except (TypeError, ValueError):
        factor = float("nan")
    if not (1.0 <= factor <= DILATION_MAX):
        raise ConfigError(f"expected a number in [1, {DILATION_MAX:g}] or auto, got {value!r}", key="--dilation")
    return factor


def parse_budget(value: str | float) -> float:
    """--budget-s: seconds > 0 of dilated decode that auto may spend."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not (0 < seconds <= MAX_BUDGET_S):
        raise ConfigError(f"expected seconds in (0, {MAX_BUDGET_S:g}], got {value!r}", key="--budget-s")
    return seconds


def calibration_scenario(scenario: Scenario) -> Scenario:
    """The same stages and links at zero delay, jitter and loss (rates kept), decoding plain for a few laps.

    Everything else is reset to defaults, so that the phases of one ring (plain, speculative) share it. A mode
    that calibrates as itself (ModeInfo.own_calibration) keeps its decode and [spec] at a zero round trip instead.
    """
    links = tuple(dataclasses.replace(link, delay_ms=0.0, jitter_ms=0.0, loss_pct=0.0) for link in scenario.links)
    scenario = dataclasses.replace(scenario, weights=None)  # it measures the ring's overhead, not its loading
    if MODES[scenario.decode.mode].own_calibration:
        return dataclasses.replace(scenario, name=f"{scenario.name}-calibration", description="", links=links,
                                   decode=dataclasses.replace(scenario.decode, tokens=CALIBRATION_TOKENS),
                                   spec=dataclasses.replace(scenario.spec, rtt_ms=0.0, jitter_ms=0.0))
    decode = DecodeConfig(mode="plain", tokens=CALIBRATION_TOKENS, prompt=scenario.decode.prompt)
    return dataclasses.replace(scenario, name=f"{scenario.name}-calibration", description="", links=links,
                               decode=decode)


def lap_floor_s(scenario: Scenario) -> float:
    """What a lap takes beyond its compute at the scenario's delays: the ring, and an edge client's round trip."""
    return scenario.t_ring_s + (scenario.spec.rtt_ms / 1e3 if scenario.spec.placement == "edge" else 0.0)


@dataclasses.dataclass(frozen=True)
class Calibration:
    base_ms: tuple[float, ...]  # per link (ring hops measured; other links 0)
    overhead_ms: float  # per lap: duration - compute at zero delay
    compute_s: float  # mean C per lap
    serialization_s: float = 0.0  # per lap: every hop's frame at its rate (the rates are the run's)


def calibration_from(summary: RunSummary, scenario: Scenario) -> Calibration:
    """What the calibration run measured: per-hop base latency (p50) and the per-lap overhead, each less the
    physics it holds at zero delay: compute, and on a rated link the frame's serialization (bytes / rate)."""
    info = MODES[summary.mode]
    if info.own_calibration:  # its summary part says what a lap took beyond physics at zero delay
        part = getattr(summary, info.summary_field)
        if part is None:
            raise ConfigError(f"the calibration run produced no {info.summary_field} summary", key="--dilation")
        overhead_ms, physics_s = part.calibration_lap()
        return Calibration((0.0,) * len(scenario.links), overhead_ms, physics_s)
    if not summary.laps or summary.measured_tok_s is None or summary.compute_s is None:
        raise ConfigError("the calibration run produced no decode laps", key="--dilation")
    ring = [(h.measured_ms_p50 or 0.0) - serialization_ms(h.bytes_per_lap, link)
            for h, link in zip(summary.per_hop, scenario.links)]
    base = tuple(max(0.0, ring[i]) if i < len(ring) else 0.0 for i in range(len(scenario.links)))
    lap_s = 1.0 / summary.measured_tok_s  # plain decode: one token per lap
    physics_s = summary.compute_s + (summary.serialization_s or 0.0)
    return Calibration(base, max(0.0, (lap_s - physics_s) * 1e3), summary.compute_s, summary.serialization_s or 0.0)


def serialization_ms(frame_bytes: float | None, link) -> float:
    """A frame's time on a rated link, ms (0 where the link is unlimited)."""
    rate = link.rate_bytes_s
    return (frame_bytes or 0.0) / rate * 1e3 if math.isfinite(rate) else 0.0


def planned_laps(scenario: Scenario) -> int:
    """Decode laps the run will take at most (one token a lap, at least min_rounds; a K sweep runs its rounds)."""
    decode, own = scenario.decode, scenario.decode.settings(SpecSettings)
    return max(1, own.rounds_per_k * len(own.k_sweep) if own.k_sweep else max(decode.tokens, own.min_rounds))


def prompt_positions(scenario: Scenario) -> int:
    """Positions of the run's first prompt: decode.prompt_tokens, else the text prompt's (one a byte, at most half
    the computing model's window: agents.zoo.prompts; a checkpoint's tokenizer gives no more tokens than bytes)."""
    decode = scenario.decode
    if decode.prompt_tokens > 0:
        return decode.prompt_tokens
    shape = model_config(scenario.model)
    return min(len(decode.prompt.encode("utf-8")), shape.block_size // 2)


def hidden_bytes(scenario: Scenario, positions: int) -> int:
    """Eq. 1: the hidden state of `positions` crossing one hop, P x d_model x b: the [geometry]'s under the codec,
    else the computing model's f32 (an upper bound under a compressing codec); framing left out."""
    if scenario.wire.width:
        return emulated_payload_bytes(positions, scenario.wire)
    shape = model_config(scenario.model)
    return physics.b_hop(positions, shape.n_embd, 4)


def lap_serialization_s(scenario: Scenario) -> float:
    """A decode lap's frames (one position a stream) at each ring hop's rate (0 on unlimited links)."""
    size = max(1, scenario.decode.streams) * hidden_bytes(scenario, 1)
    return sum(size / link.rate_bytes_s for link in scenario.ring if math.isfinite(link.rate_bytes_s))


@dataclasses.dataclass(frozen=True)
class RunForecast:
    """What a run takes at D = 1, in scenario time (closed forms): its prefill, then its decode laps."""

    prefill_s: float  # Eq. 5: C_prefill(P) + T_ring + the prompt's bytes (Eq. 1) at each hop's rate, every stream's
    decode_s: float  # planned laps x (C + T_ring + a frame's serialization)
    laps: int

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    def describe(self) -> str:
        return (f"the predicted run is {self.total_s:.3g} s of scenario time (prefill {self.prefill_s:.3g} s, "
                f"decode {self.decode_s:.3g} s for {self.laps} laps)")


def forecast(scenario: Scenario, compute_s: float) -> RunForecast:
    """The run's predicted duration at D = 1 (compute_s: a decode lap's time beyond lap_floor_s). The prefill is
    Eq. 5 per hop (physics.ttft_hops) with the stages' emulated cost of the whole prompt (StageConfig.cost_ms) and
    its hidden state (hidden_bytes), once per stream: a 1,024-token 700B-class prompt at 10 Mbit/s is 27 s a
    hop, so a run's prefill can outweigh its decode by far."""
    own = getattr(MODES[scenario.decode.mode].part("summary"), "run_forecast", None)
    if own is not None:  # a mode whose run is not its tokens' laps (serve: its workload's arrivals)
        return RunForecast(*own(scenario, compute_s + lap_floor_s(scenario)))
    positions, streams = prompt_positions(scenario), max(1, scenario.decode.streams)
    prefill_compute_s = sum(st.cost_ms(positions, 1, positions) for st in scenario.stages) / 1e3
    ring = scenario.ring
    hop_bytes = [hidden_bytes(scenario, positions)] * len(ring)
    prefill_s = physics.ttft_hops(prefill_compute_s, [link.delay_ms / 1e3 for link in ring], hop_bytes,
                                  [link.rate_bytes_s for link in ring])
    if scenario.transport == "kernel":  # a cold connection's slow start and window on each hop (testbed.core.tcp)
        prefill_s = prefill_compute_s + scenario.t_ring_s + sum(
            tcp.prompt_transfer_s(scenario.links, ring, hop_bytes, scenario.loss_rto_ms))
    decode = getattr(MODES[scenario.decode.mode].part("summary"), "decode_forecast", None)
    if decode is not None:  # a mode whose laps are not one a token (overlap: rounds on the ring at once)
        decode_s, laps = decode(scenario, compute_s + lap_floor_s(scenario))
        return RunForecast(streams * prefill_s, decode_s, laps)
    laps = planned_laps(scenario)
    return RunForecast(streams * prefill_s, laps * (compute_s + lap_floor_s(scenario)), laps)


def budget_cap(scenario: Scenario, compute_s: float, budget_s: float = BUDGET_S) -> float:
    """The largest whole D (<= DILATION_MAX, >= 1) whose dilated run, prefill and decode (forecast), fits in
    budget_s (compute_s: a decode lap's time beyond T_ring)."""
    total_s = forecast(scenario, compute_s).total_s
    if total_s <= 0:
        return DILATION_MAX
    return float(max(1, min(DILATION_MAX, math.floor(budget_s / total_s))))


def choose(scenario: Scenario, calibration: Calibration, *, compensate: bool = False,
           target: float = TARGET_OVERHEAD, budget_s: float = BUDGET_S) -> DilationSummary:
    """The smallest whole D with (overhead / D) <= target x lap, within DILATION_MAX and the budget."""
    lap_s = calibration.compute_s + calibration.serialization_s + lap_floor_s(scenario)
    overhead_ms = calibration.overhead_ms
    if compensate:  # the compensated part of each hop is taken out of the delay; what is left is the residual
        overhead_ms = max(0.0, overhead_ms - sum(calibration.base_ms[: len(scenario.ring)]))
    needed = overhead_ms / 1e3 / (target * lap_s) if lap_s > 0 else DILATION_MAX
    cap = budget_cap(scenario, calibration.compute_s + calibration.serialization_s, budget_s)
    factor = float(min(cap, max(1, math.ceil(needed))))
    run = forecast(scenario, calibration.compute_s + calibration.serialization_s)
    why = (f"overhead {overhead_ms:.2f} ms per lap of {lap_s * 1e3:.1f} ms needs D >= {needed:.1f} for "
           f"{target * 100:g}%; cap {cap:g} (max {DILATION_MAX:g}, {budget_s:g} s budget: {run.describe()})")
    chosen = summary_for(scenario, factor, "auto", calibration if compensate else None, needed=needed, cap=cap,
                         target=target, overhead_ms=overhead_ms, reason=why, lap_ms=lap_s * 1e3, budget_s=budget_s)
    if chosen.capped and chosen.expected_error_pct is not None:
        chosen = dataclasses.replace(chosen, reason=f"{why}: the overhead left at D = {factor:g} is "
                                                    f"{chosen.expected_error_pct:+.2f}% of the rate")
    return chosen


def box_scenario(scenario: Scenario, dilation: DilationSummary | None) -> Scenario:
    """What the agents and the shaper run: `scenario` dilated (and compensated) as `dilation` says."""
    if dilation is None:
        return scenario
    return scenario.dilated(dilation.factor, dilation.base_ms if dilation.compensate else ())


def summary_for(scenario: Scenario, factor: float, requested: str, calibration: Calibration | None = None, *,
                target: float = TARGET_OVERHEAD, **facts) -> DilationSummary:
    """The DilationSummary of running `scenario` at `factor` (compensated when a calibration is given)."""
    base = calibration.base_ms if calibration is not None else ()
    summary = DilationSummary(factor=factor, requested=requested, compensate=calibration is not None,
                              base_ms=tuple(base), target_overhead_pct=target * 100, **facts)
    applied = box_scenario(scenario, summary).links
    return dataclasses.replace(summary, applied_ms=tuple(link.delay_ms for link in applied))


async def resolve(scenario: Scenario, requested: float | str, *, compensate: bool,
                  run: Callable[[Scenario], Awaitable[RunSummary]], log: Callable[[str], None],
                  cache: dict | None = None, budget_s: float = BUDGET_S) -> DilationSummary:
    """The dilation to run `scenario` at; `run(scenario)` runs the calibration when one is needed (and it
    is not in `cache` already: the same stages and links calibrate once). budget_s: auto's run-time budget."""
    requested = parse_dilation(requested)
    budget_s = parse_budget(budget_s)
    lap_s = scenario.emulated_compute_s + lap_serialization_s(scenario)  # before a calibration measures it
    if requested == "auto" and not compensate and budget_cap(scenario, lap_s, budget_s) <= 1:
        run = forecast(scenario, lap_s)
        where = "over" if run.total_s > budget_s else "more than half of"
        chosen = summary_for(scenario, 1.0, "auto", cap=1.0, budget_s=budget_s,
                             reason=f"{run.describe()}, {where} the {budget_s:g} s budget: no room for D >= 2")
        log(f"dilation: D = 1 ({chosen.reason})")
        return chosen
    if requested == "auto" or compensate:
        probe = calibration_scenario(scenario)
        calibration = cache.get(probe) if cache is not None else None
        if calibration is None:
            log(f"dilation: calibrating {scenario.name} at zero delay ({CALIBRATION_TOKENS} laps)...")
            calibration = calibration_from(await run(probe), scenario)
            if cache is not None:
                cache[probe] = calibration
        if requested == "auto":
            chosen = choose(scenario, calibration, compensate=compensate, budget_s=budget_s)
        else:
            chosen = summary_for(scenario, float(requested), f"{requested:g}", calibration,
                                 overhead_ms=calibration.overhead_ms, reason="as requested")
        log(f"dilation: D = {chosen.factor:g} ({chosen.reason}); base one-way "
            f"{', '.join(f'{b:.2f}' for b in chosen.base_ms or calibration.base_ms)} ms")
        return chosen
    return summary_for(scenario, float(requested), f"{float(requested):g}", reason="as requested")


def undilated_on_simulated_time(scenario: Scenario, shaper_kind: str, dilation: float | str, compensate: bool,
                                log: Callable[[str], None]) -> tuple[float, bool]:
    """A simulated backend is exact: it runs undilated (saying so where a factor was asked for), and a lap must take
    some simulated time, or it has no rate."""
    if scenario.emulated_compute_s + scenario.t_ring_s <= 0:
        raise ConfigError(f"on the {shaper_kind} backend a lap with no emulated compute (compute_ms = 0 everywhere) on "
                          "links of 0 ms takes no simulated time, so it has no rate: give a stage compute_ms or "
                          "a link a delay", source=scenario.source, key="stages.compute_ms")
    if dilation not in (1, 1.0, "1", "auto") or compensate:
        log(f"the {shaper_kind} backend is exact: --dilation {dilation}{' --compensate' if compensate else ''} "
            "does not apply (ignored)")
    return 1.0, False
