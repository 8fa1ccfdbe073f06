"""Draws the README's figure, docs/img/wall.png: the wall r = 1/(C + T_ring), measured on virtual time vs predicted.

    .venv/bin/python docs/make_figures.py [--out docs/img/wall.png]

Each of seed 000's Table 2 rows (built-in scenarios table2-*) runs 8 tokens on the virtual backend (simulated time,
a few seconds each); the line is the closed form over T_ring at the rows' measured compute.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROWS = ("table2-single-node", "table2-rack-lan", "table2-metro", "table2-regional", "table2-continental",
        "table2-two-continent", "table2-global")
TOKENS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "img" / "wall.png")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import testbed
    from testbed.core import physics

    runs = [testbed.run(name, shaper="virtual", tokens=TOKENS) for name in ROWS]
    t_ring_ms = [run.t_ring_s * 1e3 for run in runs]
    compute_s = sum(run.compute_s for run in runs) / len(runs)
    curve_ms = [t * 300 / 200 for t in range(201)]

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    ax.plot(curve_ms, [physics.wall_rate(compute_s, t / 1e3) for t in curve_ms], color="0.35",
            label=f"predicted  r = 1 / (C + T_ring),  C = {compute_s * 1e3:.1f} ms")
    ax.plot(t_ring_ms, [run.measured_tok_s for run in runs], "o", color="tab:red", markersize=7,
            label=f"measured: the Table 2 rings, {TOKENS} tokens each")
    labels = {"table2-single-node": ("single-node, rack-lan", (10, 2)), "table2-metro": ("metro", (8, -10))}
    for run, t in zip(runs, t_ring_ms):
        if run.scenario == "table2-rack-lan":  # 0.3 ms from single-node: one label for both
            continue
        text, offset = labels.get(run.scenario, (run.scenario.removeprefix("table2-"), (6, 5)))
        ax.annotate(text, (t, run.measured_tok_s), textcoords="offset points", xytext=offset, fontsize=8)
    ax.set_xlabel("T_ring: the ring's summed one-way latency (ms)")
    ax.set_ylabel("decode rate (tokens/s)")
    ax.set_title("The wall: one token per lap of the ring (virtual backend, simulated time)", fontsize=10)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    for run in runs:
        print(f"{run.scenario:22s} T_ring {run.t_ring_s * 1e3:6.1f} ms  measured {run.measured_tok_s:8.4f}  "
              f"predicted {run.predicted_tok_s:8.4f} tok/s")


if __name__ == "__main__":
    main()
