"""The search's placement dimensions beyond the machines, the order, the split and speculation, as the input file
states them, checked (every error names its key):

    [wire]
    codecs = ["f32", "int8-block"]  # the codecs tried on every hop (testbed.core.decode.CODECS; default ["f32"])
    block = 64                       # int8-block: values per absmax scale
    codec_gb_s = 0                   # encode and decode throughput of a codec other than f32, GB/s (0: free)
    round_trips = 1                  # round trips a token costs on every hop (a stack whose protocol waits for
                                     # replies: llama.cpp's RPC before its PR #12943)
    [placement]
    kv = ["local", "ship"]           # KV kept on its stage (the law), or shipped each step to the successor
    parallel = ["pp", "tp"]          # also try the machines of one kind in one region as one tensor-parallel stage
    [lan]                            # the link between two machines of one region (a TP group's all-reduces)
    one_way_ms = 0.05
    gbit_s = 100

and what they cost: the bytes a hop carries under a codec and with shipped KV, a codec's encode and decode time,
a tensor-parallel group's all-reduces over the LAN (physics.tp_token_s on a uniform ring, in closed form), and the
round trips a hop's protocol makes (hop_delays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.core.decode import CODECS, KV_PLACEMENTS, MAX_BLOCK
from testbed.core.errors import ConfigError
from testbed.scenario.validate import check_keys, number

WIRE_KEYS = {"codecs", "block", "codec_gb_s", "round_trips"}
MAX_ROUND_TRIPS = 64
PLACEMENT_KEYS = {"kv", "parallel"}
LAN_KEYS = {"one_way_ms", "gbit_s"}
PARALLEL = ("pp", "tp")  # a stage a machine; or the machines of one kind in one region as one TP group
LAN_MS = 0.05  # the default intra-region link: a datacenter LAN, one way
LAN_GBIT_S = 100.0


@dataclass(frozen=True)
class Dims:
    """[wire], [placement] and [lan] of a search file."""

    codecs: tuple[str, ...] = ("f32",)  # in CODECS' order (f32 first: a codec that gives its bytes is f32)
    block: int = 64
    codec_gb_s: float = 0.0  # 0: encoding and decoding are free (as the virtual runs price them)
    round_trips: int = 1  # exchanges a token's hop waits out (1: the frame one way, the ring's own)
    kv: tuple[str, ...] = ("local",)
    parallel: tuple[str, ...] = ("pp",)
    lan_ms: float = LAN_MS
    lan_gbit_s: float = LAN_GBIT_S

    @property
    def hop_delays(self) -> int:
        """One-way delays a hop costs a token: a protocol that makes n round trips on a hop waits out n - 1 request
        and reply exchanges (2 one-way delays each) beside the frame's own way: 2n - 1 (1 for the ring's one frame).
        The exchanges' messages are small: only the frame's bytes are serialized at the link's rate."""
        return 2 * self.round_trips - 1

    @property
    def tp(self) -> bool:
        parallel = self.parallel  # the scenario's own word for it ([parallel]: "pp" or "tp"), not a mode's name
        return "tp" in parallel


def _choices(table: dict, key: str, default: tuple[str, ...], allowed: tuple[str, ...], source: str,
             where: str) -> tuple[str, ...]:
    """A non-empty list of distinct names from `allowed`, in allowed's order."""
    values = table.get(key, list(default))
    if not isinstance(values, list) or not values or any(v not in allowed for v in values) \
            or len(set(values)) != len(values):
        raise ConfigError(f"expected a non-empty list of distinct names of {', '.join(allowed)}, got {values!r}",
                          source=source, key=f"{where}.{key}")
    return tuple(name for name in allowed if name in values)


def _table(raw: dict, key: str, allowed: set[str], source: str) -> dict:
    table = raw.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError("expected a table", source=source, key=key)
    check_keys(table, allowed, source, key)
    return table


def dims_from_dict(raw: dict[str, Any], source: str) -> Dims:
    wire = _table(raw, "wire", WIRE_KEYS, source)
    placement = _table(raw, "placement", PLACEMENT_KEYS, source)
    lan = _table(raw, "lan", LAN_KEYS, source)
    parallel = _choices(placement, "parallel", ("pp",), PARALLEL, source, "placement")
    if "pp" not in parallel:
        raise ConfigError("a ring of one machine a stage is always a candidate: list \"pp\" (and \"tp\" to add "
                          "tensor-parallel groups)", source=source, key="placement.parallel")
    return Dims(codecs=_choices(wire, "codecs", ("f32",), CODECS, source, "wire"),
                block=number(wire, "block", 64, source, "wire", minimum=1, maximum=MAX_BLOCK, integer=True),
                codec_gb_s=number(wire, "codec_gb_s", 0.0, source, "wire", maximum=1e6),
                round_trips=number(wire, "round_trips", 1, source, "wire", minimum=1, maximum=MAX_ROUND_TRIPS,
                                   integer=True),
                kv=_choices(placement, "kv", ("local",), KV_PLACEMENTS, source, "placement"), parallel=parallel,
                lan_ms=number(lan, "one_way_ms", LAN_MS, source, "lan", maximum=60_000),
                lan_gbit_s=number(lan, "gbit_s", LAN_GBIT_S, source, "lan", minimum=1e-6, maximum=1e6))


def allreduce_s(ranks: int, layers: int, positions: int, value_bytes: float, d_model: int, dims: Dims) -> float:
    """A TP group's all-reduces for one pass of `positions` positions over `layers` layers: two a layer (after
    attention and after the MLP), each a ring all-reduce of 2 (ranks - 1) steps, a step one message of 1 / ranks of
    the hidden state over the LAN (one-way delay plus its bytes at the LAN's rate). physics.tp_token_s on a
    uniform ring in closed form: every rank waits the same, so a collective is 2 (N - 1) message times."""
    if ranks < 2:
        return 0.0
    message = positions * d_model * value_bytes / ranks
    step = dims.lan_ms / 1e3 + message * 8 / (dims.lan_gbit_s * 1e9)
    return 2 * layers * 2 * (ranks - 1) * step


def codec_s(codec: str, positions: int, d_model: int, dims: Dims) -> float:
    """One hop's encode (sender) and decode (receiver) of a hidden state of `positions` positions under `codec`: its
    float32 values twice at codec_gb_s (f32 and a codec_gb_s of 0 cost nothing)."""
    if codec == "f32" or not dims.codec_gb_s:
        return 0.0
    return 2 * positions * d_model * 4 / (dims.codec_gb_s * 1e9)
