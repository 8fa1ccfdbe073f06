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
- The wire (dims): each codec of [wire] codecs changes the bytes of every HIDDEN frame (the serialization term of
  T_ring on a rated link) and costs its encode and decode (dims.codec_s); a codec that gives an earlier one's bytes
  (f16 of a bf16 model is f32's) is scored once, as the earlier. KV `ship` (placement.kv) adds each stage's new K
  and V (its layers' K and V of the block's positions, and a frame header) to its hop, as agents.process.ring does.
- TP (placement.parallel "tp"): the machines of one kind in one region as one stage, a tensor-parallel group: its
  roofline is its layers on all its devices, plus two ring all-reduces a layer over the [lan] link (dims.allreduce_s,
  physics.tp_token_s in closed form); it holds its layers' weights and KV split over its machines, the entry's
  extras on each. A PP hop between two machines of a region keeps the matrix's diagonal (0 ms) at rate_mbit.
- Round trips ([wire] round_trips = n): a hop whose protocol waits out n round trips waits 2n - 1 one-way delays
  (dims.Dims.hop_delays), so T_ring becomes (2n - 1) T_ring; the bytes are serialized once.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

from testbed.core import physics
from testbed.core.roofline import Roofline
from testbed.deploy.rules import StageShare, resident_bytes, stage_roofline
from testbed.studies.search import published
from testbed.studies.search.candidate import Candidate, Frames, Round, Scored  # noqa: F401 - re-exported
from testbed.studies.search.dims import allreduce_s, codec_s
from testbed.studies.search.spec import SearchSpec
from testbed.studies.search.split import SPLITS, water_fill

K_MAX = 32  # the largest K searched for K* (studies.whatif.predict.K_MAX)


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
        self._hidden = functools.cache(self._hidden_uncached)
        self.same_bytes: dict[str, str] = {}  # a codec that carries an earlier one's bytes -> that one
        codecs: list[str] = []
        for codec in spec.dims.codecs:
            same = next((c for c in codecs if frames is not None and all(
                frames(0, n, c) == frames(0, n, codec) for n in (1, K_MAX + 1))), None)
            if same is None:
                codecs.append(codec)
            else:
                self.same_bytes[codec] = same
        self.wires = tuple((codec, kv) for codec in codecs for kv in spec.dims.kv)  # (codec, kv) of every candidate

    # --- the pieces -------------------------------------------------------------------------------------------
    def _roofline_uncached(self, kind: int, layers: int, head: bool, ranks: int = 1) -> Roofline:
        machine = self.spec.machines[kind]
        return stage_roofline(self.spec.model, StageShare(layers, head), machine.hardware, machine.devices * ranks)

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

    def room(self, kind: int, entry: bool, with_draft: bool, ranks: int = 1) -> float:
        """Bytes a stage of `ranks` such machines has for its layers: each machine's share of memory_fraction less
        the entry's extras (on every machine of a TP group)."""
        return ranks * (self.spec.machines[kind].memory_bytes * self.spec.memory_fraction
                        - self.fixed_bytes(kind, entry, with_draft))

    def capacity(self, kind: int, entry: bool, with_draft: bool, ranks: int = 1) -> int:
        """The most layers a stage of this machine (a TP group of `ranks`) holds: weights, KV for the context, the
        entry's extras."""
        return max(0, int(self.room(kind, entry, with_draft, ranks) // self.per_layer_bytes()))

    def layer_s(self, kind: int, ranks: int = 1) -> float:
        """One layer's decode pass on the machine (a TP group: and its all-reduces) at the decode's context."""
        return self._roofline(kind, 1, False, ranks).seconds(1, 1, self.spec.decode_context) \
            + self.allreduce_s(ranks, 1, 1)

    def allreduce_s(self, ranks: int, layers: int, positions: int) -> float:
        m = self.spec.model
        return allreduce_s(ranks, layers, positions, m.bytes_per_value, m.d_model, self.spec.dims)

    def stage_name(self, kind: int, ranks: int = 1) -> str:
        name = self.spec.machines[kind].name
        return f"{ranks}x {name} (TP)" if ranks > 1 else name

    # --- enumeration ------------------------------------------------------------------------------------------
    def placements(self) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Every ring of machines the constraints allow, as (a machine kind a stage, machines a stage): see the
        module's notes."""
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
            blocks = {r: self.groupings(sorted((g for g, n in enumerate(counts) if n and machines[g].region == r
                                                for _ in range(n)), key=lambda g: (-machines[g].memory_bytes, g)))
                      for r in used}
            if spec.head_region:
                rest = [r for r in used if r != spec.head_region]
                orders = ([spec.head_region, *p] for p in itertools.permutations(rest))
            else:
                orders = (list(p) for p in itertools.permutations(used))
            for order in orders:
                for ways in itertools.product(*(blocks[r] for r in order)):
                    ring = [stage for way in ways for stage in way]
                    yield tuple(g for g, _ in ring), tuple(n for _, n in ring)

    def groupings(self, block: list[int]) -> list[list[tuple[int, int]]]:
        """A region's machines as stages, (kind, machines) each: one a stage, and with placement.parallel "tp" also
        every run of two or more of a kind as one TP group."""
        runs = [(g, len(list(same))) for g, same in itertools.groupby(block)]
        options = [[[(g, 1)] * n] + ([[(g, n)]] if self.spec.dims.tp and n > 1 else []) for g, n in runs]
        return [[stage for part in combo for stage in part] for combo in itertools.product(*options)]

    def split(self, stages: tuple[int, ...], how: str, with_draft: bool, ranks: tuple[int, ...] = ()
              ) -> tuple[tuple[int, ...] | None, str]:
        """Each stage's layers under split `how`, or (None, the reason) where memory does not allow it."""
        total = self.spec.model.layers
        n = len(stages)
        ranks = ranks or (1,) * n
        caps = [self.capacity(g, i == 0, with_draft, r) for i, (g, r) in enumerate(zip(stages, ranks))]
        if n > total:
            return None, f"{n} stages but {self.spec.model.name} has {total} layers"
        if sum(caps) < total or min(caps) < 1:
            worst = min(range(n), key=lambda i: caps[i])
            if min(caps) < 1:
                return None, (f"{self.stage_name(stages[worst], ranks[worst])} cannot hold one layer"
                              + (" beside the embedding, head and draft" if worst == 0 else ""))
            return None, (f"the machines taking part hold {sum(caps)} of {total} layers (weights + KV for "
                          f"{self.spec.context} positions" + (", the draft" if with_draft else "") + ")")
        if how == "even":
            layers = [total // n + (1 if j < total % n else 0) for j in range(n)]
            over = [i for i in range(n) if layers[i] > caps[i]]
            if over:
                i, r = over[0], ranks[over[0]]
                need = layers[i] * self.per_layer_bytes() + r * self.fixed_bytes(stages[i], i == 0, with_draft)
                have = r * self.spec.machines[stages[i]].memory_bytes * self.spec.memory_fraction
                return None, (f"even split: {layers[i]} layers on {self.stage_name(stages[i], r)} need "
                              f"{need / 1e9:.0f} GB, it has {have / 1e9:.0f} GB")
            return tuple(layers), ""
        speed = [1.0 / self.layer_s(g, r) for g, r in zip(stages, ranks)]
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
        return published.memory_split(self, stages)

    def published(self) -> tuple[Scored, Scored]:
        return published.published(self)

    # --- the closed forms ------------------------------------------------------------------------------------
    def hops_s(self, stages: tuple[int, ...]) -> list[float]:
        """Each hop's wait on its link: its one-way delay, 2n - 1 times where its protocol makes n round trips."""
        regions = [self.spec.machines[g].region for g in stages]
        n = len(regions)
        if n == 1:
            return []
        each = self.spec.dims.hop_delays
        return [each * self.spec.matrix.ms(regions[i], regions[(i + 1) % n]) / 1e3 for i in range(n)]

    def hop_bytes(self, layers: tuple[int, ...], n_positions: int, wire: tuple[str, str] = ("f32", "local")
                  ) -> list[int]:
        """Each hop's bytes for a block of n positions: the HIDDEN frame under the codec, and with KV shipped the
        sending stage's new K and V (a KV frame: its header, the block's positions on its layers)."""
        codec, kv = wire
        n = len(layers)
        if n == 1:
            return []
        from agents.process.wire import HEADER

        return [self.frames(i, n_positions, codec) + (HEADER.size + n_positions * layers[i] * self.kv_layer_bytes
                                                      if kv == "ship" else 0) for i in range(n)]

    def serialization_s(self, layers: tuple[int, ...], n_positions: int, wire: tuple[str, str] = ("f32", "local")
                        ) -> list[float]:
        if math.isinf(self.rate_bytes_s):
            return [0.0] * (len(layers) if len(layers) > 1 else 0)
        return [b / self.rate_bytes_s for b in self.hop_bytes(layers, n_positions, wire)]

    def codec_s(self, n_stages: int, n_positions: int, codec: str) -> list[float]:
        each = codec_s(codec, n_positions, self.spec.model.d_model, self.spec.dims) if n_stages > 1 else 0.0
        return [each] * (n_stages if n_stages > 1 else 0)

    def stage_s(self, stages: tuple[int, ...], layers: tuple[int, ...], n_tok: int, ranks: tuple[int, ...] = ()
                ) -> list[float]:
        context = self.spec.decode_context + n_tok - 1
        ranks = ranks or (1,) * len(stages)
        return [self._roofline(g, l, i == 0, r).seconds(n_tok, 1, context) + self.allreduce_s(r, l, n_tok)
                for i, (g, l, r) in enumerate(zip(stages, layers, ranks))]

    def hop_s(self, layers: tuple[int, ...], n_tok: int, wire: tuple[str, str]) -> list[float]:
        """Each hop's serialization and codec time for a block of n_tok positions (hop_bytes at the rate)."""
        hidden = self._hidden(len(layers), n_tok, wire[0])
        if wire[1] != "ship" or math.isinf(self.rate_bytes_s):
            return list(hidden)
        from agents.process.wire import HEADER

        return [x + (HEADER.size + n_tok * l * self.kv_layer_bytes) / self.rate_bytes_s
                for x, l in zip(hidden, layers)]

    def _hidden_uncached(self, n_stages: int, n_tok: int, codec: str) -> tuple[float, ...]:
        """Each hop's HIDDEN frame at the rate and the codec's time, without shipped KV (the same for every split)."""
        layers = (1,) * n_stages
        return tuple(a + b for a, b in zip(self.serialization_s(layers, n_tok, (codec, "local")),
                                           self.codec_s(n_stages, n_tok, codec)))

    def round_of(self, c: Candidate) -> Round:
        """Where a round's time goes: a plain lap (K = 0), or K drafts and the verification of K + 1 positions."""
        n_tok = c.k + 1 if c.mode != "off" else 1
        stage = self.stage_s(c.stages, c.layers, n_tok, c.boxes)
        hops = self.hops_s(c.stages)
        ser = self.serialization_s(c.layers, n_tok, c.wire)
        enc = self.codec_s(len(c.stages), n_tok, c.codec)
        cd = self.draft_s(c.stages) if c.mode != "off" else 0.0
        gamma = physics.gamma(self.spec.alpha, c.k) if c.mode != "off" else 1.0
        service = [s + (ser[i] + enc[i] if ser else 0.0) for i, s in enumerate(stage)]
        slow = max(range(len(stage)), key=lambda i: stage[i])
        far = max(range(len(hops)), key=lambda i: hops[i]) if hops else -1
        return Round(sum(stage), sum(hops), sum(ser), c.k * cd, sum(enc), gamma, slow, stage[slow], far,
                     hops[far] if hops else 0.0,
                     queue_free=c.mode != "async" or max(service) <= (c.k + 1) * cd)

    def lap_s(self, c: Candidate, n_tok: int) -> float:
        return (sum(self.stage_s(c.stages, c.layers, n_tok, c.boxes)) + sum(self.hops_s(c.stages))
                + sum(self.hop_s(c.layers, n_tok, c.wire)))

    def cost_hour(self, stages: tuple[int, ...], ranks: tuple[int, ...] = ()) -> float:
        return sum(self.spec.machines[g].price_hour * r for g, r in zip(stages, ranks or (1,) * len(stages)))

    def objective(self, tok_s: float, cost: float) -> float:
        return tok_s / cost if self.spec.objective == "tok_s_per_dollar" else tok_s

    def score(self, stages: tuple[int, ...], layers: tuple[int, ...], split: str, modes: tuple[str, ...],
              ranks: tuple[int, ...] = (), wires: tuple[tuple[str, str], ...] = (("f32", "local"),)
              ) -> list[Scored]:
        """Every way this ring and split decodes (modes) on every wire (codec, KV), at its K*: one Scored each. The
        stages' passes are the same on every wire: computed once, each wire's hops added to them."""
        base = Candidate(stages, layers, split, "off", ranks=ranks if any(r > 1 for r in ranks) else ())
        cost = self.cost_hour(stages, ranks)
        top = K_MAX + 1 if set(modes) - {"off"} else 1
        passes = [[]] + [self.stage_s(stages, layers, n, base.boxes) for n in range(1, top + 1)]
        ring = sum(self.hops_s(stages))
        out: list[Scored] = []
        for codec, kv in wires[:1] if len(stages) == 1 else wires:  # a ring of one stage has no hop to differ on
            c = replace(base, codec=codec, kv=kv)
            hops = [[]] + [self.hop_s(layers, n, c.wire) for n in range(1, top + 1)]
            laps = [0.0] + [sum(passes[n]) + ring + sum(hops[n]) for n in range(1, top + 1)]
            # a stage's work for a round of n positions: its pass and its hop's frame (overlap's queue-free check)
            work = [0.0] + [max(s + x for s, x in zip(passes[n], hops[n] or [0.0] * len(stages)))
                            for n in range(1, top + 1)]
            out += [Scored(x, rate, cost, self.objective(rate, cost)) for x, rate in self.rates(c, modes, laps, work)]
        return out

    def rates(self, c: Candidate, modes: tuple[str, ...], laps: list[float], work: list[float]
              ) -> list[tuple[Candidate, float]]:
        """Each mode's candidate and rate from the laps of n = 1..K_MAX + 1 positions: plain 1 / lap, sync at K*,
        async at each window's K* among the K whose rounds do not queue."""
        spec = self.spec
        out = []
        if "off" in modes:
            out.append((c, 1.0 / laps[1]))
        if set(modes) == {"off"}:
            return out
        cd = self.draft_s(c.stages)
        a = spec.alpha
        gammas = [0.0] + [physics.gamma(a, k) for k in range(1, K_MAX + 1)]
        if "sync" in modes:
            k = max(range(1, K_MAX + 1), key=lambda k: (gammas[k] / (k * cd + laps[k + 1]), -k))
            out.append((replace(c, mode="sync", k=k), gammas[k] / (k * cd + laps[k + 1])))
        if "async" in modes:
            # physics.overlap_run_s holds while every stage's work for a round (its pass over K + 1 positions and
            # its hop's frame) is under the draft's step (K + 1) c_d; past it rounds queue at that stage, and the
            # rounds a miss drops still hold it: such a K is not scored (where no K is, the window is refused)
            free = [k for k in range(1, K_MAX + 1) if work[k + 1] <= (k + 1) * cd]
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
                out.append((replace(c, mode="async", k=k, window=window), rate(k)))
        return out

    def search(self) -> list[Scored]:
        """Every candidate scored, best objective first; refusals counted in self.refused by reason."""
        spec = self.spec
        scored: list[Scored] = []
        spec_modes = tuple(m for m in spec.modes if m != "off")
        for stages, ranks in self.placements():
            for with_draft, modes in ((False, ("off",) if "off" in spec.modes else ()), (True, spec_modes)):
                if not modes:
                    continue
                n_modes = (len(modes) + (len(spec.windows) - 1 if "async" in modes else 0)) * len(self.wires)
                seen: set[tuple[int, ...]] = set()  # a split that gives another's layers is that candidate
                for how in SPLITS:
                    layers, why = self.split(stages, how, with_draft, ranks)
                    if layers is None:
                        self.refused[why] += n_modes
                        continue
                    if layers in seen:
                        self.duplicates += n_modes
                        continue
                    seen.add(layers)
                    scored += self.score(stages, layers, how, modes, ranks, self.wires)
        scored.sort(key=lambda s: (-s.objective, s.cost_hour, len(s.candidate.stages)))
        return scored
