"""The faults study in the report: `testbed faults --json` results (told apart by their "fault_rows") checked and
tabled, every row's mean and p99 lap measured next to the model, and whether the output equals the clean run's."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.core.errors import ConfigError
from testbed.studies.faults.measure import FaultRow, FaultsResult
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.base import Sourced

FAULTS = ("jitter", "loss")
ROW_NON_NEGATIVE = ("value", "lap_ms", "lap_ms_p99", "predicted_ms", "predicted_ms_p99", "lost_pct",
                    "predicted_lost_ms", "model_penalty_ms", "per_loss_ms")


def check_fault_row(row: FaultRow, source: str, where: str) -> None:
    """A row's fault is known and its laps, times and shares are numbers; errors name the field."""
    check_text(row.fault, source, f"{where}.fault", FAULTS)
    check_count(row.laps, 1, source, f"{where}.laps")
    for key in ROW_NON_NEGATIVE:
        check_number(getattr(row, key), source, f"{where}.{key}", minimum=0.0)
    check_number(row.error_pct, source, f"{where}.error_pct")
    check_number(row.penalty_ms, source, f"{where}.penalty_ms")  # a loss row can come out below the clean one
    if not isinstance(row.same_output, bool):
        raise ConfigError(f"expected true or false, got {row.same_output!r}", source=source,
                          key=f"{where}.same_output")


def parse_faults(data: dict, source: str) -> Sourced[FaultsResult]:
    """A `testbed faults --json` object -> a checked FaultsResult; field errors become ConfigError."""
    result = record_from(FaultsResult, data, source, "a faults result")
    check_text(result.scenario, source, "scenario")
    check_text(result.shaper, source, "shaper")
    for key in ("compute_ms", "t_ring_ms", "rto_ms"):
        check_number(getattr(result, key), source, key, minimum=0.0)
    check_count(result.n_hops, 0, source, "n_hops")
    if not isinstance(result.fault_rows, tuple) or not result.fault_rows:
        raise ConfigError(f"expected a non-empty list of rows, got {result.fault_rows!r}", source=source,
                          key="fault_rows")
    for i, row in enumerate(result.fault_rows):
        check_fault_row(row, source, f"fault_rows[{i}]")
    return Sourced(source, result)


def _label(row: FaultRow) -> str:
    return f"jitter {row.value:g} ms" if row.fault == "jitter" else f"loss {row.value:g}%"


def faults_markdown(items: Sequence[Sourced[FaultsResult]]) -> list[str]:
    """The faults section's body: the model, then a table per result (one backend)."""
    lines = ["Every link with the row's jitter (a standard deviation) or loss, greedy decoding. Predicted: jitter "
             "C + sum of max(0, l + σZ) per hop; loss C + T_ring + k RTO with k ~ Binomial(N, p), and with the share "
             "of hops that did take a timeout (the seeded draws). The output must equal the clean run's.", ""]
    for item in items:
        r = item.result
        lines += [f"{item.source}: {r.scenario}, shaper {r.shaper}, C {r.compute_ms:.1f} ms, T_ring "
                  f"{r.t_ring_ms:.1f} ms, RTO {r.rto_ms:g} ms, {r.n_hops} hops.", "",
                  "| source | fault | laps | mean lap measured (ms) | predicted (ms) | error (%) | p99 measured (ms) "
                  "| p99 predicted (ms) | hops lost (%) | predicted with that (ms) | output |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for row in r.fault_rows:
            loss = row.fault == "loss" and row.value > 0
            lines.append(f"| {item.source} | {_label(row)} | {row.laps} | {row.lap_ms:.1f} | {row.predicted_ms:.1f} | "
                         f"{row.error_pct:+.2f} | {row.lap_ms_p99:.1f} | {row.predicted_ms_p99:.1f} | "
                         + (f"{row.lost_pct:.2f} | {row.predicted_lost_ms:.1f} | " if loss else "– | – | ")
                         + ("identical |" if row.same_output else "DIFFERENT |"))
        lines.append("")
    return lines
