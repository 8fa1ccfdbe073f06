"""[placement], [tp] and [spec] of a scenario: where the head, the KV, the layers and the draft go (testbed.scenario.config)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from agents.modes import MODES, modes_with
from agents.modes.speculative.settings import SpecSettings
from testbed.core.decode import (DRAFT_PLACEMENTS, HEAD_PLACEMENTS, KV_PLACEMENTS, MAX_CLIENTS, DecodeConfig,
                                 PlacementConfig, SpecConfig, TPConfig)
from testbed.core.errors import ConfigError
from testbed.core.records import LinkSpec
from testbed.scenario.regions import RegionMatrix
from testbed.scenario.stages import StageConfig
from testbed.scenario.validate import check_keys as _check_keys
from testbed.scenario.validate import number as _number
from testbed.scenario.validate import string as _string

_PLACEMENT_KEYS = {f.name for f in fields(PlacementConfig)}
_SPEC_KEYS = {f.name for f in fields(SpecConfig)}


def placement_from_dict(raw: Any, source: str, scale: float) -> PlacementConfig:
    if not isinstance(raw, dict):
        raise ConfigError("expected a table", source=source, key="placement")
    _check_keys(raw, _PLACEMENT_KEYS, source, "placement")
    return PlacementConfig(kv=_string(raw, "kv", "local", source, "placement", KV_PLACEMENTS),
                           head=_string(raw, "head", "entry", source, "placement", HEAD_PLACEMENTS),
                           head_region=_string(raw, "head_region", "", source, "placement"),
                           head_ms=_number(raw, "head_ms", 0.0, source, "placement", maximum=60_000) * scale)


def tensor_parallel(decode: DecodeConfig, links: list[LinkSpec], stages: list[StageConfig],
                     placement: PlacementConfig, tp: TPConfig, regions: RegionMatrix | None,
                     source: str) -> tuple[DecodeConfig, list[LinkSpec]]:
    """parallel = "tp": plain decode of one stream as the "tp" mode; all-to-all gets a link between every pair
    (from [regions] where the scenario has them, else [[network.links]] must give them)."""
    tp_as = MODES[decode.mode].tp_as  # plain decode of one stream runs as the tp mode (ModeInfo.tp_as)
    if tp_as is None:
        runs = " or ".join(f"{name} decode" for name in modes_with("tp_as"))
        raise ConfigError(f"tensor parallelism runs {runs} of one stream, not {decode.mode!r}", source=source,
                          key="parallel")
    if placement.head != "entry" or placement.kv != "local":
        raise ConfigError("tensor parallelism keeps the head and the KV on every rank: leave [placement] at its "
                          "defaults", source=source, key="parallel")
    if decode.prefill_chunk:
        raise ConfigError("tensor parallelism prefills the prompt in one pass: decode.prefill_chunk must be 0",
                          source=source, key="decode.prefill_chunk")
    n = len(stages)
    if n < 2:
        raise ConfigError("tensor parallelism needs at least two agents (stages)", source=source, key="parallel")
    if tp.allreduce == "all-to-all":
        have = {(link.src, link.dst) for link in links}
        missing = [(i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in have]
        if missing and regions is not None and all(st.region for st in stages):
            template = links[0]
            for i, j in missing:
                ms = regions.latency(stages[i].region, stages[j].region)
                links.append(replace(template, src=i, dst=j, delay_ms=ms, seed=template.seed + len(links)))
        elif missing:
            raise ConfigError(f"an all-to-all all-reduce needs a link between every pair of stages; missing "
                              f"{', '.join(f'{i}->{j}' for i, j in missing)} (add [[network.links]], or give "
                              f"[regions] and a region to every stage)", source=source, key="tp.allreduce")
    return replace(decode, mode=tp_as), links


def spec_from_dict(raw: Any, decode: DecodeConfig, source: str, scale: float) -> tuple[SpecConfig, DecodeConfig]:
    """[spec] -> SpecConfig; an edge placement turns speculative decode into the "dsd" mode."""
    if not isinstance(raw, dict):
        raise ConfigError("expected a table", source=source, key="spec")
    _check_keys(raw, _SPEC_KEYS, source, "spec")
    pipelined = raw.get("pipelined", False)
    if not isinstance(pipelined, bool):
        raise ConfigError(f"expected true or false, got {pipelined!r}", source=source, key="spec.pipelined")
    spec = SpecConfig(placement=_string(raw, "placement", "colocated", source, "spec", DRAFT_PLACEMENTS),
                      clients=_number(raw, "clients", 1, source, "spec", minimum=1, maximum=MAX_CLIENTS, integer=True),
                      rtt_ms=_number(raw, "rtt_ms", 0.0, source, "spec", maximum=60_000) * scale,
                      jitter_ms=_number(raw, "jitter_ms", 0.0, source, "spec", maximum=10_000) * scale,
                      rate_mbit=_number(raw, "rate_mbit", 0.0, source, "spec", maximum=100_000), pipelined=pipelined)
    if spec.placement == "colocated":
        return spec, decode
    edge_as = MODES[decode.mode].edge_as
    if edge_as is None:
        raise ConfigError(f"an edge draft is speculative decoding: decode.mode must be "
                          f"{' or '.join(map(repr, modes_with('edge_as')))}, not {decode.mode!r}", source=source,
                          key="spec.placement")
    k_settings = decode.settings(SpecSettings)
    if k_settings.k == "auto" or k_settings.k_sweep:
        raise ConfigError("an edge client drafts a fixed K: set decode.k to a number and no k_sweep", source=source,
                          key="decode.k")
    return spec, replace(decode, mode=edge_as)


def edge_links(spec: SpecConfig, n_stages: int, seed: int) -> list[LinkSpec]:
    """Client c is agent n_stages + c: a link to the entry and one back, rtt_ms / 2 each way."""
    if spec.placement != "edge":
        return []
    links = []
    for c in range(spec.clients):
        for src, dst in ((n_stages + c, 0), (0, n_stages + c)):
            links.append(LinkSpec(src, dst, spec.rtt_ms / 2, spec.jitter_ms / 2 ** 0.5, 0.0, spec.rate_mbit,
                                  seed + len(links)))
    return links
