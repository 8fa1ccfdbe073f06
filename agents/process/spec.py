"""What one agent is told by the launcher (an AgentSpec, as JSON): torch-free, so the launcher can build it without
importing what the agent computes with."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.decode import DecodeConfig, SpecConfig, TPConfig, WireConfig
from testbed.core.records import LAP_TIMEOUT_S, JsonRecord
from testbed.core.roofline import Roofline


@dataclass(frozen=True)
class AgentSpec(JsonRecord):
    """Everything one agent needs, as sent by the launcher."""

    stage: int
    n_stages: int
    name: str
    first_layer: int
    last_layer: int  # exclusive
    compute_ms: float
    decode: DecodeConfig
    runner: str  # "module:Class" of the decode mode's runner (ModeInfo.runner_path), run by the entry stage
    model: str = "target"
    listen_host: str = "127.0.0.1"
    threads: int = 1
    dilation: float = 1.0  # time dilation D: compute_ms and decode times are already multiplied by it
    per_token_ms: float = 0.0  # StageConfig.cost_ms: emulated cost of a batch / a block beyond one token
    prefill_ms_per_token: float = 0.0
    roofline: Roofline | None = None  # compute from hardware (StageConfig.cost_ms), already dilated; None: the above
    wire: WireConfig = WireConfig()  # the hidden states' codec on every link
    kv_ship: bool = False  # placement.kv = "ship": send each step's new K and V to the successor too
    is_head: bool = False  # placement.head = "separate": this agent is the LM head after the last stage
    head_on_last: bool = False  # placement.head = "last": this last stage also samples and returns the token id
    tp: TPConfig = TPConfig()  # parallel = "tp": the all-reduce (agents.modes.tp)
    spec: SpecConfig = SpecConfig()  # an edge client (stage >= n_stages) drafts for the entry (agents.modes.dsd)
    lap_timeout_s: float = LAP_TIMEOUT_S  # no frame within this long: a peer or a link is gone (network.lap_timeout_s)
    every_agent: bool = False  # the mode's ModeInfo.every_agent (read by the launcher: a test may register a mode)
    tree_slots: int = 0  # cache slots beyond the positions, for a token tree's nodes (the launcher, from ModeInfo)
    kv_positions: int = 0  # Scenario.kv_positions: K and V positions the ring holds at once (0: no budget)
    warm_windows: bool = False  # the links are kernel TCP over the delay (Shaper.warm_windows): warm them first
    weights: str = ""  # [weights] on real bytes: the directory of this stage's verified shard; "": the model's own
