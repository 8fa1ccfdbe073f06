"""Shared fixtures."""

import pytest

from netem.probe import probe


@pytest.fixture(scope="module")
def netem_capable(request):
    """Skip the module unless the kernel netem backend can run here (root + sch_netem), naming the reason."""
    caps = probe()
    if not caps.netem_ready:
        pytest.skip(f"kernel netem backend unavailable: {caps.detail} "
                    f"(run: python -m netem.uml -- python -m pytest -m netem tests/{request.path.name})")
    return caps
