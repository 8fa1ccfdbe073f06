"""The transport study's records: a transfer measured beside its prediction (TransferRow), what each backend's
rows give (BackendFigures: its ceiling, the window's cap, slow start's rounds), and the study (TransportResult:
what `testbed transport --json` writes)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.core.records import JsonRecord


def standard_error(values: Sequence[float]) -> float:
    """The standard error of a mean of draws (0 for one draw: nothing to say of its spread)."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class TransferRow(JsonRecord):
    """One transfer on one backend: S bytes on n fresh connections over one link, predicted and measured. A lossy
    point is the mean of its repeats: each draw's measured and modelled times are kept, in seed order (repeat i on
    seed i x grid.SEED_STRIDE), and model_s and measured_s are their means; its predicted_s is the model's
    expectation (its mean over grid.MODEL_SEEDS seeds), with that mean's standard error."""

    backend: str
    purpose: str  # grid, cap, slow start (testbed.studies.transport.grid.Point.purpose)
    delay_ms: float  # one way; RTT = 2 x delay_ms
    rate_mbit: float  # 0: unlimited
    loss_pct: float
    size_bytes: int
    connections: int
    predicted_s: float
    how: str  # how the prediction was had (grid.predict)
    model_s: float  # testbed.core.tcp.TcpFlow replayed as the virtual link runs it
    mathis_s: float | None  # with loss: S / (n x Mathis' rate) + one way
    measured_s: float
    limited: str = ""  # "": fitted; else why not (the link's rate is over what the backend itself carries)
    measured_draws_s: tuple[float, ...] = ()  # a repeated point's every measured time (empty: one transfer)
    model_draws_s: tuple[float, ...] = ()  # and the model's, each on the same seed
    predicted_se_s: float = 0.0  # a lossy prediction's standard error (the model's mean over its seeds)

    @property
    def rtt_ms(self) -> float:
        return 2 * self.delay_ms

    @property
    def error_pct(self) -> float:
        return (self.measured_s / self.predicted_s - 1) * 100

    @property
    def model_error_pct(self) -> float:
        return (self.measured_s / self.model_s - 1) * 100

    @property
    def repeats(self) -> int:
        return max(1, len(self.measured_draws_s))

    @property
    def measured_se_s(self) -> float:
        return standard_error(self.measured_draws_s)

    @property
    def model_se_s(self) -> float:
        return standard_error(self.model_draws_s)

    @property
    def error_se_pct(self) -> float:
        """The error's standard error, in points of percent: the measured mean's and the prediction's relative
        standard errors combined (the kernel's draws and the model's seeds are independent), scaled by the ratio."""
        ratio = self.measured_s / self.predicted_s
        return ratio * math.hypot(self.measured_se_s / self.measured_s, self.predicted_se_s / self.predicted_s) * 100


@dataclass(frozen=True)
class SlowStartRow(JsonRecord):
    """A small transfer's slow-start rounds: its time less the one way and its bytes at the rate, in RTTs."""

    size_bytes: int
    predicted_rounds: float
    measured_rounds: float


@dataclass(frozen=True)
class BackendFigures(JsonRecord):
    """What one backend's rows give beside the grid."""

    backend: str
    ceiling_mbit: float | None  # a zero-delay, unlimited transfer's goodput: what the backend itself carries
    window_cap_bytes: float | None  # the cap points' plateau rate x RTT (None: no cap points)
    cap_rtt_ms: float | None
    slow_start: tuple[SlowStartRow, ...] = ()
    floor_s: float | None = None  # a zero-delay, unlimited 64 KiB transfer's time: the backend's own cost a transfer


@dataclass(frozen=True)
class TransportResult(JsonRecord):
    """Every backend's transfers over the grid, beside testbed.core.tcp's predictions."""

    backends: tuple[str, ...]
    quick: bool
    transport_rows: tuple[TransferRow, ...]  # the report part's key
    figures: tuple[BackendFigures, ...]
    left_out: tuple[str, ...] = ()  # points not measured, and why
    window_cap_model_bytes: int = 0  # testbed.core.tcp.KERNEL_WINDOW_CAP_BYTES, as this run predicted with
    repeats: int = 1  # each lossy point's transfers (a loss-free point's: one)
