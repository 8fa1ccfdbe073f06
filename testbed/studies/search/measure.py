"""python -m testbed search FILE: the best deployment of a model from the machines and regions a user has.

Every candidate the file allows (space.Space: which machines, the ring order of their regions, the layer split,
speculation off / synchronous / overlapped at K*, the codec, KV local or shipped, TP groups inside a region; and
goodput.ranked's batch caps) is refused with its reason where it does not fit in memory, else
scored by the closed forms; the best are printed with where a round's time goes, the Pareto frontier of rate
against $/h beside them, and the top few are built as scenarios (one stage per machine, its roofline of its layers
on its devices, the hops from the region matrix; whatif --measure's way) and run on virtual time, measured next to
predicted.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import trio
from rich.console import Console

from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.scenario.config import Scenario
from testbed.studies.base import dilation_of, ensure_models_on, log_to
from testbed.studies.search.space import Candidate, Frames, Scored, Space
from testbed.studies.search import goodput
from testbed.studies.search.draws import draws_text, finite_run
from testbed.studies.search.scenarios import build, ring_text
from testbed.studies.search.spec import PER_DOLLAR, SERVING, SearchSpec, load_spec

TOP = 5  # candidates printed
CONFIRM = 3  # candidates run on virtual time
DEFAULT_SETTINGS = "f32, KV local, PP"  # a candidate's wire, KV and parallelism where none is searched


@dataclass(frozen=True)
class CandidateRow(JsonRecord):
    """One scored candidate, as printed: the ring, the split, the decode, the figures and where a round goes."""

    rank: int  # 1 = the winner; 0 = not among the printed (the baseline, a frontier point)
    ring: str  # "h100-va -> a100-oh -> ...", stage 0 (the entry) first
    machines: tuple[str, ...]
    regions: tuple[str, ...]
    layers: tuple[int, ...]
    split: str
    mode: str  # "off", "sync", "async"
    k: int
    window: int
    tok_s: float
    cost_hour: float
    objective: float
    compute_ms: float  # a round's (the stages' passes)
    propagation_ms: float
    serialization_ms: float
    draft_ms: float
    tokens_per_round: float
    bottleneck: str  # the largest part of a round, in words
    queue_free: bool = True
    goodput_req_s: float | None = None  # the goodput objectives: the highest rate the queueing model says meets
    # the SLO (None: not served, as a speculating candidate or one outside the pool)
    codec: str = "f32"  # the hidden states' codec on every hop
    kv: str = "local"  # "ship": each stage's new K and V travel on its hop too
    ranks: tuple[int, ...] = ()  # machines a stage (a TP group where > 1); (): one each
    cap: int = 0  # the goodput objectives: the streams cap served at (0: not served)
    codec_ms: float = 0.0  # the codec's encode and decode on every hop, a round

    @property
    def decode(self) -> str:
        return {"off": "plain", "sync": f"spec K {self.k}", "async": f"overlap K {self.k} W {self.window}"}[self.mode]

    @property
    def settings(self) -> str:
        """The wire, the KV, the parallelism and the cap, in words ("int8-block, KV local, TP 2x h100-va, cap 16")."""
        groups = [f"{n}x {name}" for n, name in zip(self.ranks, self.machines) if n > 1]
        return (f"{self.codec}, KV {self.kv}" + (f", TP {' + '.join(groups)}" if groups else ", PP")
                + (f", cap {self.cap}" if self.cap else ""))


@dataclass(frozen=True)
class Refusal(JsonRecord):
    reason: str
    candidates: int


@dataclass(frozen=True)
class Confirmation(JsonRecord):
    """A candidate built as a scenario and run: its measured rate beside the closed form's."""

    rank: int
    ring: str
    decode: str
    predicted_tok_s: float  # the search's closed form (speculation: at the stated alpha)
    measured_tok_s: float
    run_predicted_tok_s: float  # the run's own closed form (speculation: with the run's realized acceptance)
    shaper: str
    dilation: float = 1.0  # the run's time dilation (1 on virtual time)
    capped_error_pct: float | None = None  # where the budget capped D: the error its overhead leaves on the rate
    # synchronous speculation: the search's rate for a run of this many tokens (its last round's surplus dropped),
    # and the relative spread (%) the acceptance draws give that run's rate (the law of its rounds: lap_law)
    finite_tok_s: float | None = None
    draw_sd_pct: float | None = None

    @property
    def draw_z(self) -> float | None:
        """Measured against the finite run's expected rate, in the draws' standard deviations."""
        if self.finite_tok_s is None or not self.draw_sd_pct:
            return None
        return (self.measured_tok_s / self.finite_tok_s - 1) * 100 / self.draw_sd_pct

    @property
    def error_pct(self) -> float:
        """Measured against the closed form the run's own draws give (for plain decode, the search's own)."""
        return (self.measured_tok_s / self.run_predicted_tok_s - 1) * 100

    @property
    def vs_search_pct(self) -> float:
        return (self.measured_tok_s / self.predicted_tok_s - 1) * 100


@dataclass(frozen=True)
class CostPoint(JsonRecord):
    cost_hour: float
    tok_s: float
    ring: str
    decode: str


@dataclass(frozen=True)
class PublishedCase(JsonRecord):
    """A published deployment ([published]) beside the search's best split of the same machines and order: each
    stage's time a plain lap under both, and why one is faster."""

    row: int  # of ../shared/PUBLISHED.md
    system: str
    source: str
    assumed: str
    figure_tok_s: float  # as published (0: none for this setup); printed beside the prediction, never fitted to
    theirs: CandidateRow  # the published split, by the closed forms
    ours: CandidateRow  # the search's best split of the same ring
    layer_ms: tuple[float, ...]  # one layer's pass on each stage's machine
    theirs_stage_ms: tuple[float, ...]
    ours_stage_ms: tuple[float, ...]
    bottleneck: int  # the stage that takes the published split's lap longest
    reason: str
    winner: CandidateRow | None = None  # the search's best over every candidate (which machines, order, decode)

    @property
    def gain(self) -> float:
        return self.ours.tok_s / self.theirs.tok_s


@dataclass(frozen=True)
class SearchResult(JsonRecord):
    search: str  # the input file
    model: str
    objective: str
    alpha: float
    scored: int
    refused: int
    duplicates: int
    seconds: float
    refusals: tuple[Refusal, ...]
    excluded: tuple[Refusal, ...]  # placements the constraints rule out
    top: tuple[CandidateRow, ...]
    baseline: CandidateRow | None  # the best even split, plain decode, on the fewest regions that hold the model
    pareto: tuple[CandidateRow, ...]  # objective tok/s against $/h: none cheaper is as fast (the report part's key)
    by_cost: tuple[CostPoint, ...]  # the fastest candidate at each cost (the figure's cloud)
    confirmations: tuple[Confirmation, ...] = ()
    verification: Confirmation | None = None  # --verify: the winner run on a real backend
    published: PublishedCase | None = None  # [published]: the measured deployment beside the search's split
    workload: str = ""  # the goodput objectives: the [workload] served and its SLO, in words
    goodput_check: goodput.GoodputCheck | None = None  # --confirm under a goodput objective
    dims: str = ""  # the codecs, KV placements and parallelism searched, in words

    @property
    def per_second(self) -> float:
        return self.scored / self.seconds if self.seconds > 0 else 0.0


def reference_scenario(spec: SearchSpec) -> Scenario:
    """A one-stage scenario of the model: what its frames carry (Frames)."""
    return build(spec, Candidate((0,), (spec.model.layers,), "even", "off"), Space(spec, None))  # type: ignore[arg-type]


def row(space: Space, s: Scored, rank: int, goodput_req_s: float | None = None) -> CandidateRow:
    spec, c = space.spec, s.candidate
    r = space.round_of(c)
    parts = {"compute": r.compute_s, "propagation": r.propagation_s, "serialization": r.serialization_s,
             "draft": r.draft_s, "codec": r.codec_s}
    top = max(parts, key=lambda p: parts[p])
    total = sum(parts.values())
    machines = [spec.machines[g] for g in c.stages]
    if top == "compute":
        slow = space.stage_name(c.stages[r.slowest_stage], c.boxes[r.slowest_stage])
        words = (f"compute {top_share(parts, top, total)}: stage {r.slowest_stage} {slow} "
                 f"({c.layers[r.slowest_stage]} layers) {r.slowest_stage_s * 1e3:.1f} ms")
    elif top == "propagation":
        a, b = machines[r.longest_hop].region, machines[(r.longest_hop + 1) % len(machines)].region
        words = f"links {top_share(parts, top, total)}: {a} -> {b} {r.longest_hop_s * 1e3:.1f} ms"
    elif top == "serialization":
        words = f"link bandwidth {top_share(parts, top, total)}" + (" (shipped KV)" if c.kv == "ship" else "")
    elif top == "codec":
        words = f"codec {top_share(parts, top, total)}: {c.codec} encode and decode"
    else:
        words = f"draft {top_share(parts, top, total)}: K {c.k} x c_d"
    return CandidateRow(rank, ring_text(spec, c), tuple(m.name for m in machines), tuple(m.region for m in machines),
                        c.layers, c.split, c.mode, c.k, c.window, s.tok_s, s.cost_hour, s.objective,
                        r.compute_s * 1e3, r.propagation_s * 1e3, r.serialization_s * 1e3, r.draft_s * 1e3, r.tokens,
                        words, r.queue_free, goodput_req_s, c.codec, c.kv, c.boxes, c.cap, r.codec_s * 1e3)


def top_share(parts: dict[str, float], key: str, total: float) -> str:
    return f"{parts[key] / total:.0%}"


def baseline(space: Space, scored: Sequence[Scored]) -> Scored | None:
    """The best even split with plain decode on the fewest regions that hold the model (co-located first): a stage
    a machine, KV local, the file's first codec."""
    first = space.spec.dims.codecs[0]
    even = [s for s in scored if s.candidate.split == "even" and s.candidate.mode == "off" and not s.candidate.ranks
            and s.candidate.kv == "local" and s.candidate.codec == space.same_bytes.get(first, first)]
    if not even:
        return None
    fewest = min(len(set(space.spec.machines[g].region for g in s.candidate.stages)) for s in even)
    return next(s for s in even if len(set(space.spec.machines[g].region for g in s.candidate.stages)) == fewest)


def pareto(scored: Sequence[Scored]) -> list[Scored]:
    """Rate against $/h: the candidates no cheaper (or as cheap) candidate is as fast as, cheapest first."""
    out: list[Scored] = []
    for s in sorted(scored, key=lambda s: (s.cost_hour, -s.tok_s)):
        if not out or s.tok_s > out[-1].tok_s:
            out.append(s)
    return out


def by_cost(scored: Sequence[Scored], space: Space) -> list[CostPoint]:
    best: dict[float, Scored] = {}
    for s in scored:
        key = round(s.cost_hour, 6)
        if key not in best or s.tok_s > best[key].tok_s:
            best[key] = s
    return [CostPoint(s.cost_hour, s.tok_s, ring_text(space.spec, s.candidate), row(space, s, 0).decode)
            for _, s in sorted(best.items())]


def searched(spec: SearchSpec, top: int = TOP) -> tuple[SearchResult, Space, list[Scored]]:
    """Every candidate scored (the closed forms only); the result without confirmations."""
    space = Space(spec, Frames(reference_scenario(spec)))
    start = time.perf_counter()
    scored = space.search()
    seconds = time.perf_counter() - start
    refusals = tuple(Refusal(why, n) for why, n in space.refused.most_common())
    if not scored:
        reasons = "; ".join(f"{r.reason} ({r.candidates})" for r in refusals[:3]) or "every ring was ruled out by " \
            "the constraints: " + "; ".join(space.excluded)
        raise ConfigError(f"no deployment of {spec.model.name} fits the machines: {reasons}", source=spec.source,
                          key="machines")
    base = baseline(space, scored)
    ranking, rates, words = scored, dict[Candidate, float](), ""
    if spec.objective in SERVING:
        ranking, rates, words = goodput.ranking(space, scored, spec.objective in PER_DOLLAR)
        if not ranking:
            raise ConfigError("no candidate holds the KV of any cap of workload.streams: "
                              + "; ".join(space.refused), source=spec.source, key="workload.streams")
        refusals = tuple(Refusal(why, n) for why, n in space.refused.most_common())  # with the caps refused
    case = replace(published_case(space), winner=row(space, scored[0], 1)) if spec.published is not None else None
    result = SearchResult(
        search=spec.source, model=spec.model.name, objective=spec.objective, alpha=spec.alpha, scored=len(scored),
        refused=sum(space.refused.values()), duplicates=space.duplicates, seconds=seconds, refusals=refusals,
        excluded=tuple(Refusal(why, n) for why, n in space.excluded.most_common()),
        top=tuple(row(space, s, i + 1, rates.get(s.candidate)) for i, s in enumerate(ranking[:top])),
        baseline=row(space, base, 0, rates.get(base.candidate)) if base is not None else None,
        pareto=tuple(row(space, s, 0, rates.get(s.candidate)) for s in pareto(scored)), by_cost=tuple(by_cost(scored, space)),
        published=case, workload=words, dims=dims_text(space))
    return result, space, ranking


def dims_text(space: Space) -> str:
    """The wire, KV and parallelism searched, in words (a codec scored as another that gives its bytes said so)."""
    d = space.spec.dims
    same = "".join(f" ({a} carries {b}'s bytes for {space.spec.model.dtype}: scored as {b})"
                   for a, b in space.same_bytes.items())
    return (f"codecs {', '.join(dict.fromkeys(c for c, _ in space.wires))}{same}"
            + (f" (encode + decode at {d.codec_gb_s:g} GB/s)" if d.codec_gb_s else "")
            + f"; KV {', '.join(d.kv)}; " + ("a stage a machine, and TP groups of a region's machines of a kind over "
                                             f"a {d.lan_ms:g} ms / {d.lan_gbit_s:g} Gbit/s LAN" if d.tp
                                             else "a stage a machine"))


def published_case(space: Space) -> PublishedCase:
    """The file's published deployment and the search's best split of its ring (Space.published), and the reason:
    the stage that takes the published split's lap longest, and where the search's split moves its layers."""
    spec, pub = space.spec, space.spec.published
    assert pub is not None
    theirs, ours = space.published()
    stages = theirs.candidate.stages
    names = [spec.machines[g].name for g in stages]
    layer_ms = [space.layer_s(g) * 1e3 for g in stages]
    t = [x * 1e3 for x in space.stage_s(stages, theirs.candidate.layers, 1)]
    u = [x * 1e3 for x in space.stage_s(stages, ours.candidate.layers, 1)]
    a, b = theirs.candidate.layers, ours.candidate.layers
    worst = max(range(len(t)), key=lambda i: t[i])
    head = (f"under the published {pub.split} split stage {worst} {names[worst]} takes the lap longest: {a[worst]} "
            f"layers at {layer_ms[worst]:.2f} ms each" + (" and the LM head" if worst == 0 else "")
            + f", {t[worst]:.1f} of the lap's {sum(t):.1f} ms compute")
    gain = ours.tok_s / theirs.tok_s
    if gain <= 1 + 1e-9:
        if max(layer_ms) <= min(layer_ms) * 1.01:
            why = (f"; every stage passes a layer in the same time ({min(layer_ms):.2f} ms), so one stream's lap (the "
                   f"sum of the stages) is the same however the layers are split: no split beats it")
        else:
            cheaper = sorted({names[i] for i in range(len(t)) if layer_ms[i] < layer_ms[worst]})
            why = (f"; the stages where a layer costs less ({', '.join(cheaper) or 'none'}) hold no more layers in "
                   f"their memory: no split beats it")
        return PublishedCase(pub.row, pub.system, pub.source, pub.assumed, pub.tok_s, row(space, theirs, 0),
                             row(space, ours, 0), tuple(layer_ms), tuple(t), tuple(u), worst, head + why)
    off = [i for i in range(len(a)) if b[i] < a[i]]
    onto = [i for i in range(len(a)) if b[i] > a[i]]
    moved = sum(a[i] - b[i] for i in off)
    where = ", ".join(f"{names[i]} ({layer_ms[i]:.2f} ms a layer)" for i in onto)
    why = (f"; the search's {ours.candidate.split} split moves {moved} layers off "
           + ", ".join(f"{names[i]} ({a[i]} -> {b[i]})" for i in off) + f" onto {where}: stage {worst} "
           f"{t[worst]:.1f} -> {u[worst]:.1f} ms, the lap's compute {sum(t):.1f} -> {sum(u):.1f} ms, "
           f"{gain:.2f}x the rate")
    return PublishedCase(pub.row, pub.system, pub.source, pub.assumed, pub.tok_s, row(space, theirs, 0),
                         row(space, ours, 0), tuple(layer_ms), tuple(t), tuple(u), worst, head + why)


async def confirm(spec: SearchSpec, space: Space, scored: Sequence[Scored], n: int, args: argparse.Namespace, log,
                  base: Scored | None = None) -> list[Confirmation]:
    """The best n candidates (and `base`, rank 0: the baseline) built as scenarios and run on args.shaper, at
    args.dilation within an even share of args.budget_s each."""
    from testbed.launch.launcher import run_scenario

    out, shaper = [], args.shaper
    runs = [*enumerate(scored[:n], start=1), *([(0, base)] if base is not None else [])]
    for rank, s in runs:
        c = s.candidate
        scenario = build(spec, c, space, f"search-{rank}")
        shown = row(space, s, rank)
        decode = shown.decode + ("" if shown.settings == DEFAULT_SETTINGS else f" ({shown.settings})")
        log(f"confirming {f'#{rank}' if rank else 'the baseline'} on {shaper}: {ring_text(spec, c)}, {decode}, {spec.tokens} tokens...")
        summary = await run_scenario(scenario, shaper, log=lambda m: None, dilation=args.dilation,
                                     budget_s=args.budget_s / len(runs))
        part = summary.spec if c.mode == "sync" else summary.overlap if c.mode == "async" else None
        measured = part.measured_tok_s if part is not None else summary.measured_tok_s
        own = part.predicted_tok_s if part is not None else s.tok_s
        out.append(Confirmation(rank, ring_text(spec, c), decode, s.tok_s, measured, own, summary.shaper,
                                **dilation_of(summary), **finite_run(spec, c, s.tok_s)))
        log(f"      measured {measured:.3f} tok/s, predicted {s.tok_s:.3f} ({out[-1].vs_search_pct:+.2f}%), the "
            f"run's own form {own:.3f} ({out[-1].error_pct:+.2f}%)" + draws_text(out[-1], spec.tokens))
    return out


def run(args: argparse.Namespace, console: Console) -> SearchResult:
    if not args.file:
        raise ConfigError("required: the search file (or a shipped one: example, small)", key="FILE")
    spec = load_spec(args.file)
    if args.alpha is not None:
        if not 0.0 <= args.alpha < 1.0:
            raise ConfigError(f"expected an acceptance rate in [0, 1), got {args.alpha:g}", key="--alpha")
        spec = replace(spec, alpha=args.alpha, guess=args.alpha)
    if args.objective:
        spec = replace(spec, objective=args.objective)
        if args.objective in PER_DOLLAR and any(m.price_hour <= 0 for m in spec.machines):
            raise ConfigError(f"{args.objective} needs every machine's price_hour > 0", source=spec.source,
                              key="machines.price_hour")
        if args.objective in SERVING and (spec.workload is None or not spec.workload.goodput):
            raise ConfigError(f"{args.objective} needs a [workload] with its SLO targets (goodput = \"ttft:MS "
                              f"tpot:MS\")", source=spec.source, key="workload.goodput")
    result, space, scored = searched(spec, args.top)
    log = log_to(console)
    log(f"scored {result.scored:,} candidates in {result.seconds:.2f} s ({result.per_second:,.0f} a second); "
        f"refused {result.refused:,} (memory), {result.duplicates:,} splits gave another's layers")
    log(f"searched: {result.dims}")
    if args.confirm > 0 and spec.objective in SERVING:
        ensure_models_on(console)
        result = replace(result, goodput_check=trio.run(goodput.confirm, spec, space, scored, args, log))
    elif args.confirm > 0:
        ensure_models_on(console)
        base = baseline(space, scored)
        confirmations = trio.run(confirm, spec, space, scored, args.confirm, args, log,
                                 base if base is not None and base not in scored[:args.confirm] else None)
        result = replace(result, confirmations=tuple(confirmations))
    if args.verify:
        ensure_models_on(console)
        (verified,) = trio.run(confirm, spec, space, scored, 1, argparse.Namespace(**{**vars(args),
                                                                                   "shaper": args.verify}), log)
        result = replace(result, verification=verified)
    return result
