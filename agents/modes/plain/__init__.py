"""Plain decode: one token a lap around the ring, the wall r = 1/(C + T_ring)."""

from __future__ import annotations

from testbed.core.decode import HEAD_PLACEMENTS, ModeInfo

INFO = ModeInfo("plain", __name__, metric_kind="plain", heads=HEAD_PLACEMENTS, streams_as="streams", tp_as="tp")
