"""geo-ring testbed: scenarios, launcher, physics, metrics and CLI."""

from testbed.core.errors import (
    AgentFailed,
    ConfigError,
    LinkBroken,
    PeerTimeout,
    ShapingError,
    TestbedError,
    WireError,
)

__all__ = [
    "AgentFailed",
    "ConfigError",
    "LinkBroken",
    "PeerTimeout",
    "ShapingError",
    "TestbedError",
    "WireError",
]
