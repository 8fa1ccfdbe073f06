"""geo-ring: a one-box testbed that measures the latency physics of geo-distributed pipeline decode.

The Python API (testbed.api, imported here): `run` one scenario, `sweep` K in one run, `study` any study by name,
each built-in study by its own name (`regimes`, `faults`, `whatif`, ...); and the errors they raise. No public name
is also a module's or a subpackage's (tests/test_api.py): `testbed.run` is always this function.
"""

from testbed.api import (acceptance, bench, codecs, dsd, faults, overlap, place, probe, regimes, reproduce, run,
                         search, serve, study, sweep, sweep_k, tp, transport, tree, weights, whatif)
from testbed.core.errors import AgentFailed, ConfigError, LinkBroken, PeerTimeout, ShapingError, TestbedError, WireError

__all__ = ["run", "sweep", "study",
           "sweep_k", "regimes", "place", "tp", "tree", "codecs", "dsd", "acceptance", "overlap", "faults", "whatif",
           "probe", "transport", "weights", "search", "serve", "reproduce", "bench",
           "AgentFailed", "ConfigError", "LinkBroken", "PeerTimeout", "ShapingError", "TestbedError", "WireError"]
