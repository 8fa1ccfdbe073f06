"""Tree speculation's own [decode] keys (decode.tree_n, tree_k, tree_depth, tree_policy): TreeSettings."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.core.settings import ModeSettings, between, one_of, setting

TREE_POLICIES = ("best-first", "topk")
MAX_TREE = 256  # nodes a tree may have (the stages keep this many cache slots beyond the positions)


@dataclass(frozen=True)
class TreeSettings(ModeSettings):
    """The shape of the token tree a round drafts (agents.modes.tree)."""

    tree_n: int = setting(16, between(1, MAX_TREE, integer=True))  # nodes drafted per round
    tree_k: int = setting(4, between(1, 64, integer=True))  # candidates per expanded node, and per best-first step
    tree_depth: int = setting(8, between(1, 64, integer=True))  # deepest node
    tree_policy: str = setting("best-first", one_of(*TREE_POLICIES))  # or "topk" (a fixed shape)

    def cache_slots(self) -> int:
        return self.tree_n + 1  # the tree's nodes and its root
