"""`python -m tests.tiers`: the exact tier runs at idle priority beside the fidelity tier, its output after, its status kept."""

import os
import sys

import pytest

from netem.suite import suite_environment
from tests.tiers import run_tiers

pytestmark = pytest.mark.exact

SAYS_POLICY = "import os, sys; print('{name} policy', os.sched_getscheduler(0), flush=True); sys.exit({status})"


def tier(name: str, status: int) -> list[str]:
    return [sys.executable, "-c", SAYS_POLICY.format(name=name, status=status)]


@pytest.mark.parametrize(("exact_status", "fidelity_status", "expected"), [(0, 0, 0), (3, 0, 3), (3, 5, 5)])
def test_the_exact_tier_runs_idle_beside_fidelity_and_the_first_failure_is_the_status(
        capfd, exact_status, fidelity_status, expected):
    assert run_tiers(tier("exact", exact_status), tier("fidelity", fidelity_status)) == expected
    out = capfd.readouterr().out
    assert f"fidelity policy {os.sched_getscheduler(0)}" in out  # the caller's: under `make test` this runs idle
    assert f"exact policy {os.SCHED_IDLE}" in out
    assert out.index("fidelity policy") < out.index("---- exact tier") < out.index("exact policy")
    assert f"(exit {exact_status})" in out


def test_both_tiers_cache_bytecode_outside_the_sources_where_the_caller_turned_caching_off(capfd, monkeypatch):
    """A caller's PYTHONDONTWRITEBYTECODE made every torch import compile from source; the tiers cache under the venv."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    says = "import sys; print('{name} caches', sys.dont_write_bytecode, sys.pycache_prefix, flush=True)"
    assert run_tiers(*([sys.executable, "-c", says.format(name=name)] for name in ("exact", "fidelity"))) == 0
    out = capfd.readouterr().out
    cache = os.path.join(sys.prefix, "pycache")
    assert f"exact caches False {cache}" in out and f"fidelity caches False {cache}" in out
    assert suite_environment({"PYTHONDONTWRITEBYTECODE": "", "A": "b"}) == {"PYTHONDONTWRITEBYTECODE": "", "A": "b"}
    assert suite_environment({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/c"}) == {"PYTHONPYCACHEPREFIX": "/c"}
