"""The testbed's small error tree: foreign errors are translated into these at one boundary."""

from __future__ import annotations


class TestbedError(Exception):
    """Base of every error the testbed raises on purpose."""

    __test__ = False  # not a pytest test class despite the name


class ConfigError(TestbedError):
    """A scenario or command line is invalid; the message names the file, the key and what was expected."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None) -> None:
        self.source = source
        self.key = key
        where = ": ".join(part for part in (source, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class ShapingError(TestbedError):
    """The network shaping layer could not be set up, applied or torn down."""


class WireError(TestbedError):
    """A frame on the wire is malformed or oversized."""


class LinkBroken(TestbedError):
    """A peer connection closed or failed mid-run."""


class PeerTimeout(TestbedError):
    """A peer did not answer within its deadline."""


class AgentFailed(TestbedError):
    """An agent process exited or reported a fatal error."""

    def __init__(self, agent: str, cause: str) -> None:
        self.agent = agent
        self.cause = cause
        super().__init__(f"agent {agent} failed: {cause}")


def leaf_errors(exc: BaseException) -> list[BaseException]:
    """The individual errors inside (nested) exception groups; [exc] for a plain exception."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaf_errors(inner)]
    return [exc]
