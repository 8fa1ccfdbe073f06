"""The search space and its closed forms: every deployment the input file allows, each refused with its reason where
it does not fit in memory, else scored by the physics (no scenario is built, no run made).

A candidate is: which machines take part (each machine is one stage of the ring: its devices are tensor parallel
inside it, over NVLink, as the roofline assumes), the ring order of their regions (the machines of a region side by
side: a region entered twice would pay its way in and out twice), the layer split, and speculation.

- The ring: the entry stage holds the embedding and the LM head (placement.head = "entry") and runs the draft; with
  constraints.head_region it is a machine of that region, else every order of the regions is tried (a ring is the
  same cycle from any stage, but the entry's stage differs). Inside a region the machine with the most memory
  comes first (it holds the embedding and the head as the entry).
- The split: `even` (every stage L / N layers, the first ones one more, as a scenario splits a [geometry]);
  `balanced` (a stage's share by its compute: layers in proportion to its decode speed, as prima.cpp's Halda and
  Helix weigh devices, water-filled within each stage's memory), which levels the stages' times (what streams
  need); `greedy` (a layer on every stage, then the rest on the fastest stages a layer costs least, each up to its
  memory), the least compute a lap for one stream, the optimum of sum_i l_i t_i under the memory caps.
- Speculation: `off` (1 / (C + T_ring), Eq. 2), `sync` (Gamma(a, K) / (K c_d + lap of K + 1 positions), Eq. 7, at
  K*), `async` (overlapped speculation) at each window W (physics.overlap_rate with h = a^K x guess, at its own K*). K* is the argmax over
  K = 1..K_MAX with the verification block's own lap (its compute and bytes grow with K + 1), as
  studies.whatif.predict.spec_at_best_k: physics.best_k and best_k_overlap where the lap did not depend on K.
- A published deployment ([published]): every machine of the file in the file's order, split `even` or `memory`
  (exo's: the cumulative memory shares cut the layers, each cut floored, the last machine to the end), plain decode;
  scored by the same closed forms as a candidate, beside the search's best split of that ring (Space.published).
- TP across the machines of a region (an all-reduce over the region's network each layer) is not a dimension: the
  catalogue has no intra-region link figure to price it (physics.tp_token_s would need one).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from testbed.core import physics
from testbed.core.roofline import Roofline
from testbed.deploy.rules import StageShare, resident_bytes, stage_roofline
from testbed.studies.search.spec import SearchSpec
from testbed.studies.search.split import water_fill

SPLITS = ("even", "balanced", "greedy")
K_MAX = 32  # the largest K searched for K* (studies.whatif.predict.K_MAX)


@dataclass(frozen=True)
class Candidate:
    """One deployment: a machine kind per stage in ring order, each stage's layers, and how it decodes."""

    stages: tuple[int, ...]  # index into SearchSpec.machines, ring order (stage 0 is the entry)
    layers: tuple[int, ...]
    split: str
    mode: str  # "off", "sync", "async"
    k: int = 0
    window: int = 0


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
    tokens: float  # tokens the round yields (Gamma; 1 for plain)
    slowest_stage: int
    slowest_stage_s: float
    longest_hop: int
    longest_hop_s: float
    queue_free: bool = True  # overlap: every stage's work for a round fits in (K + 1) c_d


class Frames:
    """Bytes of a HIDDEN frame of n positions on ring hop i: header, a stamp per stage passed, the payload (from
    one scenario of the model: studies.whatif.predict.frame_bytes)."""

    def __init__(self, scenario) -> None:
        from testbed.studies.whatif import predict

        self._scenario = scenario
        self._bytes = functools.cache(lambda hop, n: predict.frame_bytes(scenario, hop, n))

    def __call__(self, hop: int, n_positions: int) -> int:
        return self._bytes(hop, n_positions)


class Space:
    """The candidates of one input file, and the closed forms that score them."""

    def __init__(self, spec: SearchSpec, frames: Frames) -> None:
        self.spec = spec
        self.frames = frames
        m = spec.model
        self.layer_bytes = (m.params - 2 * m.vocab * m.d_model) / m.layers * m.bytes_per_value
        self.kv_layer_bytes = 2 * m.kv_heads * m.head_dim * m.bytes_per_value  # one position, one layer
        self.rate_bytes_s = spec.rate_mbit * 1e6 / 8 if spec.rate_mbit else math.inf
        self.refused: Counter[str] = Counter()
        self.excluded: Counter[str] = Counter()  # placements the constraints rule out (not candidates)
        self.duplicates = 0  # a split that came out as an earlier split's layers: scored once, under the earlier
        self._roofline = functools.cache(self._roofline_uncached)
        self._draft = functools.cache(self._draft_uncached)

    # --- the pieces -------------------------------------------------------------------------------------------
    def _roofline_uncached(self, kind: int, layers: int, head: bool) -> Roofline:
        machine = self.spec.machines[kind]
        return stage_roofline(self.spec.model, StageShare(layers, head), machine.hardware, machine.devices)

    def _draft_uncached(self, kind: int) -> tuple[float, float]:
        """The draft whole on the entry machine: (c_d at the decode's context, the bytes it keeps resident)."""
        draft = self.spec.draft
        if draft is None:
            return 0.0, 0.0
        machine = self.spec.machines[kind]
        roofline = stage_roofline(draft, StageShare(draft.layers, True), machine.hardware, machine.devices)
        held = resident_bytes(draft, StageShare(draft.layers, True), entry=True) \
            + draft.kv_bytes_per_token * self.spec.context
        return roofline.seconds(1, 1, self.spec.decode_context), held

    def draft_s(self, stages: tuple[int, ...]) -> float:
        return self._draft(stages[0])[0]

    def fixed_bytes(self, kind: int, entry: bool, with_draft: bool) -> float:
        """What a stage holds besides its layers: the entry's embedding and head, and the draft."""
        m = self.spec.model
        held = 2 * m.vocab * m.d_model * m.bytes_per_value if entry else 0.0
        return held + (self._draft(kind)[1] if entry and with_draft else 0.0)

    def per_layer_bytes(self) -> float:
        """A layer's weights (every expert) and its KV for the stated context."""
        return self.layer_bytes + self.kv_layer_bytes * self.spec.context

    def capacity(self, kind: int, entry: bool, with_draft: bool) -> int:
        """The most layers a stage of this machine holds (weights, KV for the context, the entry's extras)."""
        room = self.spec.machines[kind].memory_bytes * self.spec.memory_fraction \
            - self.fixed_bytes(kind, entry, with_draft)
        return max(0, int(room // self.per_layer_bytes()))

    def layer_s(self, kind: int) -> float:
        """One layer's decode pass on the machine at the decode's context (the split's weight)."""
        return self._roofline(kind, 1, False).seconds(1, 1, self.spec.decode_context)

    # --- enumeration ------------------------------------------------------------------------------------------
    def placements(self) -> Iterator[tuple[int, ...]]:
        """Every ring of machines the constraints allow, as a machine kind per stage (see the module's notes)."""
        spec = self.spec
        machines = spec.machines
        for counts in itertools.product(*(range(m.count + 1) for m in machines)):
            if not any(counts):
                continue
            used = list(dict.fromkeys(machines[g].region for g, n in enumerate(counts) if n))
            if spec.max_regions and len(used) > spec.max_regions:
                self.excluded[f"more than constraints.max_regions = {spec.max_regions} regions"] += 1
                continue
            if spec.head_region and spec.head_region not in used:
                self.excluded[f"no machine in constraints.head_region {spec.head_region!r}"] += 1
                continue
            blocks = {r: sorted((g for g, n in enumerate(counts) if n and machines[g].region == r
                                 for _ in range(n)), key=lambda g: (-machines[g].memory_bytes, g)) for r in used}
            if spec.head_region:
                rest = [r for r in used if r != spec.head_region]
                orders = ([spec.head_region, *p] for p in itertools.permutations(rest))
            else:
                orders = (list(p) for p in itertools.permutations(used))
            for order in orders:
                yield tuple(g for r in order for g in blocks[r])

    def split(self, stages: tuple[int, ...], how: str, with_draft: bool) -> tuple[tuple[int, ...] | None, str]:
        """Each stage's layers under split `how`, or (None, the reason) where memory does not allow it."""
        total = self.spec.model.layers
        n = len(stages)
        caps = [self.capacity(g, i == 0, with_draft) for i, g in enumerate(stages)]
        if n > total:
            return None, f"{n} stages but {self.spec.model.name} has {total} layers"
        if sum(caps) < total or min(caps) < 1:
            worst = min(range(n), key=lambda i: caps[i])
            if min(caps) < 1:
                return None, (f"{self.spec.machines[stages[worst]].name} cannot hold one layer"
                              + (" beside the embedding, head and draft" if worst == 0 else ""))
            return None, (f"the machines taking part hold {sum(caps)} of {total} layers (weights + KV for "
                          f"{self.spec.context} positions" + (", the draft" if with_draft else "") + ")")
        if how == "even":
            layers = [total // n + (1 if j < total % n else 0) for j in range(n)]
            over = [i for i in range(n) if layers[i] > caps[i]]
            if over:
                i = over[0]
                need = layers[i] * self.per_layer_bytes() + self.fixed_bytes(stages[i], i == 0, with_draft)
                have = self.spec.machines[stages[i]].memory_bytes * self.spec.memory_fraction
                return None, (f"even split: {layers[i]} layers on {self.spec.machines[stages[i]].name} need "
                              f"{need / 1e9:.0f} GB, it has {have / 1e9:.0f} GB")
            return tuple(layers), ""
        speed = [1.0 / self.layer_s(g) for g in stages]
        if how == "balanced":
            return tuple(water_fill(total, speed, caps)), ""
        layers = [1] * n
        left = total - n
        for i in sorted(range(n), key=lambda i: -speed[i]):
            take = min(left, caps[i] - 1)
            layers[i] += take
            left -= take
        return tuple(layers), ""

    def memory_split(self, stages: tuple[int, ...]) -> tuple[tuple[int, ...] | None, str]:
        """exo's split: machine i's layers run from floor(L x its cumulative memory share before it) to the next
        cut (the last to L), or (None, the reason) where a stage gets none or more than it holds."""
        total = self.spec.model.layers
        memory = [self.spec.machines[g].memory_bytes for g in stages]
        cuts = [0]
        for i in range(1, len(stages)):
            cuts.append(int(total * sum(memory[:i]) / sum(memory)))
        cuts.append(total)
        layers = tuple(b - a for a, b in zip(cuts, cuts[1:]))
        for i, g in enumerate(stages):
            cap = self.capacity(g, i == 0, False)
            if not 1 <= layers[i] <= cap:
                return None, (f"memory split: {layers[i]} layers on {self.spec.machines[g].name}, which holds "
                              f"{cap}")
        return layers, ""

    def published(self) -> tuple[Scored, Scored]:
        """The published deployment (every machine in the file's order, its split, plain decode) and the search's
        best split (of SPLITS) of the same ring, by the closed forms; a ConfigError where either does not fit."""
        from testbed.core.errors import ConfigError

        spec = self.spec
        assert spec.published is not None
        stages = tuple(g for g, m in enumerate(spec.machines) for _ in range(m.count))
        how = spec.published.split
        layers, why = self.memory_split(stages) if how == "memory" else self.split(stages, "even", False)
        if layers is None:
            raise ConfigError(f"the published {how} split does not fit: {why}", source=spec.source,
                              key="published.split")
        (theirs,) = self.score(stages, layers, how, ("off",))
        mine = [self.score(stages, split_layers, split, ("off",))[0] for split in SPLITS
                for split_layers in [self.split(stages, split, False)[0]] if split_layers is not None]
        if not mine:
            raise ConfigError("none of the search's splits of the published ring fits in memory", source=spec.source,
                              key="published")
        return theirs, max(mine, key=lambda s: s.tok_s)  # the first of equals: even before balanced before greedy

    # --- the closed forms ------------------------------------------------------------------------------------
    def hops_s(self, stages: tuple[int, ...]) -> list[float]:
        regions = [self.spec.machines[g].region for g in stages]
        n = len(regions)
        if n == 1:
            return []
        return [self.spec.matrix.ms(regions[i], regions[(i + 1) % n]) / 1e3 for i in range(n)]

    def serialization_s(self, n_stages: int, n_positions: int) -> list[float]:
        if n_stages == 1 or math.isinf(self.rate_bytes_s):
            return [0.0] * (n_stages if n_stages > 1 else 0)
        return [self.frames(i, n_positions) / self.rate_bytes_s for i in range(n_stages)]

    def stage_s(self, stages: tuple[int, ...], layers: tuple[int, ...], n_tok: int) -> list[float]:
        context = self.spec.decode_context + n_tok - 1
        return [self._roofline(g, l, i == 0).seconds(n_tok, 1, context)
                for i, (g, l) in enumerate(zip(stages, layers))]

    def round_of(self, c: Candidate) -> Round:
        """Where a round's time goes: a plain lap (K = 0), or K drafts and the verification of K + 1 positions."""
        n_tok = c.k + 1 if c.mode != "off" else 1
        stage = self.stage_s(c.stages, c.layers, n_tok)
        hops = self.hops_s(c.stages)
        ser = self.serialization_s(len(c.stages), n_tok)
        cd = self.draft_s(c.stages) if c.mode != "off" else 0.0
        gamma = physics.gamma(self.spec.alpha, c.k) if c.mode != "off" else 1.0
        service = [s + (ser[i] if ser else 0.0) for i, s in enumerate(stage)]
        slow = max(range(len(stage)), key=lambda i: stage[i])
        far = max(range(len(hops)), key=lambda i: hops[i]) if hops else -1
        return Round(sum(stage), sum(hops), sum(ser), c.k * cd, gamma, slow, stage[slow], far,
                     hops[far] if hops else 0.0,
                     queue_free=c.mode != "async" or max(service) <= (c.k + 1) * cd)

    def lap_s(self, stages: tuple[int, ...], layers: tuple[int, ...], n_tok: int) -> float:
        return (sum(self.stage_s(stages, layers, n_tok)) + sum(self.hops_s(stages))
                + sum(self.serialization_s(len(stages), n_tok)))

    def cost_hour(self, stages: tuple[int, ...]) -> float:
        return sum(self.spec.machines[g].price_hour for g in stages)

    def objective(self, tok_s: float, cost: float) -> float:
        return tok_s / cost if self.spec.objective == "tok_s_per_dollar" else tok_s

    def score(self, stages: tuple[int, ...], layers: tuple[int, ...], split: str, modes: tuple[str, ...]
              ) -> list[Scored]:
        """Every way this ring and split decodes (modes), at its K*: one Scored each."""
        spec = self.spec
        cost = self.cost_hour(stages)
        out = []
        laps = [0.0] + [self.lap_s(stages, layers, n) for n in range(1, K_MAX + 2)] \
            if set(modes) - {"off"} else [0.0, self.lap_s(stages, layers, 1)]

        def add(c: Candidate, rate: float) -> None:
            out.append(Scored(c, rate, cost, self.objective(rate, cost)))

        if "off" in modes:
            add(Candidate(stages, layers, split, "off"), 1.0 / laps[1])
        if set(modes) == {"off"}:
            return out
        cd = self.draft_s(stages)
        a = spec.alpha
        gammas = [0.0] + [physics.gamma(a, k) for k in range(1, K_MAX + 1)]
        if "sync" in modes:
            k = max(range(1, K_MAX + 1), key=lambda k: (gammas[k] / (k * cd + laps[k + 1]), -k))
            add(Candidate(stages, layers, split, "sync", k), gammas[k] / (k * cd + laps[k + 1]))
        if "async" in modes:
            n = len(stages)
            # physics.overlap_run_s holds while every stage's work for a round (its pass over K + 1 positions and
            # its hop's frame) is under the draft's step (K + 1) c_d; past it rounds queue at that stage, and the
            # rounds a miss drops still hold it: such a K is not scored (where no K is, the window is refused)
            fits = [False] + [max(s + x for s, x in zip(self.stage_s(stages, layers, k + 1),
                                                        self.serialization_s(n, k + 1) or [0.0] * n))
                              <= (k + 1) * cd for k in range(1, K_MAX + 1)]
            free = [k for k in range(1, K_MAX + 1) if fits[k]]
            best_overlap = 0.0
            for window in sorted(spec.windows):
                if not free:
                    self.refused["overlap: at every K a stage's work for a round exceeds the draft's step (K + 1) "
                                 "c_d, so rounds would queue (its closed form does not hold)"] += 1
                    continue

                def rate(k: int) -> float:
                    hit = min(a ** k * spec.guess, 1.0 - 1e-12)
                    return physics.overlap_rate(gammas[k], hit, k, cd, laps[k + 1], 0.0, window)

                k = max(free, key=lambda k: (rate(k), -k))
                if rate(k) <= best_overlap * (1 + 1e-9):  # a wider window that gains nothing is the narrower one
                    self.duplicates += 1
                    continue
                best_overlap = rate(k)
                add(Candidate(stages, layers, split, "async", k, window), rate(k))
        return out

    def search(self) -> list[Scored]:
        """Every candidate scored, best objective first; refusals counted in self.refused by reason."""
        spec = self.spec
        scored: list[Scored] = []
        spec_modes = tuple(m for m in spec.modes if m != "off")
        for stages in self.placements():
            for with_draft, modes in ((False, ("off",) if "off" in spec.modes else ()), (True, spec_modes)):
                if not modes:
                    continue
                n_modes = len(modes) + (len(spec.windows) - 1 if "async" in modes else 0)
                seen: set[tuple[int, ...]] = set()  # a split that gives another's layers is that candidate
                for how in SPLITS:
                    layers, why = self.split(stages, how, with_draft)
                    if layers is None:
                        self.refused[why] += n_modes
                        continue
                    if layers in seen:
                        self.duplicates += n_modes
                        continue
                    seen.add(layers)
                    scored += self.score(stages, layers, how, modes)
        scored.sort(key=lambda s: (-s.objective, s.cost_hour, len(s.candidate.stages)))
        return scored
