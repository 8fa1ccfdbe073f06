"""The serve study's runs: a scenario served at any rate, once (Server), and the search for the highest rate whose
SLO attainment reaches the target, bracketed by the queueing model's knee so that it takes a few runs."""

from __future__ import annotations

import argparse
import dataclasses

from agents.modes.serve.queueing import knee_rate
from agents.modes.serve.settings import ServeSettings
from agents.modes.serve.summary import ring_model
from agents.modes.serve.workload import FITTED
from testbed.core.errors import ConfigError
from testbed.scenario.config import Scenario
from testbed.studies.base import dilation_of, plan_runs
from testbed.studies.serve.result import ModelError, ServeRow, ServeSearch

SEARCH_STEPS_OUT = 4  # the search doubles (halves) from the knee at most this many times: 16x either way
SEARCH_TOLERANCE = 0.05  # it bisects until the bracket's ends are within 5% of each other
SEARCH_MAX_RUNS = 12
SEARCH_RUNS_PLANNED = 7  # the budget's share per run while searching (the count is not known in advance)
RATE_DIGITS = 4  # a rate the search picks is rounded to this many significant digits (readable rows)


def at_rate(scenario: Scenario, rate: float) -> Scenario:
    return dataclasses.replace(scenario, decode=scenario.decode.with_settings(ServeSettings, rate=rate))


def knee_of(scenario: Scenario) -> float:
    settings = scenario.decode.settings(ServeSettings)
    return knee_rate(ring_model(scenario), settings.prompt_tokens, settings.output_tokens)


def rounded(rate: float) -> float:
    return float(f"{rate:.{RATE_DIGITS}g}")


class Server:
    """Serves one scenario at any rate, each rate once (a rate asked again is the row already measured)."""

    def __init__(self, scenario: Scenario, label: str, args: argparse.Namespace, target_pct: float, log) -> None:
        self.scenario, self.label, self.args, self.target_pct, self.log = scenario, label, args, target_pct, log
        self.rows: dict[float, ServeRow] = {}
        self.shaper = "?"

    async def row(self, rate: float) -> ServeRow:
        if rate in self.rows:
            return self.rows[rate]
        from testbed.launch.launcher import run_scenario

        summary = await run_scenario(at_rate(self.scenario, rate), self.args.shaper, log=self.passed_on,
                                     dilation=self.args.dilation, compensate=self.args.compensate)
        self.shaper, serve = summary.shaper, summary.serve
        if serve is None:
            raise ConfigError(f"the run at {rate:g} req/s served no request: raise --requests or --duration",
                              key="--requests")
        attainment = serve.measured.slo_attainment_pct
        row = ServeRow(rate, serve.workload, serve.measured, serve.predicted,
                       ModelError.of(serve.measured, serve.predicted),
                       None if attainment is None else attainment >= self.target_pct, **dilation_of(summary),
                       records=serve.records)
        self.rows[rate] = row
        self.log(progress(self.label, row))
        return row

    def passed_on(self, line: str) -> None:
        """Of a run's own lines, the two a study's reader needs: the requests the model's context fitted
        (agents.modes.serve.workload.FITTED) and, on simulated time, the virtual engine's speed."""
        if line.startswith("virtual time: ") or FITTED in line:
            self.log(f"  {self.label}: {line}")

    def measured(self, rates) -> tuple[ServeRow, ...]:
        return tuple(self.rows[rate] for rate in sorted(rates))


def progress(label: str, row: ServeRow) -> str:
    m, p = row.measured, row.predicted
    def pair(measured: float, predicted: float | None) -> str:
        return f"{measured:.1f} ms" + (f" (model {predicted:.1f})" if predicted is not None else "")
    attainment = f", attainment {m.slo_attainment_pct:.1f}%" if m.slo_attainment_pct is not None else ""
    return (f"  {label} {row.rate_req_s:.4g} req/s: p50 TTFT {pair(m.median_ttft_ms, p and p.median_ttft_ms)}, "
            f"p50 TPOT {pair(m.median_tpot_ms, p and p.median_tpot_ms)}, {m.completed} requests{attainment}")


async def search(server: Server, knee: float, target_pct: float) -> ServeSearch:
    """The highest rate meeting the target: from the knee out by doubling (or halving) until the bracket holds a
    met and a missed rate, then bisection to SEARCH_TOLERANCE (attainment falls as the rate rises)."""
    plan_runs(SEARCH_RUNS_PLANNED)
    tried: set[float] = set()

    async def met(rate: float) -> bool:
        tried.add(rate)
        return bool((await server.row(rate)).met)

    low = high = None
    rate = rounded(knee)
    if await met(rate):
        low = rate
        for _ in range(SEARCH_STEPS_OUT):
            rate = rounded(rate * 2)
            if not await met(rate):
                high = rate
                break
            low = rate
    else:
        high = rate
        for _ in range(SEARCH_STEPS_OUT):
            rate = rounded(rate / 2)
            if await met(rate):
                low = rate
                break
            high = rate
    if low is None:
        wall = ring_model(server.scenario).lap_s(1) * 1e3
        reason = (f"missed at every rate down to {high:.4g} req/s ({2 ** -SEARCH_STEPS_OUT:g} x the knee): the "
                  f"targets are below what light load gives (a request alone: TPOT {wall:.1f} ms, TTFT Eq. 5)")
    elif high is None:
        targets = server.scenario.decode.settings(ServeSettings).goodput_targets()
        why = ("past the knee the queue grows for the whole run, but this run's requests do not build it past the "
               "TTFT / E2EL target: more requests (or --duration) would" if targets is not None and
               (targets.ttft_ms is not None or targets.e2el_ms is not None) else
               "past the knee the cap holds TPOT and the queue takes the excess: only a TTFT or E2EL target bounds it")
        reason = f"met at every rate up to {low:.4g} req/s ({2 ** SEARCH_STEPS_OUT:g} x the knee; a lower bound): {why}"
    else:
        while high / low > 1 + SEARCH_TOLERANCE and len(tried) < SEARCH_MAX_RUNS:
            middle = rounded((low + high) / 2)
            if middle in (low, high):
                break
            if await met(middle):
                low = middle
            else:
                high = middle
        within = high / low <= 1 + SEARCH_TOLERANCE
        reason = (f"bracketed to {(high / low - 1) * 100:.1f}%" + ("" if within else
                  f" (stopped after {SEARCH_MAX_RUNS} runs)") + f": met at {low:.4g}, missed at {high:.4g} req/s")
    return ServeSearch(target_pct, knee, low, high, len(tried), reason)
