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


TIERS = ("exact", "fidelity", "netem")


def pytest_collection_modifyitems(config, items):
    """A test marked neither fidelity nor netem is in the exact tier (`-m exact`); none may be in two; a netem test
    sits in a file that netem.suite finds (it reads the files for the mark rather than collect the whole suite)."""
    from netem.suite import netem_test_files

    netem_files = None
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if not tiers:
            item.add_marker(pytest.mark.exact)
        elif len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(tiers)}: a test is in one tier")
        elif tiers == ["netem"]:
            netem_files = netem_test_files(str(item.path.parent)) if netem_files is None else netem_files
            if f"{item.path.parent}/{item.path.name}" not in netem_files:
                raise pytest.UsageError(f"{item.nodeid} is a netem test, but its file does not say "
                                        "`pytest.mark.netem`, which is how `python -m netem.suite` finds it")


SYSTEM_DEPS_HINT = "apt-get install"  # every skip for a missing system package names its install command


def pytest_terminal_summary(terminalreporter):
    """Say loudly which tests were skipped for a missing system package, and the one command that installs all."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if SYSTEM_DEPS_HINT in str(r.longrepr)]
    if not skipped:
        return
    reasons = sorted({str(r.longrepr[2]) if isinstance(r.longrepr, tuple) else str(r.longrepr) for r in skipped})
    terminalreporter.write_sep("!", f"{len(skipped)} tests SKIPPED: system packages missing", red=True, bold=True)
    for reason in reasons:
        terminalreporter.write_line(f"  {reason}")
    terminalreporter.write_line("  Install everything the suite needs (as root): make system-deps")


@pytest.fixture
def hosts():
    """Three network namespaces as hosts (tests/hostsutil.py), removed afterwards with anything left in them."""
    from tests.hostsutil import Hosts

    made = Hosts()
    try:
        yield made
    finally:
        made.close()
