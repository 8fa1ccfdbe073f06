"""The whatif study's part of `testbed report`: each deployment's predictions, measured figures and breakdown."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.studies.whatif.measure import WhatifResult
from testbed.scenario.validate import check_number, record_from
from testbed.studies.base import Sourced


def parse(data: dict, source: str) -> Sourced[WhatifResult]:
    result = record_from(WhatifResult, data, source, "a whatif result")
    for key in ("predicted_tok_s", "ttft_predicted_s", "streams_predicted_tok_s"):
        check_number(getattr(result, key), source, key, positive=True)
    check_number(result.measured_tok_s, source, "measured_tok_s", minimum=0.0, required=False)
    return Sourced(source, result)


def _cell(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def markdown(items: Sequence[Sourced[WhatifResult]]) -> list[str]:
    lines = ["| deployment | decode tok/s pred / meas | err % | TTFT s pred / meas | speculative tok/s (K*) | "
             "streams tok/s | upgrade first | source |", "|---|---|---|---|---|---|---|---|"]
    for item in items:
        r = item.result
        spec = f"{r.spec_predicted_tok_s:.2f} (K* = {r.spec_k}, {r.draft}, a {r.alpha:g})" if r.draft else ""
        lines.append(f"| {r.whatif} | {r.predicted_tok_s:.3f} / {_cell(r.measured_tok_s, '.3f')} | "
                     f"{_cell(r.error_pct, '+.2f')} | {r.ttft_predicted_s:.3f} / {_cell(r.ttft_measured_s, '.3f')} | "
                     f"{spec} | {r.streams_predicted_tok_s:.2f} ({r.streams}) | {r.upgrade_first} | {item.source} |")
    return lines
