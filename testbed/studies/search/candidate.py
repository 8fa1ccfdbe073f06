"""The search's candidates and their figures: a Candidate (one deployment), its Scored closed form, where a round's
time goes (Round), and the bytes of a frame (Frames)."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One deployment: a machine kind per stage in ring order, each stage's layers, and how it decodes."""

    stages: tuple[int, ...]  # index into SearchSpec.machines, ring order (stage 0 is the entry)
    layers: tuple[int, ...]
    split: str
    mode: str  # "off", "sync", "async"
    k: int = 0
    window: int = 0
    ranks: tuple[int, ...] = ()  # machines a stage (a TP group where > 1); (): one each
    codec: str = "f32"  # the hidden states' codec on every hop
    kv: str = "local"  # "ship": each stage also sends its new K and V to its successor
    cap: int = 0  # the goodput objectives: the streams cap it serves at (0: not served)

    @property
    def boxes(self) -> tuple[int, ...]:
        return self.ranks or (1,) * len(self.stages)

    @property
    def wire(self) -> tuple[str, str]:
        return self.codec, self.kv


@dataclass(frozen=True)
class Scored:
    """A candidate and its closed-form figures."""

    candidate: Candidate
    tok_s: float
    cost_hour: float
    objective: float


@dataclass(frozen=True)
class Round:
    """Where one round's time goes (a plain token's lap, or a speculation round), seconds."""

    compute_s: float  # the stages' passes (the verification block's, for speculation)
    propagation_s: float  # T_ring
    serialization_s: float
    draft_s: float  # K c_d
    codec_s: float  # the codec's encode and decode on every hop
    tokens: float  # tokens the round yields (Gamma; 1 for plain)
    slowest_stage: int
    slowest_stage_s: float
    longest_hop: int
    longest_hop_s: float
    queue_free: bool = True  # overlap: every stage's work for a round fits in (K + 1) c_d


class Frames:
    """Bytes of a HIDDEN frame of n positions on ring hop i: header, a stamp per stage passed, the payload (from
    one scenario of the model: studies.whatif.predict.frame_bytes)."""

    def __init__(self, scenario, block: int = 64) -> None:
        from dataclasses import replace

        from testbed.studies.whatif import predict

        def frame(hop: int, n: int, codec: str) -> int:
            return predict.frame_bytes(replace(scenario, wire=replace(scenario.wire, codec=codec, block=block)), hop, n)

        self._bytes = functools.cache(frame)

    def __call__(self, hop: int, n_positions: int, codec: str = "f32") -> int:
        return self._bytes(hop, n_positions, codec)
