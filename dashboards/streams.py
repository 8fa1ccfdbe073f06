"""The dashboard's streams parts (the streams mode, M sequences in flight): a live line and the final table."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from dashboards.style import error_style as _error_style
from dashboards.style import stage_names as _stage_names
from testbed.core.summary import RunSummary

def _busiest(summary: RunSummary) -> tuple[str, float, float]:
    """(name, measured, predicted utilization) of the stage busiest in the streams window."""
    streams, names = summary.streams, _stage_names(summary)
    i = max(range(len(streams.stage_busy)), key=lambda k: streams.stage_busy[k])
    return names[i] if i < len(names) else f"stage {i}", streams.stage_busy[i], streams.stage_busy_predicted[i]


def streams_line(summary: RunSummary | None, wide: bool) -> Text | None:
    """M streams: aggregate and per-stream (p50, min) rates vs predicted, the ceiling, the busiest stage.

    One line when wide, two otherwise (aggregate and ceiling; per stream and the busiest stage).
    """
    if summary is None or summary.streams is None:
        return None
    st = summary.streams
    name, busy, busy_predicted = _busiest(summary)
    line = Text()
    line.append("streams ", style="bold blue")
    line.append(f"M={st.streams}", style="bold")
    line.append(f" {st.batching}", style="dim")
    line.append("  aggregate ")
    line.append(f"{st.aggregate_tok_s:.2f}", style="bold")
    line.append(f" tok/s (pred {st.aggregate_predicted_tok_s:.2f}, ")
    line.append(f"{st.aggregate_error_pct:+.1f}%", style=_error_style(st.aggregate_error_pct))
    line.append(f")  ceiling {st.ceiling_tok_s:.1f}")
    line.append("  per stream p50 " if wide else "\n  per stream p50 ")
    line.append(f"{st.per_stream_p50_tok_s:.2f}", style="bold")
    line.append(f" min {st.per_stream_min_tok_s:.2f} (pred {st.per_stream_predicted_tok_s:.2f})")
    line.append(f"  busiest {name} ")
    line.append(f"{busy:.0%}", style="bold")
    line.append(f" (pred {busy_predicted:.0%})")
    return line


def streams_table(summaries: Sequence[RunSummary]) -> Table | None:
    """The final table's streams part: per-stream rates vs predicted, ceiling and busiest stage of each run."""
    runs = [s for s in summaries if s.streams is not None]
    if not runs:
        return None
    table = Table(title="streams: per stream vs predicted (the aggregate is the rate above)", title_justify="left",
                  title_style="bold", header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    table.add_column("scenario", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("M", justify="right", no_wrap=True)
    table.add_column("batching", no_wrap=True)
    for name in ("stream\np50", "stream\nmin", "stream\npred", "ceiling\ntok/s"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("busiest\nstage", no_wrap=True, overflow="ellipsis", max_width=12)
    table.add_column("busy\nmeas/pred", justify="right", no_wrap=True)
    for summary in runs:
        st = summary.streams
        name, busy, busy_predicted = _busiest(summary)
        table.add_row(summary.scenario, str(st.streams), st.batching, f"{st.per_stream_p50_tok_s:.2f}",
                      f"{st.per_stream_min_tok_s:.2f}", f"{st.per_stream_predicted_tok_s:.2f}",
                      f"{st.ceiling_tok_s:.1f}", name, f"{busy:.0%}/{busy_predicted:.0%}")
    return table


def streams_parts(summary: RunSummary) -> list[str]:
    """The streams figures of the one-line rendering (render_line); none without streams."""
    if summary.streams is None:
        return []
    st = summary.streams
    _name, busy, _predicted = _busiest(summary)
    return [f"streams={st.streams}", f"batching={st.batching}",
            f"aggregate={st.aggregate_tok_s:.2f}/{st.aggregate_predicted_tok_s:.2f}tok/s",
            f"per_stream_p50={st.per_stream_p50_tok_s:.2f}", f"per_stream_min={st.per_stream_min_tok_s:.2f}",
            f"per_stream_predicted={st.per_stream_predicted_tok_s:.2f}tok/s",
            f"ceiling={st.ceiling_tok_s:.2f}tok/s", f"busiest={busy:.2f}"]
