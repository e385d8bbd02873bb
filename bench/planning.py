"""Planning speed: streambatch vs the pure-Python seed algorithm, at scale, and compile times.

    python bench/planning.py                 # the README table (a few minutes)
    python bench/planning.py --scale 1000000 # quicker, smaller at-scale row

Never part of the test run. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterable

import numpy as np

from streambatch.cli import timing
from streambatch.planners import PLANNERS


def at_scale(n: int = 10_000_000, world_size: int = 64, planners: Iterable[str] = ("greedy",),
             repeats: int = 3) -> list[dict]:
    """Warm planning time and peak planning memory, each planner in a fresh process.

    Memory is ``peak_growth`` of each run (the lengths already loaded), per sample.
    """
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lengths.npy")
        np.save(path, timing.audio_lengths(n))
        for name in planners:
            r = timing._child(path, world_size, name, repeats)
            rows.append({"planner": name, "n": n, "world_size": world_size, "seconds": r["seconds"],
                         "samples_per_s": n / r["seconds"], "bytes_per_sample": r["peak_bytes"] / n})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="samples for the comparison with the seed")
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 8, 16, 64])
    p.add_argument("--scale", type=int, default=10_000_000, help="samples for the at-scale row")
    p.add_argument("--scale-world", type=int, default=64)
    p.add_argument("--planners", nargs="+", default=sorted(PLANNERS))
    args = p.parse_args(argv)
    log = lambda s: print(f"  .. {s}", file=sys.stderr, flush=True)  # noqa: E731

    print(f"### Planning time vs the pure-Python seed algorithm (N={args.n:,}, audio-like lengths, "
          f"budget {timing.BUDGET:,}, cap {timing.CAP})\n")
    print("| W | planner | streambatch (ms) | seed algorithm (s) | speed-up |")
    print("|---|---|---|---|---|")
    for r in timing.versus_seed(args.n, args.worlds, args.planners, log):
        print(f"| {r['world_size']} | {r['planner']} | {r['seconds'] * 1e3:.2f} | {r['seed_seconds']:.2f} | "
              f"{r['ratio']:,.0f}x |")

    print(f"\n### At scale (N={args.scale:,}, W={args.scale_world}, warm, one core)\n")
    print("| planner | time (s) | samples/s | peak planning memory (bytes/sample) |")
    print("|---|---|---|---|")
    for r in at_scale(args.scale, args.scale_world, args.planners):
        print(f"| {r['planner']} | {r['seconds']:.2f} | {r['samples_per_s'] / 1e6:.1f}M | "
              f"{r['bytes_per_sample']:.1f} |")

    print("\n### Numba compile (fresh processes)\n")
    print("| planner | cold compile, first call (s) | warm cache, first call (s) | import streambatch (s) |")
    print("|---|---|---|---|")
    for r in timing.compile_times(args.planners):
        print(f"| {r['planner']} | {r['cold_first_call']:.2f} | {r['warm_first_call']:.3f} | {r['import']:.2f} |")


if __name__ == "__main__":
    main()
