"""The dashboard's serve parts (the serve mode, a workload of requests): a live line and the final table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agents.modes import MODES
from agents.modes.serve.facts import Prediction, ServeSummary, ServingMetrics
from dashboards.plots import DASH
from dashboards.style import error_style as _error_style
from testbed.core.summary import RunSummary

# The final table's rows: vLLM's label (as `vllm bench serve` prints it), the field of ServingMetrics and of the
# Prediction (None: the queueing model has no figure of its own for it), the number format.
COUNT_ROWS: Final = (("Successful requests", "completed", None, "d"), ("Aborted requests", "aborted", None, "d"))
RATE_ROWS: Final = (("Benchmark duration (s)", "duration_s", "duration_s", ".2f"),
                    ("Request throughput (req/s)", "request_throughput", "request_throughput", ".2f"),
                    ("Output token throughput (tok/s)", "output_throughput", "output_throughput", ".2f"))
LATENCIES: Final = (("TTFT", "ttft", True), ("TPOT", "tpot", True), ("ITL", "itl", False), ("E2EL", "e2el", True),
                    ("queueing", "queue", True))  # (label, field stem, predicted by the queueing model)
STATISTICS: Final = (("Mean", "mean"), ("Median", "median"), ("P99", "p99"))
SLO_ROWS: Final = (("Request goodput (req/s)", "request_goodput", None, ".2f"),
                   ("SLO attainment (%)", "slo_attainment_pct", None, ".1f"))


def _serving(summary: RunSummary | None) -> ServeSummary | None:
    return None if summary is None else summary.serve


def _makes_serve_parts(summary: RunSummary) -> bool:
    """Its mode's part of the summary is a ServeSummary (none yet: no request has ended)."""
    info = MODES.get(summary.mode)
    return info is not None and info.summary is ServeSummary


def _in_flight(serve: ServeSummary) -> tuple[int, int]:
    """(running, waiting) at the entry's latest step."""
    return serve.running, serve.waiting


def _ms(value_ms: float) -> str:
    return f"{value_ms:.0f}" if value_ms >= 10 else f"{value_ms:.1f}"


def _percentiles(measured: ServingMetrics, stem: str) -> str:
    """'p50 A p99 B' of a latency (ms), dashes before a request has its figure (vLLM reports 0 there)."""
    if measured.completed == 0:
        return f"p50 {DASH} p99 {DASH}"
    return f"p50 {_ms(getattr(measured, f'median_{stem}_ms'))} p99 {_ms(getattr(measured, f'p99_{stem}_ms'))}"


def serve_line(summary: RunSummary | None, wide: bool) -> Text | None:
    """Requests running, waiting and done, the request rate, p50 and p99 TTFT and TPOT so far beside the light-load
    predictions (Eq. 5's TTFT, the wall's TPOT), the SLO attainment if set; when wide, the queueing percentiles and
    the queueing model's p50s too.

    Two lines (the requests; the latencies), each within 120 columns when wide. None outside the serve mode.
    """
    serve = _serving(summary)
    if serve is None:
        if summary is None or not _makes_serve_parts(summary):
            return None
        return Text.assemble(("serve ", "bold blue"), ("no request has ended yet", "dim"))
    measured, predicted = serve.measured, serve.predicted
    line = Text()
    line.append("serve ", style="bold blue")
    counts = _in_flight(serve)
    if counts is not None:
        line.append("running ")
        line.append(str(counts[0]), style="bold")
        line.append(" waiting ")
        line.append(str(counts[1]), style="bold")
        line.append(" ")
    line.append("done ")
    line.append(str(measured.completed + measured.aborted), style="bold")
    if measured.aborted:
        line.append(f" ({measured.aborted} aborted)", style="yellow")
    line.append("  ")
    line.append(f"{measured.request_throughput:.2f}", style="bold")
    line.append(" req/s")
    if measured.slo_attainment_pct is not None:
        line.append(f"  SLO {measured.slo_attainment_pct:.0f}%", style="bold")
    if wide:
        line.append("  queueing ")
        line.append(_percentiles(measured, "queue"), style="bold")
        line.append(" ms")
    line.append("\n  TTFT ")
    line.append(_percentiles(measured, "ttft"), style="bold")
    model = f", model p50 {_ms(predicted.median_ttft_ms)}" if wide and predicted is not None else ""
    line.append(f" ms (light {_ms(serve.light_ttft_ms)}{model})")
    line.append("  TPOT ")
    line.append(_percentiles(measured, "tpot"), style="bold")
    model = f", model p50 {_ms(predicted.median_tpot_ms)}" if wide and predicted is not None else ""
    line.append(f" ms (wall {_ms(serve.wall_tpot_ms)}{model})")
    return line


def serve_parts(summary: RunSummary) -> list[str]:
    """The serve figures of the one-line rendering (render_line); none outside the serve mode."""
    serve = summary.serve
    if serve is None:
        return []
    measured = serve.measured
    counts = _in_flight(serve)
    parts = [f"running={counts[0]}", f"waiting={counts[1]}"] if counts is not None else []
    parts += [f"done={measured.completed + measured.aborted}", f"aborted={measured.aborted}",
              f"req_rate={measured.request_throughput:.2f}req/s"]
    for stem, name, light_ms in (("ttft", "light", serve.light_ttft_ms), ("tpot", "wall", serve.wall_tpot_ms)):
        for statistic, short in (("median", "p50"), ("p99", "p99")):
            value = getattr(measured, f"{statistic}_{stem}_ms") if measured.completed else None
            parts.append(f"{stem}_{short}={'-' if value is None else f'{value:.1f}'}ms")
        parts.append(f"{stem}_{name}={light_ms:.1f}ms")
    if measured.slo_attainment_pct is not None:
        parts.append(f"slo_attainment={measured.slo_attainment_pct:.1f}%")
    return parts


def _rows(measured: ServingMetrics, predicted: Prediction | None) -> list[tuple[str, float, float | None, str]]:
    """(label, measured, predicted or None, format) of every figure the run has."""
    rows = [(label, getattr(measured, field), None, spec) for label, field, _, spec in COUNT_ROWS
            if field == "completed" or getattr(measured, field)]
    rows += [(label, getattr(measured, field), getattr(predicted, own) if predicted is not None else None, spec)
             for label, field, own, spec in RATE_ROWS]
    for name, stem, modelled in LATENCIES:
        for label, statistic in STATISTICS:
            field = f"{statistic}_{stem}_ms"
            rows.append((f"{label} {name} (ms)", getattr(measured, field),
                         getattr(predicted, field) if modelled and predicted is not None else None, ".2f"))
    rows += [(label, getattr(measured, field), None, spec) for label, field, _, spec in SLO_ROWS
             if getattr(measured, field) is not None]
    return rows


def _caption(serve: ServeSummary) -> str:
    """The workload, and the predictions the rows do not show: light load, saturation, the queueing model's regime."""
    text = (f"workload: {serve.workload}. Light load: TTFT {serve.light_ttft_ms:.2f} ms (Eq. 5), TPOT "
            f"{serve.wall_tpot_ms:.2f} ms (the wall, C + T_ring); saturation: {serve.ceiling_tok_s:.2f} tok/s")
    predicted = serve.predicted
    if predicted is None:
        return text + "; no request completed, so no queueing prediction"
    return (text + f"; predicted by the queueing model at {predicted.rate_req_s:.2f} req/s, {predicted.regime} "
            f"({predicted.knee_rate_req_s:.2f} req/s); ITL has no prediction of its own")


def _run_table(summary: RunSummary, serve: ServeSummary) -> Table:
    table = Table(title=f"serve {summary.scenario}: vLLM's figures, measured vs predicted",
                  title_justify="left", title_style="bold", header_style="bold", caption=_caption(serve),
                  caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column("figure", no_wrap=True)
    for name in ("measured", "predicted", "error %"):
        table.add_column(name, justify="right", no_wrap=True)
    for label, measured, predicted, spec in _rows(serve.measured, serve.predicted):
        error = (measured / predicted - 1) * 100 if predicted else None
        table.add_row(label, format(measured, spec), DASH if predicted is None else format(predicted, spec),
                      Text(DASH if error is None else f"{error:+.1f}", style=_error_style(error)))
    return table


def serve_table(summaries: Sequence[RunSummary]) -> RenderableType | None:
    """The final table's serve part: each serve run's figures under vLLM's names, measured beside predicted."""
    tables = [_run_table(s, s.serve) for s in summaries if s.serve is not None]
    if not tables:
        return None
    return Group(tables[0], *(part for t in tables[1:] for part in (Text(), t))) if len(tables) > 1 else tables[0]
