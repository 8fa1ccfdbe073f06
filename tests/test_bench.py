"""The benchmark's fidelity table: every Table 2 row, every variant side by side (from recorded summaries)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
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


def test_the_hidden_size_sweep_on_virtual_time_is_eq_1_on_the_wire_and_the_closed_form():
    """Section 3c's rows on the virtual reference: each hop carries the emulated hidden state (d_model x 2 bytes,
    bf16) plus the frame's header and stamps, its serialization at the link's rate is in the prediction, and the
    run meets it to 1e-6 (a real backend's row in the section is its rate against these)."""
    from agents.process import wire
    from testbed.studies.bench.hidden import HIDDEN_RATE_MBIT, HIDDEN_SIZES_QUICK, hidden_sweep
    from testbed.studies.bench.measure import rows_on

    console = Console(width=400, record=True)
    rows = hidden_sweep(console, ["virtual"], quick=True, rows_on=rows_on)
    assert [row["d_model"] for row in rows] == list(HIDDEN_SIZES_QUICK)
    for row in rows:
        frame = row["d_model"] * 2 + wire.HEADER.size  # Eq. 1: n_tok x d_model x b, and the frame's header
        assert frame < row["bytes_per_hop"] <= frame + 3 * wire.STAMP.size  # and a stamp per stage it has passed
        assert abs(row["virtual_error_pct"]) < 1e-4  # percent: 1e-6 relative
        assert row["virtual_tok_s"] < 1 / 0.054  # below the unrated row's wall (C = 33 ms, T_ring = 21 ms)
    wide, narrow = rows[-1], rows[0]
    extra_s = 3 * (wide["bytes_per_hop"] - narrow["bytes_per_hop"]) / (HIDDEN_RATE_MBIT * 1e6 / 8)
    assert 1 / wide["virtual_tok_s"] - 1 / narrow["virtual_tok_s"] == pytest.approx(extra_s, rel=1e-6)
    assert "3c. hidden-size sweep" in console.export_text()


def test_the_quick_bench_runs_the_first_figures_only_and_the_full_bench_every_section(monkeypatch):
    """--quick: relay precision, per-hop overhead (2, 2b) and the quick Table 2 rows undilated and at auto beside
    virtual (3, 3b), in minutes; every later section is the full bench's (each faked here, and counted)."""
    import argparse

    from testbed.studies.bench import measure

    called: list[str] = []

    def fake(name, value):
        def section(*args, **kwargs):
            called.append(name)
            return value
        return section

    monkeypatch.setattr(measure, "relay_table", fake("relay", []))
    monkeypatch.setattr(measure, "overhead_table", fake("overhead", {}))
    monkeypatch.setattr("testbed.studies.bench.hop.hop_breakdown_table", fake("hop", {}))
    for module, name in (("hidden", "hidden_sweep"), ("launcher", "launcher_cost_table"), ("agents", "agents_table"),
                         ("scale", "scale_table"), ("virtual", "virtual_scale_table"), ("soak", "soak_line"),
                         ("studies", "studies_table")):
        monkeypatch.setattr(f"testbed.studies.bench.{module}.{name}", fake(name, []))
    ran: list[tuple] = []
    monkeypatch.setattr(measure, "rows_on", lambda shaper, rows, tokens, console, only=None: ran.append(
        (shaper, rows, tokens, only)) or [result(shaper, row, label, 1.0, 0.0) for row in rows
                                          for label, _, _ in measure.variants_of(shaper, only)])

    def bench(quick: bool) -> dict:
        called.clear()
        ran.clear()
        args = argparse.Namespace(quick=quick, shapers="virtual,userspace", only="all", json=None)
        return measure.run(args, Console(width=400, record=True))

    figures = bench(quick=True)
    assert called == ["relay", "overhead", "hop"]
    assert set(figures) == {"fidelity", "relay", "overhead", "hop", "against_virtual"}
    assert ran == [(shaper, measure.QUICK_ROWS, measure.QUICK_TOKENS, measure.QUICK_VARIANTS)
                   for shaper in ("virtual", "userspace")]
    assert {f["variant"] for f in figures["fidelity"] if f["shaper"] == "userspace"} == {"D=1", "auto"}
    figures = bench(quick=False)
    assert called == ["relay", "overhead", "hop", "hidden_sweep", "launcher_cost_table", "agents_table",
                      "scale_table", "virtual_scale_table", "soak_line", "studies_table"]
    assert [(rows, only) for _, rows, _, only in ran] == [(measure.TABLE2_ROWS, None)] * 2
    assert {f["variant"] for f in figures["fidelity"] if f["shaper"] == "userspace"} == {"D=1", "auto", "auto+comp"}


def _transport_result():
    from testbed.studies.transport.result import BackendFigures, TransferRow, TransportResult

    def row(delay, size, predicted, measured, limited="", draws=(), model=(), se=0.0):
        return TransferRow("netem", "grid", delay, 1000.0 if not draws else 100.0, 0.1 if draws else 0.0, size, 1,
                           predicted, "", predicted, None, measured, limited, draws, model, se)

    rows = (row(50.0, 2 ** 20, 0.40, 0.42),  # +5%: within
            row(25.0, 2 ** 22, 0.50, 0.60),  # +20%: not
            row(1.0, 2 ** 16, 0.0052, 0.0080, "floor-limited: the backend's own 1.00 ms a transfer is 19% of the "
                "predicted 5.2 ms"),
            row(25.0, 2 ** 22, 0.60, 0.45, draws=(0.3, 0.6, 0.45), model=(0.5, 0.7, 0.6), se=0.0577))  # -25%
    figures = BackendFigures("netem", 4000.0, None, None, (), 0.001)
    return TransportResult(("netem",), True, rows, (figures,), ("a long point",), 2_870_000, 3)


def test_the_transport_section_prints_every_point_marks_what_the_backend_cannot_carry_and_sums_up():
    """bench --only transport: one line a point with the model's time, the kernel's and the error; a marked point
    with the backend's figure and its own goodput, left out of the carried count; the summary's worst errors, the
    points within 10%, and the repeated points within two standard errors of the model's mean."""
    from testbed.studies.bench.transport import transport_table

    console = Console(width=400, record=True)
    figures = transport_table(console, _transport_result())["transport"][0]
    text = console.export_text()
    assert text.count("│ grid ") == 4 and "marked" in text and "1.00 ms a transfer" in text
    assert "this point 66 Mbit/s" in text  # 64 KiB in 8 ms
    assert "0.4500 ±0.0866 [0.3000-0.6000]" in text and "0.6000 ±0.0577" in text
    assert figures["points"] == 4 and figures["within"] == 1 and figures["worst_error_pct"] == pytest.approx(53.85,
                                                                                                              abs=0.01)
    assert figures["carried_points"] == 3 and figures["carried_within"] == 1
    assert figures["carried_worst_error_pct"] == pytest.approx(-25.0)
    assert figures["repeated_points"] == 1 and figures["repeated_within_noise"] == 1
    assert figures["floor_s"] == 0.001 and len(figures["rows"]) == 4
    assert ("transport on netem: worst error +53.85%, 1 of 4 points within 10%; of the 3 the backend carries (the "
            "backend's ceiling 4000 Mbit/s, its floor 1.00 ms a transfer): worst -25.00%, 1 within 10%") in text


def test_the_transport_section_skips_cleanly_without_netem_or_user_mode_linux(monkeypatch):
    from netem.probe import Capabilities
    from testbed.studies.bench.transport import transport_section

    monkeypatch.setattr("netem.probe.probe", lambda: Capabilities(False, True, True, False, "no CAP_NET_ADMIN"))
    monkeypatch.setattr("netem.uml.uml_available", lambda: (False, "no linux.uml"))
    monkeypatch.setattr("subprocess.call", lambda *a, **k: pytest.fail("nothing may run"))
    console = Console(width=400, record=True)
    assert transport_section(console, quick=True) == {"skipped": "no CAP_NET_ADMIN; user-mode-linux unavailable "
                                                                 "(no linux.uml)"}
    assert "transport skipped: no CAP_NET_ADMIN" in console.export_text()


def test_bench_only_transport_runs_that_section_alone(monkeypatch):
    from testbed.studies.bench import STUDY, measure

    called = []
    monkeypatch.setattr("testbed.studies.bench.transport.transport_section",
                        lambda console, quick: called.append(quick) or {"transport": []})
    monkeypatch.setattr(measure, "relay_table", lambda *a, **k: pytest.fail("only the transport section"))
    args = STUDY.parser().parse_args(["--only", "transport", "--quick"])
    assert measure.run(args, Console(width=400, record=True)) == {"transport": []}
    assert called == [True]
