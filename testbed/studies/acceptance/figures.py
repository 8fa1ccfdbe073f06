"""The acceptance study in the report: `testbed acceptance --json` results (told apart by their "acceptance_rows")
checked and tabled: per K, the held-out Gamma measured next to the per-position and the i.i.d. predictions."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_count, check_number, check_text, record_from
from testbed.studies.acceptance.result import AcceptanceResult
from testbed.studies.base import Sourced

DRAFTS = ("trained", "calibrated")
ROW_POSITIVE = ("measured_gamma", "conditional_gamma", "positional_gamma", "iid_gamma")  # at least one token a round
ROW_NON_NEGATIVE = ("measured_se", "conditional_se", "conditional_error_se", "positional_se", "iid_error_se")


def parse_acceptance(data: dict, source: str) -> Sourced[AcceptanceResult]:
    """A `testbed acceptance --json` object -> a checked AcceptanceResult; field errors become ConfigError."""
    result = record_from(AcceptanceResult, data, source, "an acceptance result")
    check_text(result.scenario, source, "scenario")
    check_text(result.draft, source, "draft", DRAFTS)
    check_count(result.k_cal, 1, source, "k_cal")
    check_number(result.alpha_hat, source, "alpha_hat", minimum=0.0, maximum=1.0)
    if not isinstance(result.acceptance_rows, tuple) or not result.acceptance_rows:
        raise ConfigError(f"expected a non-empty list of rows, got {result.acceptance_rows!r}", source=source,
                          key="acceptance_rows")
    for i, row in enumerate(result.acceptance_rows):
        check_count(row.k, 1, source, f"acceptance_rows[{i}].k")
        for key in ROW_POSITIVE:
            check_number(getattr(row, key), source, f"acceptance_rows[{i}].{key}", minimum=1.0)
        for key in ROW_NON_NEGATIVE:
            check_number(getattr(row, key), source, f"acceptance_rows[{i}].{key}", minimum=0.0)
    return Sourced(source, result)


def acceptance_markdown(items: Sequence[Sourced[AcceptanceResult]]) -> list[str]:
    lines = ["Tokens a round on held-out prompts, measured ± its standard error, next to Γ predicted from the "
             "calibration prompts: by start state (the start chain's mix at K), from one positional vector "
             "(1 + Σ S_i) and from α̂ alone (i.i.d.); errors ± their standard errors.", "",
             "| source | draft | K | measured Γ | conditional Γ | err % | per-position Γ | err % | iid Γ(α̂, K) | err % |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for item in items:
        r = item.result
        draft = r.draft + (f" α {r.alpha:g}" if r.alpha is not None else "")
        for row in r.acceptance_rows:
            lines.append(f"| {item.source} | {draft} | {row.k} | {row.measured_gamma:.3f} ± {row.measured_se:.3f} | "
                         f"{row.conditional_gamma:.3f} | {row.conditional_error_pct:+.2f} ± "
                         f"{row.conditional_error_se:.2f} | {row.positional_gamma:.3f} | "
                         f"{row.positional_error_pct:+.2f} ± {row.positional_error_se:.2f} | {row.iid_gamma:.3f} | "
                         f"{row.iid_error_pct:+.2f} ± {row.iid_error_se:.2f} |")
    return lines
