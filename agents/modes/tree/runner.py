"""Tree speculation (seed 001, "Laps and Bytes"): the entry's draft expands a token tree of n nodes, the ring
verifies every node in one traversal, and a round keeps the longest accepted path plus one token.

Drafting (the draft model, on the entry; one batched forward pass per expansion step, tree attention over its own
KV cache, each step padded to decode.draft_ms):
- ``best-first`` (SpecExec-style): repeatedly add the decode.tree_k candidates of highest cumulative draft
  probability (a candidate: one of a drafted node's tree_k most likely next tokens), until n nodes;
- ``topk``: a fixed shape, every node's tree_k next tokens, breadth first, until n nodes.
A node's candidate children are its next tokens in order of draft probability (greedy), or a sample without
replacement from the draft's q (Gumbel top-k) when sampling.

Verification (the head, on the tree's n + 1 logits rows; lossless, the target's distribution exactly):
- greedy: follow the child whose token is the target's argmax while there is one (the longest matching path);
- sampling, ``topk``: recursive rejection sampling without replacement over the siblings (SpecInfer/SpecTr's
  multi-draft rule in the form of Jeon et al. 2024, for siblings drawn without replacement): child c_i is
  accepted with probability min(1, p(c_i) / q(c_i)); after a rejection p <- norm(max(0, p - q)) and q loses c_i
  (renormalized); with every sibling rejected the next token is drawn from the residual p;
- sampling, ``best-first``: a best-first tree's shape depends on the draws, which that rule does not allow, so the
  target samples t ~ p at each node and the walk descends while t is a child (exact for any tree).

Every stage runs the n + 1 nodes in one forward pass with the tree's attention mask (PipelineStage.set_tree); the
next round's TREE plan tells every stage which slots the accepted path kept (KV compaction).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from agents.process import wire
from agents.zoo.model import GPT, tree_mask
from agents.modes.speculative.runner import EPS, probabilities, sample
from agents.modes.tree.facts import TreeRound
from agents.zoo.prompts import prompt_ids
from agents.process.ring import CONTEXT_KEEP, RingClient
from agents.process.stage import PipelineStage
from testbed.core.clock import Clock
from agents.modes.tree.settings import TreeSettings
from testbed.core.decode import DecodeConfig


@dataclass
class Tree:
    """Node 0 is the root, the last committed token (its slot is the block's first); parents[i] < i."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    scores: list[float] = field(default_factory=lambda: [0.0])  # cumulative draft log-probability
    q: dict[int, torch.Tensor] = field(default_factory=dict)  # an expanded node's draft distribution
    children: dict[int, list[int]] = field(default_factory=dict)  # in drafting order

    def add(self, parent: int, token: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(score)
        self.children.setdefault(parent, []).append(len(self.tokens) - 1)
        return len(self.tokens) - 1


def candidates(logits: torch.Tensor, q: torch.Tensor, k: int, temperature: float,
               generator: torch.Generator) -> list[int]:
    """A node's next tokens in drafting order: the k most likely (greedy) or k drawn without replacement from q."""
    if temperature <= 0:
        return torch.topk(logits, k).indices.tolist()
    gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=generator, dtype=torch.float64).clamp_min(1e-300)))
    keys = torch.where(q > 0, torch.log(q.clamp_min(1e-300)) + gumbel, torch.tensor(-math.inf, dtype=torch.float64))
    return [int(i) for i in torch.topk(keys, min(k, int((q > 0).sum()))).indices]


class TreeDrafter:
    """The draft model with a KV cache of the committed sequence; a tree's nodes go in after it, masked."""

    def __init__(self, model: GPT, config: DecodeConfig, draft_s: float, clock: Clock, dilation: float) -> None:
        self.model, self.config, self.clock = model, config, clock
        self.draft_s, self.dilation = draft_s, dilation
        self.cache = model.new_cache(model.config.n_layer, extra_slots=config.settings(TreeSettings).tree_n + 1)
        self.fed: list[int] = []

    def _sync(self, prefix: list[int]) -> None:
        """The cache holds exactly `prefix` (the committed sequence but its last token, the tree's root)."""
        common = 0
        for a, b in zip(self.fed, prefix):
            if a != b:
                break
            common += 1
        self.cache.truncate(min(common, self.cache.length))
        del self.fed[common:]
        if len(prefix) > common:
            x = self.model.embed(torch.tensor([prefix[common:]]), common)
            self.model.run_layers(x, 0, self.model.config.n_layer, self.cache)
            self.fed.extend(prefix[common:])

    def _forward(self, tree: Tree, nodes: list[int], root_pos: int) -> torch.Tensor:
        """Draft logits [len(nodes), V] of new nodes (the last ones added; their ancestors already in the cache)."""
        past = len(self.fed)
        mask = tree_mask(tree.parents, past)[nodes]  # [T, past + all nodes]
        positions = [root_pos + tree.depths[i] for i in nodes]
        x = self.model.embed_at([tree.tokens[i] for i in nodes], positions)
        x = self.model.run_layers(x.transpose(0, 1), 0, self.model.config.n_layer, self.cache, mask, positions)
        return self.model.head(x)[0]

    @torch.inference_mode()
    async def draft(self, sequence: list[int], generator: torch.Generator) -> tuple[Tree, float, float, int]:
        """(tree, draft time with emulation, real time, draft steps) for a tree of decode.tree_n nodes after the root.

        Each step lasts max(draft_ms, D x its real time); the entry is held once to their sum (Drafter.propose)."""
        clock = self.clock
        start, timing = clock.now(), [0.0, 0, 0.0]  # real seconds, steps, held seconds
        self._sync(sequence[:-1])
        root_pos = len(sequence) - 1

        def forward(tree: Tree, nodes: list[int]) -> torch.Tensor:  # one draft step, padded to draft_ms
            step = clock.now()
            logits = self._forward(tree, nodes, root_pos)
            took = clock.now() - step
            timing[0] += took
            timing[1] += 1
            timing[2] += max(self.draft_s, self.dilation * took)
            return logits

        tree = grow(Tree([sequence[-1]]), self.config, forward, generator)
        self.cache.truncate(len(self.fed))
        await clock.hold_until(start + timing[2])
        return tree, clock.now() - start, timing[0], timing[1]


def grow(tree: Tree, config: DecodeConfig, forward: Callable[[Tree, list[int]], torch.Tensor],
         generator: torch.Generator) -> Tree:
    """Expand `tree` (its root alone) to decode.tree_n nodes by decode.tree_policy; `forward(tree, nodes)` gives
    the draft's logits at the newest nodes (one batched draft step)."""
    shape = config.settings(TreeSettings)
    frontier, heap, order = [0], [], 0  # nodes to run the draft on next; best-first: (-score, order, parent, token)
    while frontier:
        new = []
        for row, node in zip(forward(tree, frontier), frontier):
            q = probabilities(row, config.temperature)
            tree.q[node] = q
            if tree.depths[node] >= shape.tree_depth:
                continue
            logq = torch.log_softmax(row.to(torch.float64), -1)
            for token in candidates(row, q, shape.tree_k, config.temperature, generator):
                if shape.tree_policy == "topk":
                    new.append((node, token, tree.scores[node] + float(logq[token])))
                else:
                    heapq.heappush(heap, (-(tree.scores[node] + float(logq[token])), order, node, token))
                    order += 1
        room = shape.tree_n + 1 - len(tree.tokens)
        if shape.tree_policy != "topk":
            new = [(parent, token, -score) for score, _, parent, token in
                   (heapq.heappop(heap) for _ in range(min(shape.tree_k, room, len(heap))))]
        frontier = [tree.add(parent, token, score) for parent, token, score in new[:room]]
        if len(tree.tokens) > shape.tree_n:
            frontier = []  # full: leaves need no draft pass (verification uses q only where there are children)
    return tree


def verify(tree: Tree, p: list[torch.Tensor], policy: str, greedy: bool,
           generator: torch.Generator) -> tuple[list[int], int]:
    """(accepted path's nodes, next token) from the target's distribution p[i] at every node (module docstring)."""
    node, path = 0, []
    while True:
        kids = tree.children.get(node, [])
        if greedy:
            token = int(torch.argmax(p[node]))
            nxt = next((c for c in kids if tree.tokens[c] == token), None)
        elif policy == "topk":
            target, nxt = p[node].clone(), None
            q = tree.q[node].clone() if kids else target  # a leaf was never drafted from
            for c in kids:
                x = tree.tokens[c]
                if float(torch.rand((), generator=generator, dtype=torch.float64)) < min(1.0, float(target[x]) /
                                                                                          max(float(q[x]), EPS)):
                    nxt = c
                    break
                residual = torch.clamp(target - q, min=0.0)
                if float(residual.sum()) > EPS:
                    target = residual / residual.sum()
                q[x] = 0.0
                if float(q.sum()) > EPS:
                    q = q / q.sum()
            token = tree.tokens[nxt] if nxt is not None else sample(target, generator)
        else:
            token = sample(p[node], generator)
            nxt = next((c for c in kids if tree.tokens[c] == token), None)
        if nxt is None:
            return path, token
        path.append(nxt)
        node = nxt


class TreeMode:
    """The entry's loop: draft a tree, verify it in one lap, keep the accepted path; one lap record per round."""

    def __init__(self, config: DecodeConfig, ring: RingClient) -> None:
        from agents.process.shared import draft_name, shared_model

        self.config, self.ring = config, ring
        self.drafter = TreeDrafter(shared_model(draft_name(config.draft, ring.stage.model)), config, config.draft_ms / 1e3, ring.clock, ring.dilation)
        self.sequence: list[int] = []
        self.kept: list[int] = []  # slots of the last round's accepted path, for the next TREE plan
        self.generated = 0

    @staticmethod
    def last_head(config: DecodeConfig, ring: RingClient
                  ) -> Callable[[PipelineStage, wire.Frame, np.ndarray], np.ndarray]:
        """placement.head = "last" (greedy only): the last stage verifies the lap's tree itself and returns the
        accepted path's node indices and the next token; a prefill lap, the first token."""

        def verified(stage: PipelineStage, frame: wire.Frame, hidden: np.ndarray) -> np.ndarray:
            if frame.stream not in stage.last_tree or hidden.shape[1] != len(stage.last_tree[frame.stream][0]):
                return np.array([int(torch.argmax(stage.logits(hidden)[-1]))], np.int32)  # a prefill lap
            parents, tokens = stage.last_tree.pop(frame.stream)
            tree = Tree(tokens[:1])
            for parent, token in zip(parents[1:], tokens[1:]):
                tree.add(parent, token, 0.0)
            path, token = verify(tree, list(stage.logits(hidden)), "best-first", greedy=True,
                                 generator=torch.Generator())
            return np.array(path + [token], np.int32)

        return verified

    def generator(self, purpose: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.config.seed * 1_000_003 + self.generated) * 4 + purpose)

    async def restart(self, ids: list[int]) -> None:
        self.sequence, self.kept = list(ids), []
        first = lambda logits: sample(probabilities(logits[-1], self.config.temperature), self.generator(3))  # noqa: E731
        token, record = await self.ring.lap(self.sequence, 0, "prefill", first)
        self.ring.report(dataclasses.replace(record, tokens=1, ids=(token,)))
        self.sequence.append(token)
        self.generated += 1

    async def round(self) -> None:
        config, clock = self.config, self.ring.clock
        round_start = clock.now()
        tree, draft_s, draft_real, steps = await self.drafter.draft(self.sequence, self.generator(1))
        pos = len(self.sequence) - 1
        plan = np.array([len(self.kept), *self.kept, *tree.parents, *tree.tokens], dtype=np.int32)

        def decide(logits: torch.Tensor) -> tuple[list[int], int]:
            p = [probabilities(row, config.temperature) for row in logits]
            return verify(tree, p, config.settings(TreeSettings).tree_policy, config.temperature <= 0, self.generator(2))

        def from_ids(ids: list[int]) -> tuple[list[int], int]:  # placement.head = "last": the last stage verified
            if not ids or any(not 0 < i < len(tree.tokens) for i in ids[:-1]):
                raise ValueError(f"the last stage returned an impossible path {ids} for a tree of {len(tree.tokens)}")
            return ids[:-1], ids[-1]

        decide.from_ids = from_ids

        (path, token), record = await self.ring.lap(tree.tokens, pos, "tree", decide, tree=plan,
                                                    positions=[pos + d for d in tree.depths])
        new = [tree.tokens[i] for i in path] + [token]
        self.kept = [pos + i for i in path]
        self.sequence.extend(new)
        self.generated += len(new)
        facts = TreeRound(len(tree.tokens) - 1, len(path), draft_s, draft_real, steps, max(tree.depths),
                          config.settings(TreeSettings).tree_policy)
        self.ring.report(dataclasses.replace(record, start=round_start, tokens=len(new), ids=tuple(new), facts=facts))

    async def run(self) -> int:
        config = self.config
        block_size = self.ring.stage.model.config.block_size
        await self.restart(prompt_ids(config, self.ring.stage.model))
        while self.generated < config.tokens:
            if len(self.sequence) + config.settings(TreeSettings).tree_depth + 1 > block_size:
                await self.restart(self.sequence[-CONTEXT_KEEP:])
            await self.round()
        return self.generated


Runner = TreeMode  # what an agent of this mode runs (ModeInfo.runner_path)
