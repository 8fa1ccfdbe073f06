"""One auto-dilation budget for every run of a study, and one calibration per stages-and-links for them all."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from testbed.core.summary import RunSummary

# A study's default (--budget-s on every study command): the dilated prefill and decode of all its runs. The default
# with the most runs, dsd's 22, then gets ~11 s a run, which leaves its rows' start-ups and calibrations
# room inside 10 minutes. A share only caps D: a run whose 0.3% needs less takes less (testbed.launch.dilation).
STUDY_BUDGET_S = 240.0


@dataclass
class StudyBudget:
    """What a study's runs may spend, dilated (box seconds, `(prefill + tokens x lap) x D` each), shared out as they
    start: a run gets an even share of what the runs before it left over the runs the study still plans
    (`plan_runs`; a study that plans nothing, one run at a time: all that is left)."""

    total_s: float
    planned: int = 0  # runs still to come, this one included (0: the study did not say)
    spent_s: float = 0.0
    runs: int = 0
    calibrations: dict = field(default_factory=dict)  # dilation.resolve's cache: a scenario calibrates once

    def share_s(self) -> float:
        return max(MIN_SHARE_S, max(0.0, self.total_s - self.spent_s) / max(1, self.planned))

    def charge(self, summary: RunSummary) -> RunSummary:
        """Count a finished run's dilated prefill and decode against the budget (what auto's forecast weighed): the
        entry's own box time from its run command to its end where it reported it, else the prefill and the decode
        laps' time x D (which overcounts a run of many requests in flight: their laps overlap)."""
        factor = summary.dilation.factor if summary.dilation is not None else 1.0
        prefill_s = summary.ttft.measured_s if summary.ttft is not None else 0.0
        entry = next((agent.box_wall_s for agent in getattr(summary, "agents", ()) if agent.stage == 0), None)
        self.spent_s += entry if entry is not None else (prefill_s + summary.wall_s) * factor
        self.runs += 1
        self.planned = max(0, self.planned - 1)
        return summary


MIN_SHARE_S = 1e-3  # a spent budget: D = 1 (and the run says the budget capped it)
_ACTIVE: list[StudyBudget] = []


@contextlib.contextmanager
def study_budget(total_s: float) -> Iterator[StudyBudget]:
    """Every run_scenario inside shares one budget of `total_s` seconds and its calibrations."""
    budget = StudyBudget(total_s)
    _ACTIVE.append(budget)
    try:
        yield budget
    finally:
        _ACTIVE.remove(budget)


def plan_runs(runs: int) -> None:
    """A study says how many runs it is about to make (its rows), so each gets an even share."""
    if _ACTIVE:
        _ACTIVE[-1].planned = max(1, runs)


def run_budget(budget_s: float, calibrations: dict | None
               ) -> tuple[float, dict | None, Callable[[RunSummary], RunSummary]]:
    """(the run's budget, its calibration cache, what to call with its summary) inside a study_budget block, or
    what the run was given (and nothing to count) outside one."""
    if not _ACTIVE:
        return budget_s, calibrations, lambda summary: summary
    budget = _ACTIVE[-1]
    return budget.share_s(), budget.calibrations if calibrations is None else calibrations, budget.charge
