"""bench, sections 3b and 6: the real backends against the virtual reference, and rings only simulated time holds."""

from __future__ import annotations

import time

import trio
from rich.console import Console
from rich.table import Table


def against_virtual_table(console: Console, by_shaper: dict, variants_by_shaper: dict, variants: tuple) -> list[dict]:
    """Section 3b: each Table 2 row's rate on every real backend next to the virtual run of the same row (the
    exact reference: the closed form with no overhead), as the real backend's error against it."""
    reference = {r.scenario: r.summary.measured_tok_s for r in by_shaper["virtual"]}
    table = Table(title="3b. Table 2 rows: each real backend's rate against the virtual reference (simulated time)")
    table.add_column("row")
    table.add_column("virtual tok/s", justify="right")
    columns = [(shaper, label) for shaper, results in by_shaper.items() if shaper != "virtual"
               for label, _, _ in variants_by_shaper.get(shaper, variants)]
    for shaper, label in columns:
        table.add_column(f"{shaper} {label} err %", justify="right")
    rows = []
    for name, ref in reference.items():
        cells, row = [], {"row": name, "virtual_tok_s": ref}
        for shaper, label in columns:
            mine = [r for r in by_shaper[shaper] if r.scenario == name and r.variant == label]
            err = (mine[0].summary.measured_tok_s / ref - 1) * 100 if mine else None
            row[f"{shaper} {label}"] = err
            cells.append("-" if err is None else f"{err:+.2f}")
        rows.append(row)
        table.add_row(name, f"{ref:.4f}", *cells)
    console.print(table)
    return rows


# Section 6: rings the real backends cannot hold, on simulated time (netem.virtual): (stages, streams, tokens).
# On this box: 128 x 1,024 x 32 in 34-38 s, peak RSS ~2.1 GB (1.6 GB of it the six computing stages' KV caches of
# 1,024 streams); 1000 x 1 x 32 in 17-20 s. The first took ~280 s while each stream's frame crossed each hop as a
# frame of its own (4.2 M frame-hops) and each prompt went alone (130 k): a continuous batch, and the prompts of one
# length, now cross each hop as one BATCH frame, and a virtual link is one task.
VIRTUAL_SCALE = ((128, 1024, 32), (1000, 1, 32))
VIRTUAL_SCALE_QUICK = ((32, 64, 8), (200, 1, 4))
VIRTUAL_HOP_MS = 280.0  # T_ring of every virtual scale ring, split evenly over its hops


def virtual_scale_scenario(n_stages: int, streams: int, tokens: int):
    """A ring of n_stages on the 6-layer target: six stages compute a layer each, the rest forward only
    (layers = 0), every stage with 2 ms of emulated compute (+0.02 ms per extra stream in a batch)."""
    from testbed.scenario.config import scenario_from_dict

    decode = ({"mode": "streams", "streams": streams, "batching": "continuous", "tokens": tokens} if streams > 1
              else {"tokens": tokens})
    stages = [{"name": f"s{i}", "compute_ms": 2.0, "per_token_ms": 0.02, **({} if i < 6 else {"layers": 0})}
              for i in range(n_stages)]
    return scenario_from_dict({"name": f"virtual{n_stages}x{streams}", "stages": stages,
                               "network": {"hops_ms": [VIRTUAL_HOP_MS / n_stages] * n_stages}, "decode": decode},
                              "<bench>")


def virtual_scale_row(n_stages: int, streams: int, tokens: int) -> dict:
    """One virtual scale ring, run in this process: its rate next to its prediction (the wall, or
    physics.streams_rates for many streams), its wall time and this process's peak RSS (every agent is in it)."""
    import resource

    from testbed.launch.launcher import run_scenario

    scenario = virtual_scale_scenario(n_stages, streams, tokens)
    started = time.monotonic()
    summary = trio.run(lambda: run_scenario(scenario, "virtual", log=lambda _m: None))
    wall_s = time.monotonic() - started
    if summary.streams is not None:
        measured, predicted = summary.streams.aggregate_tok_s, summary.streams.aggregate_predicted_tok_s
    else:
        measured, predicted = summary.measured_tok_s, summary.predicted_tok_s
    return {"ring": scenario.name, "stages": n_stages, "streams": streams, "tokens": tokens,
            "measured_tok_s": measured, "predicted_tok_s": predicted, "rel_error": measured / predicted - 1,
            "wall_s": wall_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def virtual_scale_table(console: Console, quick: bool) -> list[dict]:
    """Each virtual scale ring (virtual_scale_row) in a process of its own, so that each peak RSS is its own."""
    import json
    import subprocess
    import sys

    rows: list[dict] = []
    table = Table(title="6. scale on simulated time (--shaper virtual): rings the agent processes cannot reach")
    for col in ("ring", "streams", "tokens", "measured tok/s", "predicted", "rel. error", "wall s", "peak RSS MB"):
        table.add_column(col, justify="right")
    for n_stages, streams, tokens in VIRTUAL_SCALE_QUICK if quick else VIRTUAL_SCALE:
        out = subprocess.run([sys.executable, "-m", "testbed.studies.bench.virtual", str(n_stages), str(streams),
                              str(tokens)], check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        table.add_row(f"{n_stages} stages", str(streams), str(tokens), f"{row['measured_tok_s']:.4f}",
                      f"{row['predicted_tok_s']:.4f}", f"{row['rel_error']:+.1e}", f"{row['wall_s']:.1f}",
                      f"{row['peak_rss_mb']:.0f}")
    console.print(table)
    return rows


if __name__ == "__main__":  # one row, as JSON on the last line (virtual_scale_table runs each in its own process)
    import json
    import sys

    print(json.dumps(virtual_scale_row(*map(int, sys.argv[1:4]))))
