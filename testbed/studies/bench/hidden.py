"""bench, section 3c: the hidden-size sweep (seed 000 Eq. 1 on a rated link), each real backend against virtual."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table

HIDDEN_BASE = "table2-regional"  # 3 x 7 ms, C = 33 ms: the Table 2 row where serialization shows most
HIDDEN_PRESET = "llama-3.1-8b"  # the emulated model on the wire (bf16), its d_model set by each row
HIDDEN_RATE_MBIT = 100.0  # every link: a 16,384-wide hidden state (32 KiB) takes 2.6 ms a hop
HIDDEN_SIZES = (1024, 4096, 8192, 16384)
HIDDEN_SIZES_QUICK = (1024, 16384)
HIDDEN_VARIANT = "auto"  # each real backend at auto dilation (virtual is exact: it has no dilation)


def hidden_rows(quick: bool) -> dict[int, str]:
    """d_model -> its row (a scenario and its --set overrides, as bench.measure.run_rows takes them)."""
    return {d: f'{HIDDEN_BASE};geometry.preset="{HIDDEN_PRESET}";geometry.d_model={d};'
               f"network.rate_mbit={HIDDEN_RATE_MBIT:g}"
            for d in (HIDDEN_SIZES_QUICK if quick else HIDDEN_SIZES)}


def hidden_sweep(console: Console, shapers: list[str], quick: bool, rows_on: Callable) -> list[dict]:
    """Every row on virtual (the reference) and on each of `shapers` (`rows_on`: bench.measure's, which runs rows
    on a backend); the table; its figures (the JSON)."""
    rows = hidden_rows(quick)
    tokens = 12 if quick else 24
    by_shaper = {}
    for shaper in dict.fromkeys(["virtual", *shapers]):
        console.print(f"hidden-size sweep: {len(rows)} rows on the {shaper} backend ({tokens} tokens each)...")
        results = rows_on(shaper, tuple(rows.values()), tokens, console, HIDDEN_VARIANT)
        if results:
            by_shaper[shaper] = {r.scenario: r.summary for r in results}
    return hidden_table(console, rows, by_shaper)


def hidden_table(console: Console, rows: dict[int, str], by_shaper: dict[str, dict]) -> list[dict]:
    """Section 3c: per hidden size, the bytes a hop carries, the closed form and the virtual run (exact), and each
    real backend's rate with its error against the virtual run of the same row (the emulated compute's real-time
    overshoot included) and against its own prediction (with the compute it measured: the links' share)."""
    reference = by_shaper["virtual"]
    real = [shaper for shaper in by_shaper if shaper != "virtual"]
    table = Table(title=f"3c. hidden-size sweep: {HIDDEN_BASE} ({HIDDEN_PRESET}'s frames, bf16) at "
                        f"{HIDDEN_RATE_MBIT:g} Mbit/s a link: each real backend against the virtual reference")
    for column in ("d_model", "bytes/hop", "serial. ms/lap", "predicted tok/s", "virtual tok/s", "virtual err",
                   *(f"{shaper} {what}" for shaper in real for what in ("tok/s", "err % vs virtual", "err % own"))):
        table.add_column(column, justify="right")
    out = []
    for d_model, spec in rows.items():
        ref = reference[spec]
        figures = {"d_model": d_model, "bytes_per_hop": ref.per_hop[0].bytes_per_lap,
                   "serialization_ms": ref.serialization_s * 1e3, "predicted_tok_s": ref.predicted_tok_s,
                   "virtual_tok_s": ref.measured_tok_s, "virtual_error_pct": ref.error_pct}
        cells = []
        for shaper in real:
            mine = by_shaper[shaper].get(spec)
            err = None if mine is None else (mine.measured_tok_s / ref.measured_tok_s - 1) * 100
            # its own error: against the closed form with the compute it measured (what is left is the links')
            figures[shaper] = {"tok_s": None if mine is None else mine.measured_tok_s, "error_vs_virtual_pct": err,
                               "error_pct": None if mine is None else mine.error_pct,
                               "dilation": None if mine is None or mine.dilation is None else mine.dilation.factor}
            cells += ["-"] * 3 if mine is None else [f"{mine.measured_tok_s:.3f}", f"{err:+.2f}", f"{mine.error_pct:+.2f}"]
        table.add_row(f"{d_model:,}", f"{ref.per_hop[0].bytes_per_lap:,}", f"{ref.serialization_s * 1e3:.3f}",
                      f"{ref.predicted_tok_s:.4f}", f"{ref.measured_tok_s:.4f}", f"{ref.error_pct:+.1e}%", *cells)
        out.append(figures)
    console.print(table)
    return out
