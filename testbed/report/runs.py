"""The report's runs section: run summaries (`testbed run --json`, `sweep --json` lists) checked and tabled,
measured vs predicted per run, per speculative run and per K of a sweep."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agents.modes.speculative.facts import SpecSummary
from testbed.core.errors import ConfigError
from testbed.core.summary import RunSummary
from testbed.scenario.validate import check_number
from testbed.studies.style import DASH, cell


NO_LAP: Final = "no decode lap measured it"  # why a figure of a run summary can be null

# The figures each report reads: a run that lacks one (e.g. no decode lap finished) cannot be reported.
# (name, read it from the summary, minimum); None as the minimum means any finite number.
REQUIRED_FIGURES: Final[tuple[tuple[str, Callable[[RunSummary], Any], float | None], ...]] = (
    ("t_ring_s", lambda s: s.t_ring_s, 0.0),
    ("compute_s", lambda s: s.compute_s, 0.0),
    ("measured_tok_s", lambda s: s.measured_tok_s, 0.0),
    ("predicted_tok_s", lambda s: s.predicted_tok_s, 0.0),
)

OPTIONAL_FIGURES: Final[tuple[tuple[str, Callable[[RunSummary], Any], float | None], ...]] = (
    ("error_pct", lambda s: s.error_pct, None),
    ("overhead_ms_per_hop", lambda s: s.overhead_ms_per_hop, None),
)

SPEC_FIGURES: Final[tuple[tuple[str, Callable[[SpecSummary], Any], float | None], ...]] = (
    ("k", lambda spec: spec.k, 1.0),
    ("alpha", lambda spec: spec.alpha, 0.0),
    ("draft_per_token_s", lambda spec: spec.draft_per_token_s, 0.0),
    ("verify_compute_s", lambda spec: spec.verify_compute_s, 0.0),
    ("gamma_measured", lambda spec: spec.gamma_measured, 0.0),
    ("gamma_predicted", lambda spec: spec.gamma_predicted, 0.0),
    ("predicted_tok_s", lambda spec: spec.predicted_tok_s, 0.0),
    ("plain_predicted_tok_s", lambda spec: spec.plain_predicted_tok_s, 0.0),
    ("k_star", lambda spec: spec.k_star, 1.0),
    ("k_star_tok_s", lambda spec: spec.k_star_tok_s, 0.0),
)


@dataclass(frozen=True)
class SourcedSummary:
    """One run summary and where it came from ("file.json", or "file.json[2]" inside a list)."""

    source: str
    summary: RunSummary


def check_reportable(summary: RunSummary, source: str) -> None:
    """The figures a report reads are present and numbers; errors name the source and the key."""
    if not isinstance(summary.scenario, str) or not summary.scenario:
        raise ConfigError(f"expected a non-empty string, got {summary.scenario!r}", source=source, key="scenario")
    for key, read, minimum in REQUIRED_FIGURES:
        check_number(read(summary), source, key, minimum=minimum, null=NO_LAP)
    for key, read, minimum in OPTIONAL_FIGURES:
        check_number(read(summary), source, key, minimum=minimum, required=False, null=NO_LAP)
    if summary.compute_s + summary.t_ring_s <= 0:
        raise ConfigError("compute_s + t_ring_s must be positive", source=source, key="compute_s")
    if summary.is_speculative and summary.spec is None:
        raise ConfigError("mode is 'speculative' but there is no spec object", source=source, key="spec")
    if summary.spec is not None:
        for key, read, minimum in SPEC_FIGURES:
            check_number(read(summary.spec), source, f"spec.{key}", minimum=minimum, null=NO_LAP)
        if summary.spec.alpha > 1.0:
            raise ConfigError(f"expected a number <= 1, got {summary.spec.alpha!r}", source=source, key="spec.alpha")


def parse_summary(data: Any, source: str) -> SourcedSummary:
    """One JSON object -> a checked RunSummary; RunSummary's unknown/missing-field errors become ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object (a run summary), got {type(data).__name__}", source=source)
    try:
        summary = RunSummary.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a run summary: {exc}", source=source) from exc
    check_reportable(summary, source)
    return SourcedSummary(source, summary)


def _run_rows(runs: Sequence[SourcedSummary]) -> list[str]:
    lines = [
        "| source | scenario | mode | shaper | T_ring (ms) | C (ms) | laps | measured (tok/s) | predicted (tok/s) "
        "| error (%) | overhead (ms/hop) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run.summary
        lines.append(
            f"| {run.source} | {s.scenario} | {s.mode} | {s.shaper or DASH} | {s.t_ring_s * 1e3:.1f} | "
            f"{s.compute_s * 1e3:.1f} | {s.laps} | {s.measured_tok_s:.2f} | {s.predicted_tok_s:.2f} | "
            f"{cell(s.error_pct, '+.1f')} | {cell(s.overhead_ms_per_hop, '.2f')} |")
    return lines


def _spec_rows(runs: Sequence[SourcedSummary]) -> list[str]:
    lines = [
        "| source | T_ring (ms) | C (ms) | K | α | c_d (ms) | Γ measured | Γ predicted | r_spec measured "
        "| r_spec predicted | error (%) | wall 1/(C+T_ring) | K* | r_spec(K*) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s, spec = run.summary, run.summary.spec
        measured = s.measured_tok_s if s.is_speculative else None
        error = s.error_pct if s.is_speculative else None
        lines.append(
            f"| {run.source} | {s.t_ring_s * 1e3:.1f} | {spec.verify_compute_s * 1e3:.1f} | {spec.k:g} | "
            f"{spec.alpha:.2f} | {spec.draft_per_token_s * 1e3:.2f} | {spec.gamma_measured:.2f} | "
            f"{spec.gamma_predicted:.2f} | {cell(measured, '.2f')} | {spec.predicted_tok_s:.2f} | "
            f"{cell(error, '+.1f')} | {spec.plain_predicted_tok_s:.2f} | {spec.k_star} | {spec.k_star_tok_s:.2f} |")
    return lines


def _per_k_rows(runs: Sequence[SourcedSummary]) -> list[str]:
    lines = [
        "| source | K | rounds | Γ measured | Γ(α̂, K) | r_spec measured | r_spec predicted | error (%) "
        "| formula Γ(α̂, K)/(K c_d + C + T_ring) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for row in run.summary.spec.per_k:
            error = 100.0 * (row.measured_tok_s / row.predicted_tok_s - 1) if row.predicted_tok_s else None
            lines.append(
                f"| {run.source} | {row.k} | {row.rounds} | {row.gamma_measured:.2f} | {row.gamma_predicted:.2f} | "
                f"{row.measured_tok_s:.2f} | {row.predicted_tok_s:.2f} | {cell(error, '+.1f')} | "
                f"{row.formula_tok_s:.2f} |")
    lines.append("")
    lines += [f"- {run.source}: K* measured = {cell(run.summary.spec.k_star_measured, 'd')}, "
              f"K* predicted = {cell(run.summary.spec.k_star_predicted, 'd')}" for run in runs]
    return lines


PREAMBLE: Final = (
    "Predicted = each run's own prediction: r = 1/(C + T_ring) with the configured T_ring and the measured C; for "
    "speculation r_spec = Γ / (K c_d + C + T_ring) with the measured Γ and draft time (Γ predicted = Γ(α̂, K) from "
    "the measured acceptance α̂); for M streams physics.streams_rates; for TTFT C_prefill + T_ring + the prompt's "
    "serialization. Error = (measured - predicted) / predicted.")


def run_markdown(runs: Sequence[SourcedSummary]) -> list[str]:
    """The runs' sections: measured vs predicted per run, per speculative run, and per K of each sweep."""
    lines = ["", "## Measured vs predicted", "", *_run_rows(runs)] if runs else []
    spec_runs = [run for run in runs if run.summary.spec is not None]
    if spec_runs:
        lines += ["", "## Speculation", "", *_spec_rows(spec_runs)]
    sweeps = [run for run in spec_runs if run.summary.spec.per_k]
    if sweeps:
        lines += ["", "## K sweeps", "", *_per_k_rows(sweeps)]
    return lines
