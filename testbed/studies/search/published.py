"""A published deployment ([published]) as a candidate: every machine of the file in the file's order, split the
published system's way (`even`, or exo's `memory`), plain decode; scored by the same closed forms as the search's
candidates, beside the search's best split of the same ring (measure.published_case sets the two side by side)."""

from __future__ import annotations

from typing import Any

from testbed.core.errors import ConfigError
from testbed.studies.search.candidate import Scored
from testbed.studies.search.split import SPLITS

Space = Any  # testbed.studies.search.space.Space, which imports this module


def memory_split(space: Space, stages: tuple[int, ...]) -> tuple[tuple[int, ...] | None, str]:
    """exo's split: machine i's layers run from floor(L x its cumulative memory share before it) to the next cut
    (the last to L), or (None, the reason) where a stage gets none or more than it holds."""
    total = space.spec.model.layers
    memory = [space.spec.machines[g].memory_bytes for g in stages]
    cuts = [0]
    for i in range(1, len(stages)):
        cuts.append(int(total * sum(memory[:i]) / sum(memory)))
    cuts.append(total)
    layers = tuple(b - a for a, b in zip(cuts, cuts[1:]))
    for i, g in enumerate(stages):
        cap = space.capacity(g, i == 0, False)
        if not 1 <= layers[i] <= cap:
            return None, f"memory split: {layers[i]} layers on {space.spec.machines[g].name}, which holds {cap}"
    return layers, ""


def published(space: Space) -> tuple[Scored, Scored]:
    """The published deployment (every machine in the file's order, its split, plain decode, the file's first codec,
    KV local) and the search's best split of the same ring, by the closed forms; a ConfigError where either does
    not fit."""
    spec = space.spec
    assert spec.published is not None
    stages = tuple(g for g, m in enumerate(spec.machines) for _ in range(m.count))
    how = spec.published.split
    layers, why = memory_split(space, stages) if how == "memory" else space.split(stages, "even", False)
    if layers is None:
        raise ConfigError(f"the published {how} split does not fit: {why}", source=spec.source, key="published.split")
    wires = ((spec.dims.codecs[0], "local"),)
    (theirs,) = space.score(stages, layers, how, ("off",), wires=wires)
    mine = [space.score(stages, split_layers, split, ("off",), wires=wires)[0] for split in SPLITS
            for split_layers in [space.split(stages, split, False)[0]] if split_layers is not None]
    if not mine:
        raise ConfigError("none of the search's splits of the published ring fits in memory", source=spec.source,
                          key="published")
    return theirs, max(mine, key=lambda s: s.tok_s)  # the first of equals: even before balanced before greedy
