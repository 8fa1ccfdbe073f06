"""The benchmark's fidelity table: every Table 2 row, every variant side by side (from recorded summaries)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from testbed.studies.bench.measure import VARIANTS, VARIANTS_BY_SHAPER, RingResult, fidelity_figures, fidelity_table
from testbed.core.summary import DilationSummary, RunSummary

PLAIN = RunSummary.from_json((Path(__file__).parent / "data" / "summary-plain.json").read_text())


def result(shaper: str, row: str, variant: str, factor: float, error_pct: float) -> RingResult:
    dilation = None if factor == 1 else DilationSummary(factor=factor, requested="auto")
    summary = dataclasses.replace(PLAIN, error_pct=error_pct, dilation=dilation)
    return RingResult(shaper, row, variant, summary.t_ring_s, 12.5, summary)


def test_the_fidelity_table_puts_every_variant_of_a_row_on_one_line():
    rows = ("table2-metro", "table2-global")
    results = [result("userspace", row, label, 1.0 if label == "D=1" else 24.0, -5.0 if label == "D=1" else -0.3)
               for row in rows for label, _, _ in VARIANTS]
    console = Console(width=400, record=True)
    console.print(fidelity_table("userspace", rows, results))
    text = console.export_text()
    lines = [line for line in text.splitlines() if line.strip("│ ").startswith(("metro ", "global "))]
    assert len(lines) == 2
    for line in lines:
        assert line.count("-5.00") == 1 and line.count("-0.30") == 2 and line.count("24") == 2
    figures = fidelity_figures(results[1])
    assert figures["variant"] == "auto" and figures["dilation"] == 24.0 and figures["error_pct"] == -0.3
    assert len(figures["hop_error_ms_p50"]) == len(PLAIN.per_hop)


def test_netem_rows_skip_compensation():
    assert [label for label, _, _ in VARIANTS_BY_SHAPER["netem"]] == ["D=1", "auto"]
    rows = ("table2-metro",)
    results = [result("netem", "table2-metro", label, 1.0, -1.0) for label, _, _ in VARIANTS_BY_SHAPER["netem"]]
    console = Console(width=400, record=True)
    console.print(fidelity_table("netem", rows, results))
    assert "auto+comp" not in console.export_text()
