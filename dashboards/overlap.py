"""The dashboard's overlap parts (overlapped speculation, agents.modes.overlap): a live line and the final table."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from testbed.core.summary import RunSummary


def overlap_line(summary: RunSummary | None, wide: bool) -> Text | None:
    """K and W, the hit rate h (all K accepted x the guess right), Gamma, the gain over synchronous speculation's
    r_spec at this K (measured / predicted), and when wide the bound as W grows and the rounds dropped."""
    if summary is None or summary.overlap is None:
        return None
    o = summary.overlap
    line = Text()
    line.append("overlap ", style="bold magenta")
    line.append(f"K={o.k} W={o.window}", style="bold")
    guess = f" x guess {o.guess_rate:.2f}" if o.guess_rate is not None else ""
    line.append(f"  h {o.hit_rate:.2f} (all K {o.all_accepted_rate:.2f}{guess})  Γ {o.gamma_measured:.2f}")
    line.append(f"  ×{o.gain_measured:.2f}", style="bold green" if o.gain_measured > 1 else "bold red")
    line.append(f" / ×{o.gain_predicted:.2f} pred over sync {o.sync_predicted_tok_s:.2f} tok/s")
    if wide:
        line.append(f"  bound {o.bound_tok_s:.2f} tok/s  dropped {o.discarded} rounds", style="dim")
    return line


def overlap_parts(summary: RunSummary) -> list[str]:
    """The overlap figures of the one-line rendering (render_line); none outside the overlap mode."""
    o = summary.overlap
    if o is None:
        return []
    return [f"k={o.k}", f"window={o.window}", f"hit_rate={o.hit_rate:.3f}", f"gamma={o.gamma_measured:.2f}",
            f"gain={o.gain_measured:.3f}/{o.gain_predicted:.3f}", f"sync={o.sync_predicted_tok_s:.2f}tok/s",
            f"bound={o.bound_tok_s:.2f}tok/s"]


def overlap_table(summaries: Sequence[RunSummary]) -> Table | None:
    """The final table's overlap part: each run's rate beside its closed forms and synchronous speculation's."""
    runs = [s for s in summaries if s.overlap is not None]
    if not runs:
        return None
    table = Table(title="overlap: measured vs the closed form of its runs, the i.i.d. form, sync r_spec at this K",
                  title_justify="left", title_style="bold", header_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, collapse_padding=True)
    for name in ("scenario", "K", "W", "h", "Γ", "tok/s\nmeas", "tok/s\nruns", "tok/s\niid", "sync\nr_spec",
                 "gain\nmeas", "gain\npred", "bound\nW→∞"):
        table.add_column(name, justify="left" if name == "scenario" else "right", no_wrap=True)
    for s in runs:
        o = s.overlap
        table.add_row(s.scenario, str(o.k), str(o.window), f"{o.hit_rate:.2f}", f"{o.gamma_measured:.2f}",
                      f"{o.measured_tok_s:.2f}", f"{o.predicted_tok_s:.2f}", f"{o.expected_tok_s:.2f}",
                      f"{o.sync_predicted_tok_s:.2f}", f"{o.gain_measured:.2f}", f"{o.gain_predicted:.2f}",
                      f"{o.bound_tok_s:.2f}")
    return table
