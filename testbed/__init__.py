"""geo-ring testbed: scenarios, launcher, physics, metrics, CLI, and the Python API (`testbed.run`, `testbed.sweep`)."""

from testbed.core.errors import AgentFailed, ConfigError, LinkBroken, PeerTimeout, ShapingError, TestbedError, WireError

__all__ = ["AgentFailed", "ConfigError", "LinkBroken", "PeerTimeout", "ShapingError", "TestbedError", "WireError",
           "run", "sweep"]


def __getattr__(name: str):
    # Lazy: `import testbed.core` must not pull in the launcher, torch or rich.
    if name in ("run", "sweep"):
        from testbed import api

        return getattr(api, name)
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")
