"""python -m testbed whatif: a deployment from the catalogues (model, hardware, regions), predicted, then measured.

The scenario it builds is an ordinary one (printed with --show-scenario): [geometry] from the model preset, one stage
per region on `--hardware` (its roofline from the preset's datasheet), the ring's hops from the region catalogue's
measured one-way latencies. The tiny byte model computes and makes the tokens; the frames carry the preset's hidden
state. Predictions come from testbed.studies.whatif.predict (the presets alone); --measure runs the scenario.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import trio
from rich.console import Console
from rich.table import Table

from agents.zoo.prompts import prompt_window
from testbed.scenario.config import Scenario, apply_override, scenario_from_dict
from testbed.core.errors import ConfigError
from testbed.core.records import JsonRecord
from testbed.deploy.catalog import hardware_preset, model_preset, region, regions
from testbed.deploy.rules import PREFILL_HARDWARE, StageShare, devices_to_hold, stage_roofline
from testbed.studies.base import ensure_models_on, log_to, print_tables, write_json
from testbed.studies.whatif import predict
from testbed.studies.whatif.predict import TimeShare

CONTEXT = 256  # positions the tiny computing model holds: the prompt's window it computes and the tokens fit in it


@dataclass(frozen=True)
class WhatifResult(JsonRecord):
    whatif: str  # "MODEL on N x DEVICES x HARDWARE: A -> B -> C" (the report part's key)
    model: str
    hardware: str
    devices: int
    regions: tuple[str, ...]
    hops_ms: tuple[float, ...]  # one-way, from the catalogue
    fiber_floor_ms: tuple[float, ...]  # each hop's great-circle distance at 200,000 km/s
    regions_source: str
    rate_mbit: float
    prompt_tokens: int
    decode_frame_bytes: int  # a decode lap's frame on the first hop (header, stamp, the geometry's hidden state)
    predicted_tok_s: float
    ttft_predicted_s: float
    streams: int
    streams_predicted_tok_s: float
    breakdown: tuple[TimeShare, ...]
    upgrade_first: str
    draft: str = ""
    alpha: float = 0.0
    spec_k: int = 0
    spec_predicted_tok_s: float = 0.0
    measured: bool = False
    shaper: str = ""
    dilation: float = 1.0
    measured_tok_s: float | None = None
    ttft_measured_s: float | None = None
    hop_bytes_measured: tuple[int, ...] = ()
    run_predicted_tok_s: float | None = None  # the run's own prediction: the wall with its measured compute
    prefill_compute_s: float = 0.0  # TTFT's C_prefill(P): the stages' rooflines over the whole prompt
    prefill_source: str = ""  # the hardware that figure was worked out on, and whether it was the default

    @property
    def error_pct(self) -> float | None:
        return None if self.measured_tok_s is None else (self.measured_tok_s / self.predicted_tok_s - 1) * 100

    @property
    def ttft_error_pct(self) -> float | None:
        return None if self.ttft_measured_s is None else (self.ttft_measured_s / self.ttft_predicted_s - 1) * 100


def hardware_arg(text: str | None, model: str | None = None, stages: int = 1) -> tuple[str, int]:
    """--hardware PRESET[,N]: the preset and the devices per stage (default 1); not given, the default hardware
    (testbed.deploy.rules.PREFILL_HARDWARE, what a [geometry] stage without hardware prefills on), the fewest per
    stage that hold the largest stage's share (the entry's: one more layer where they do not divide, the head)."""
    if text is None:
        geometry, hardware = model_preset(model, key="--model"), hardware_preset(PREFILL_HARDWARE)
        share = StageShare(-(-geometry.layers // max(1, stages)), head=True)
        return PREFILL_HARDWARE, devices_to_hold(geometry, share, True, hardware)
    name, _, count = text.partition(",")
    try:
        devices = int(count) if count else 1
    except ValueError:
        devices = 0
    if devices < 1:
        raise ConfigError(f"expected PRESET[,N] with N >= 1 devices per stage, got {text!r}", key="--hardware")
    hardware_preset(name, key="--hardware")
    return name, devices


def region_names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ConfigError(f"expected regions A,B,C from the catalogue, got {text!r}", key="--regions")
    for name in names:
        region(name, key="--regions")
    if len(set(names)) != len(names):
        raise ConfigError(f"a region appears twice in {text!r}: one stage per region", key="--regions")
    return names


def link_rate_mbit(args: argparse.Namespace) -> float:
    """Every link's rate: --rate-mbit, else what one TCP flow between two regions gets (the region catalogue's
    flow_rate_mbit, sourced); 0 is unlimited."""
    return regions().flow_rate_mbit if args.rate_mbit is None else args.rate_mbit


def build(args: argparse.Namespace) -> Scenario:
    """The scenario of the deployment: [geometry], a stage per region on the hardware, the catalogue's hops."""
    model_preset(args.model, key="--model")
    names = region_names(args.regions)
    hardware, devices = hardware_arg(args.hardware, args.model, len(names))
    catalogue = regions()
    raw = {
        "name": f"whatif-{args.model}",
        "description": f"{args.model} on {devices} x {hardware} per stage, {' -> '.join(names)}",
        "model": "target" if len(names) <= 6 else "target-deep",  # the tiny model that computes the tokens
        "geometry": {"preset": args.model},
        "regions": {"names": names, "source": f"{catalogue.source} ({catalogue.date})",
                    "one_way_ms": [[catalogue.latency_ms(a, b) for b in names] for a in names]},
        "stages": [{"name": name, "region": name, "hardware": hardware, "devices": devices} for name in names],
        "network": {"rate_mbit": link_rate_mbit(args)} if link_rate_mbit(args) else {},
        "decode": {"mode": "plain", "tokens": args.tokens, "temperature": 0.0, "prompt_tokens": args.prompt},
    }
    for item in args.overrides:
        apply_override(raw, item, "whatif")
    return scenario_from_dict(raw, "whatif")


def draft_roofline(args: argparse.Namespace, scenario: Scenario):
    """The draft model whole on the entry stage's hardware (its roofline), or None without --draft."""
    if not args.draft:
        return None
    draft = model_preset(args.draft, key="--draft")
    hardware, devices = hardware_arg(args.hardware, args.model, scenario.n_stages)
    return stage_roofline(draft, StageShare(draft.layers, head=True), hardware_preset(hardware), devices)


def predicted(args: argparse.Namespace, scenario: Scenario) -> WhatifResult:
    names = tuple(st.name for st in scenario.stages)
    catalogue = regions()
    ring = [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))] if len(names) > 1 else []
    context = args.prompt + args.tokens / 2  # the decode's mean context
    k, spec_rate = predict.spec_at_best_k(scenario, args.alpha, draft_roofline(args, scenario), context) \
        if args.draft else (0, 0.0)
    shares = predict.breakdown(scenario, context)
    hardware, devices = hardware_arg(args.hardware, args.model, len(names))
    part = hardware_preset(hardware)
    prefill_source = (f"the rooflines of {args.model}'s share on {devices} x {hardware} a stage "
                      f"({'--hardware' if args.hardware else 'the default hardware, the fewest that hold a share'}; "
                      f"{part.flop_efficiency:.0%} of peak FLOP/s: {part.efficiency_source})")
    return WhatifResult(
        whatif=f"{args.model} on {len(names)} x {devices} x {hardware}: {' -> '.join(names)}", model=args.model,
        hardware=hardware, devices=devices, regions=names, hops_ms=tuple(link.delay_ms for link in scenario.ring),
        fiber_floor_ms=tuple(catalogue.fiber_floor_ms(a, b) for a, b in ring),
        regions_source=f"{catalogue.source} ({catalogue.date})", rate_mbit=link_rate_mbit(args),
        prompt_tokens=args.prompt, decode_frame_bytes=predict.frame_bytes(scenario, 0, 1),
        predicted_tok_s=predict.decode_tok_s(scenario, args.prompt, args.tokens - 1),
        ttft_predicted_s=predict.ttft_s(scenario, args.prompt), streams=args.streams,
        prefill_compute_s=predict.prefill_compute_s(scenario, args.prompt), prefill_source=prefill_source,
        streams_predicted_tok_s=predict.streams_tok_s(scenario, args.streams, context), breakdown=shares,
        upgrade_first=predict.upgrade_first(shares), draft=args.draft or "", alpha=args.alpha if args.draft else 0.0,
        spec_k=k, spec_predicted_tok_s=spec_rate)


def run(args: argparse.Namespace, console: Console) -> WhatifResult:
    for option in ("model", "regions"):
        if not getattr(args, option):
            raise ConfigError("required: name a preset or regions of testbed/deploy (e.g. --model llama-3.1-70b "
                              "--hardware h100-sxm,8 --regions hong-kong,ireland,virginia)", key=f"--{option}")
    if args.tokens < 2:
        raise ConfigError(f"expected --tokens >= 2 (the prompt's lap, then decode laps), got {args.tokens}",
                          key="--tokens")
    if not 1 <= args.prompt:
        raise ConfigError(f"expected --prompt >= 1 tokens, got {args.prompt}", key="--prompt")
    scenario = build(args)
    result = predicted(args, scenario)
    if not args.measure:
        return result
    if prompt_window(args.prompt, CONTEXT) + args.tokens >= CONTEXT:
        raise ConfigError(f"the tiny model computing the tokens holds {CONTEXT} positions: the prompt's window it "
                          f"computes ({prompt_window(args.prompt, CONTEXT)}) and --tokens must fit in them",
                          key="--tokens")
    from testbed.launch.launcher import run_scenario

    ensure_models_on(console)
    log_to(console)(f"measuring {result.whatif} on {args.shaper} ({args.tokens} tokens)")
    summary = trio.run(lambda: run_scenario(scenario, args.shaper, log=lambda m: None, dilation=args.dilation))
    return replace(result, measured=True, shaper=summary.shaper,
                   dilation=summary.dilation.factor if summary.dilation else 1.0, measured_tok_s=summary.measured_tok_s,
                   ttft_measured_s=summary.ttft.measured_s if summary.ttft else None,
                   hop_bytes_measured=tuple(h.bytes_per_lap or 0 for h in summary.per_hop),
                   run_predicted_tok_s=summary.predicted_tok_s)


def table(result: WhatifResult) -> Table:
    out = Table(title=f"What if: {result.whatif} (decode frame {result.decode_frame_bytes:,} B a hop"
                      + (f", links {result.rate_mbit:g} Mbit/s" if result.rate_mbit else "") + ")")
    for col in ("figure", "predicted", "measured", "error %"):
        out.add_column(col, justify="right")

    def err(pct: float | None) -> str:
        return "" if pct is None else f"{pct:+.2f}"

    out.add_row("decode tok/s", f"{result.predicted_tok_s:.3f}",
                "" if result.measured_tok_s is None else f"{result.measured_tok_s:.3f}", err(result.error_pct))
    out.add_row(f"TTFT s (P = {result.prompt_tokens})", f"{result.ttft_predicted_s:.3f}",
                "" if result.ttft_measured_s is None else f"{result.ttft_measured_s:.3f}", err(result.ttft_error_pct))
    out.add_row("  of which prefill compute s", f"{result.prefill_compute_s:.3f}", "", "")
    if result.draft:
        out.add_row(f"speculative tok/s ({result.draft}, a = {result.alpha:g}, K* = {result.spec_k})",
                    f"{result.spec_predicted_tok_s:.3f}", "", "")
    out.add_row(f"{result.streams} streams, continuous batching, aggregate tok/s",
                f"{result.streams_predicted_tok_s:.3f}", "", "")
    return out


def breakdown_table(result: WhatifResult) -> Table:
    out = Table(title=f"Where a decode token's time goes (upgrade first: {result.upgrade_first})")
    for col in ("part", "where", "ms", "share"):
        out.add_column(col, justify="right")
    for s in result.breakdown:
        out.add_row(s.part, s.where, f"{s.ms:.3f}", f"{s.share:.1%}")
    return out


def hops_table(result: WhatifResult) -> Table:
    out = Table(title=f"The ring's hops: one-way latency ({result.regions_source}) vs the fiber floor")
    for col in ("hop", "one-way ms", "fiber floor ms", "x floor"):
        out.add_column(col, justify="right")
    names = result.regions
    for i, (ms, floor) in enumerate(zip(result.hops_ms, result.fiber_floor_ms)):
        out.add_row(f"{names[i]} -> {names[(i + 1) % len(names)]}", f"{ms:.1f}", f"{floor:.1f}",
                    f"{ms / floor:.2f}" if floor > 0 else "")
    return out


def show(result: WhatifResult, args: argparse.Namespace, console: Console) -> None:
    tables = [table(result), breakdown_table(result)] + ([hops_table(result)] if result.hops_ms else [])
    print_tables(console, tables)
    console.print(f"prefill compute {result.prefill_compute_s:.3f} s for {result.prompt_tokens} positions: "
                  f"{result.prefill_source}", markup=False, highlight=False)
    if result.measured:
        console.print(f"measured on {result.shaper} at dilation x{result.dilation:g}; the run's own prediction (the "
                      f"wall with its measured compute): {result.run_predicted_tok_s:.3f} tok/s; bytes per decode lap "
                      f"on each hop: {', '.join(map(str, result.hop_bytes_measured))}", markup=False, highlight=False)
    if args.json:
        write_json(args.json, result.to_json(indent=2), console)
