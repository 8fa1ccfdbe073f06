"""How the transport study's tables print a row's times: one transfer's as it is, a repeated point's as its mean
with the standard error of the mean and the draws' range beside it, so a reader can judge an error against the
noise of the draws."""

from __future__ import annotations

import math
from collections.abc import Sequence

from testbed.studies.transport.result import TransferRow, standard_error


def time_cell(mean: float | None, draws: Sequence[float] = (), fmt: str = ".4f") -> str:
    """`mean`, or for several draws "mean ±se [min-max]"."""
    if mean is None or not math.isfinite(mean):
        return ""
    if len(draws) < 2:
        return format(mean, fmt)
    return f"{mean:{fmt}} ±{standard_error(draws):{fmt}} [{min(draws):{fmt}}-{max(draws):{fmt}}]"


def error_cell(row: TransferRow) -> str:
    """The error against the prediction, percent; a repeated point's with its standard error."""
    if row.repeats < 2:
        return f"{row.error_pct:+.2f}"
    return f"{row.error_pct:+.2f} ±{row.error_se_pct:.2f}"


def predicted_cell(row: TransferRow, fmt: str = ".4f") -> str:
    """The prediction; a lossy one's (the model's mean over its seeds) "mean ±se"."""
    if not row.predicted_se_s:
        return time_cell(row.predicted_s, (), fmt)
    return f"{row.predicted_s:{fmt}} ±{row.predicted_se_s:{fmt}}"


def measured_cell(row: TransferRow, fmt: str = ".4f") -> str:
    return time_cell(row.measured_s, row.measured_draws_s, fmt)
