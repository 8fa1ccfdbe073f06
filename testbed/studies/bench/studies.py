"""bench, section 8: one small row of every study that declares one (Study.bench), measured vs predicted.

Each study runs as its command would (its options, auto dilation, one budget for the study), on each backend
of --shapers that runs studies in this process (the relay, or virtual time); its row says the D it ran at and,
where the budget capped D, the error the calibrated overhead leaves.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from testbed.studies.base import dilation_cell

STUDY_SHAPERS = ("userspace", "virtual")  # netem runs whole rings inside user-mode-linux (section 3), not studies
TARGET_PCT = 1.0  # issue 30: every row within 1% of its prediction, or its capped D's expected error beside it


def studies_table(console: Console, shapers: list[str]) -> list[dict]:
    """Every study's bench row on each backend of `shapers` it can run on here."""
    from testbed.studies import STUDIES

    rows: list[dict] = []
    table = Table(title=f"8. studies: one row of each at its defaults, measured vs predicted (auto dilation; within "
                        f"{TARGET_PCT:g}%, or the capped D's expected error)")
    for col in ("study", "shaper", "row", "measured", "predicted", "unit", "err %", "D", "within", "run s"):
        table.add_column(col, justify="right")
    for shaper in (s for s in shapers if s in STUDY_SHAPERS):
        for study in (s for s in STUDIES.values() if s.bench is not None):
            console.print(f"studies: {study.name} on {shaper} ({' '.join(study.bench.argv)})...")
            args = study.parser().parse_args([*study.bench.argv, "--shaper", shaper])
            started = time.monotonic()
            line = study.bench.line(study.measure(args, Console(quiet=True)))
            row = {"study": study.name, "shaper": shaper, "row": line.what, "unit": line.unit,
                   "measured": line.measured, "predicted": line.predicted, "error_pct": line.error_pct,
                   "dilation": line.dilation, "capped_error_pct": line.capped_error_pct,
                   "within": within(line.error_pct, line.capped_error_pct), "run_s": time.monotonic() - started}
            rows.append(row)
            table.add_row(study.name, shaper, line.what, f"{line.measured:.4g}", f"{line.predicted:.4g}", line.unit,
                          f"{line.error_pct:+.2f}", dilation_cell(line.dilation, line.capped_error_pct),
                          "yes" if row["within"] else "NO", f"{row['run_s']:.0f}")
    console.print(table)
    return rows


def within(error_pct: float, capped_error_pct: float | None) -> bool:
    """Within TARGET_PCT of the prediction, or of the error the capped D's overhead leaves."""
    expected = capped_error_pct or 0.0
    return abs(error_pct - expected) <= TARGET_PCT
