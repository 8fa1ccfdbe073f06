"""The weights study's real bytes (`--real userspace|netem`): a Hugging Face checkpoint cut by stage
(agents.weights.shards), served by an origin and fetched by every node over the backend's links
(testbed.launch.weights), for the geo ring and a co-located one, one stream and parallel, under each transport;
each node's time beside its closed form (testbed.launch.weights.predict_node_s).

The paths are the simulation's: each node's one-way delay to the origin from the regions, the node's downlink
(`--real-mbit`, lower than the simulated default: the relay moves every byte in Python on this box).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trio

from agents.weights import manifest
from testbed.core.jsonrecord import JsonRecord
from testbed.core.tcp import TRANSPORTS
from testbed.launch.weights import Route, distribute, predict_node_s
from testbed.scenario.config import Scenario
from testbed.studies.weights import inputs

DEFAULT_REAL_MBIT = 100.0
DEFAULT_REAL_DILATION = 3.0  # three nodes, the origin and the relay share 2 cores: at D = 1 they add 3-10%
# the checkpoint built when none is given: llama, 4 layers, hidden 512, vocab 4,096 (about 66 MB in float32)
BUILT = {"family": "llama", "layers": 4, "hidden": 512, "heads": 8, "vocab": 4096}


@dataclass(frozen=True)
class RealRow(JsonRecord):
    """One placement, transport and strategy with real bytes on one backend: the ring's ready time and each node's,
    measured beside the closed form."""

    backend: str
    placement: str
    transport: str
    strategy: str
    streams: int
    ring_ready_s: float  # measured: first node's start to the last node's last verified byte
    predicted_s: float
    bytes_total: int
    node_s: tuple[float, ...]
    node_predicted_s: tuple[float, ...]
    dilation: float = 1.0

    @property
    def error_pct(self) -> float:
        return (self.ring_ready_s / self.predicted_s - 1) * 100


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--real", choices=("userspace", "netem"),
                        help="also move a checkpoint's shards as real bytes over this backend's links")
    parser.add_argument("--real-checkpoint", metavar="PATH",
                        help="the Hugging Face checkpoint directory to cut by stage (default: one built here, "
                             "~66 MB)")
    parser.add_argument("--real-mbit", type=float, default=DEFAULT_REAL_MBIT, metavar="R",
                        help=f"every node's downlink for the real bytes, Mbit/s (default {DEFAULT_REAL_MBIT:g})")
    parser.add_argument("--real-dilation", type=float, default=DEFAULT_REAL_DILATION, metavar="D",
                        help="run the real bytes' delays D times longer and rates D times slower, and report the "
                             f"times over D: the box's own cost per byte shrinks D-fold (default "
                             f"{DEFAULT_REAL_DILATION:g})")


def checkpoint(args: argparse.Namespace, scratch: Path) -> Path:
    if args.real_checkpoint:
        return Path(args.real_checkpoint.removeprefix("hf:"))
    from agents.hf.build import build_checkpoint

    return build_checkpoint(scratch / "checkpoint", BUILT["family"], layers=BUILT["layers"], hidden=BUILT["hidden"],
                            heads=BUILT["heads"], vocab=BUILT["vocab"])


def routes(scenario: Scenario, regions: list[str], origin: str, local_s: float, mbit: float) -> list[Route]:
    return [Route(inputs.one_way_s(scenario, origin, region, local_s) * 1e3, mbit) for region in regions]


def measure(args: argparse.Namespace, scenario: Scenario, placements: list[tuple[str, list[str]]],
            streams: int, log) -> list[RealRow]:
    from agents.hf.checkpoint import Checkpoint
    from agents.weights.shards import shard_by_stage  # safetensors.torch: torch, only when real bytes are asked for

    rows = []
    with tempfile.TemporaryDirectory(prefix="geo-ring-weights-") as scratch:
        src = checkpoint(args, Path(scratch))
        n_layer = Checkpoint.open(src).shape.n_layer
        files = shard_by_stage(src, Path(scratch) / "origin", scenario.layer_ranges(n_layer))
        origin = Path(scratch) / "origin"
        sizes = [[(origin / name).stat().st_size for name in names] for names in files]
        manifest_bytes = len(manifest.dumps(manifest.build(origin)))
        for placement, regions in placements:
            paths = routes(scenario, regions, args.origin, args.local_ms / 1e3, args.real_mbit)
            for transport in ([args.transport] if args.transport else TRANSPORTS):
                for name, p in (("one stream", 1), (f"{streams} streams", streams)):
                    dest = Path(tempfile.mkdtemp(dir=scratch))
                    done = trio.run(lambda: distribute(paths, files, origin, dest, shaper_kind=args.real,
                                                       transport=transport, streams=p,
                                                       dilation=args.real_dilation, log=log))
                    predicted = [predict_node_s(paths[i], sizes[i], p, transport, args.real == "netem",
                                                manifest_bytes, manifest.CHUNK_BYTES) for i in range(len(paths))]
                    rows.append(RealRow(done.backend, placement, transport, name, p, done.ready_s, max(predicted),
                                        sum(n.fetched_bytes for n in done.nodes),
                                        tuple(n.seconds for n in done.nodes), tuple(predicted),
                                        args.real_dilation))
                    log(f"real {placement} {transport} {name}: ready {done.ready_s:.3f} s, predicted "
                        f"{max(predicted):.3f} s ({rows[-1].error_pct:+.2f}%)")
    return rows
