"""geo-ring testbed: scenarios, launcher, physics, metrics, CLI, and the Python API (`testbed.run`, `testbed.sweep`,
and every study by name: `testbed.regimes(...)`, `testbed.faults(...)`, ... from testbed.studies.STUDIES)."""

from testbed.core.errors import AgentFailed, ConfigError, LinkBroken, PeerTimeout, ShapingError, TestbedError, WireError

__all__ = ["AgentFailed", "ConfigError", "LinkBroken", "PeerTimeout", "ShapingError", "TestbedError", "WireError",
           "run", "study", "sweep"]


def __getattr__(name: str):
    # Lazy: `import testbed.core` must not pull in the launcher, torch or rich. A submodule's name is left to the
    # import system (`from testbed import api` asks here first).
    import importlib
    import importlib.util

    if name.startswith("_") or importlib.util.find_spec(f"testbed.{name}") is not None:
        raise AttributeError(f"module 'testbed' has no attribute {name!r}")
    api = importlib.import_module("testbed.api")
    if name in ("run", "sweep", "study"):
        return getattr(api, name)
    studies = importlib.import_module("testbed.studies").STUDIES
    if name in studies:
        def run_study(scenario_name: str | None = None, **options):
            return api.study(name, scenario_name, **options)

        run_study.__name__ = run_study.__qualname__ = name
        run_study.__doc__ = f"{studies[name].help} (testbed.api.study({name!r}, ...))"
        return run_study
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")
