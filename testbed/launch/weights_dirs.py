"""From the [weights] phase's fetched files to the directory each stage's agent loads from (AgentSpec.weights).

The phase (testbed.launch.weights.measured_phase) leaves each node's files in ROOT/nodes/node<i>, each node's record
of what it verified beside them (agents.weights.verified). Before any agent starts, every record is held to the
origin's manifest: a stage whose fetch did not complete, or that verified other bytes, fails the run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agents.weights import verified
from agents.weights.manifest import FileEntry
from testbed.scenario.config import Scenario


@dataclass(frozen=True)
class Fetched:
    """Where the [weights] phase left the stages' files (kept until the run ends)."""

    root: Path
    files: list[list[str]]  # per stage, the names its node fetched
    origin: dict[str, FileEntry]  # the origin's manifest, built from the cut: what every node's record must match

    def node(self, stage: int) -> Path:
        return self.root / "nodes" / f"node{stage}"


def stage_dirs(scenario: Scenario, fetched: Fetched) -> tuple[str, ...]:
    """Each stage's directory of verified weights for its agent, once every node's record matches the origin's
    manifest (UnverifiedWeights, naming the stage, where one does not). A byte model's stage loads its node's own
    shard; a checkpoint's stages load one directory of all the nodes' files (agents.weights.shards.assemble: a
    checkpoint opens whole), recorded as verified against the origin's manifest. A null model loads no weights."""
    from agents.hf.checkpoint import is_hf
    from agents.zoo.configs import is_null

    nodes = [fetched.node(i) for i in range(scenario.n_stages)]
    for st, node, names in zip(scenario.stages, nodes, fetched.files):
        try:
            verified.expect(node, {name: fetched.origin[name] for name in names})
        except verified.UnverifiedWeights as exc:
            raise verified.UnverifiedWeights(f"[weights]: stage {st.name} has no verified shard to serve from: "
                                             f"{exc}") from None
    if is_null(scenario.model):
        return ("",) * len(nodes)
    if not is_hf(scenario.model):
        return tuple(str(node) for node in nodes)
    from agents.weights.shards import assemble

    ring = assemble(nodes, fetched.root / "ring")
    verified.record(ring, [fetched.origin[name] for name in sorted({n for names in fetched.files for n in names})])
    return (str(ring),) * len(nodes)
