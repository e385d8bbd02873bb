"""Planning speed: streambatch vs the pure-Python seed algorithm, at scale, and compile times.

    python bench/planning.py                 # the README table (a few minutes)
    python bench/planning.py --scale 1000000 # quicker, smaller at-scale row
    python bench/planning.py --limit         # planning with a limit curve vs without (ratios, one process)

Never part of the test run. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterable

import numpy as np

from streambatch import make_plan
from streambatch.cli import timing
from streambatch.core.limits import LimitCurve
from streambatch.core.memory import MemoryModel
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


def bench_curve(lengths: np.ndarray, budget: int) -> LimitCurve:
    """A memory-model curve that binds on long clips: ``B * L * (1 + L / median) <= 2 * budget``, so a
    batch at the median length holds the budget's worth, longer ones fall off like ``1 / L**2`` (attention
    without a fused kernel), shorter ones are held by the budget."""
    med = float(np.median(lengths))
    model = MemoryModel(0.0, 1.0, 1.0 / med)
    return model.limit_curve(2 * budget, int(lengths.max()))


def limit_ratios(n: int, worlds: Iterable[int], planners: Iterable[str], repeats: int = 5,
                 lengths: np.ndarray | None = None, budget: int = timing.BUDGET, cap: int = timing.CAP) -> list[dict]:
    """Warm planning time with the limit curve (``bench_curve``) over without it, measured in one process,
    alternating the two ``repeats`` times (medians): a ratio, robust to a loaded machine where absolute
    times are not. Planners that refuse the curve (the seed-exact greedy) are left out."""
    lengths = timing.audio_lengths(n) if lengths is None else lengths
    curve = bench_curve(lengths, budget)
    rows = []
    for name in planners:
        if "limit" not in PLANNERS[name].option_names():
            continue
        for pack in (False, True) if "pack" in PLANNERS[name].option_names() else (False,):
            for w in worlds:
                kw = dict(world_size=w, planner=name, seed=1, **({"pack": True} if pack else {}))
                make_plan(lengths[:1000], budget, cap, **kw)  # compiled (or loaded) before timing
                make_plan(lengths[:1000], budget, cap, limit=curve, **kw)
                bare, curved = [], []
                for _ in range(repeats):
                    for times, extra in ((bare, {}), (curved, {"limit": curve})):
                        t = time.perf_counter()
                        p = make_plan(lengths, budget, cap, **kw, **extra)
                        times.append(time.perf_counter() - t)
                        steps = p.num_steps
                        if extra:
                            over = int(curve.check(p, lengths, packed=pack).over.size)
                        else:
                            bare_steps = steps
                            bare_over = int(curve.check(p, lengths, packed=pack).over.size)
                rows.append({"planner": name + (" packed" if pack else ""), "n": int(lengths.size), "world_size": w,
                             "seconds": float(np.median(bare)), "curve_seconds": float(np.median(curved)),
                             "ratio": float(np.median(curved) / np.median(bare)), "steps": bare_steps,
                             "curve_steps": steps, "over_without": bare_over, "over_with": over})
    return rows


def print_limit_table(rows: list[dict]) -> None:
    print("| planner | N | W | without (ms) | with the curve (ms) | ratio | steps without / with | "
          "batches over the curve without / with |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['planner']} | {r['n']:,} | {r['world_size']} | {r['seconds'] * 1e3:.1f} | "
              f"{r['curve_seconds'] * 1e3:.1f} | {r['ratio']:.2f}x | {r['steps']:,} / {r['curve_steps']:,} | "
              f"{r['over_without']:,} / {r['over_with']} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="samples for the comparison with the seed")
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 8, 16, 64])
    p.add_argument("--scale", type=int, default=10_000_000, help="samples for the at-scale row")
    p.add_argument("--scale-world", type=int, default=64)
    p.add_argument("--planners", nargs="+", default=sorted(PLANNERS))
    p.add_argument("--limit", action="store_true", help="only the limit-curve table: planning time with a curve "
                   "over without it, in one process (--limit-n samples, --worlds)")
    p.add_argument("--limit-n", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.limit:
        print(f"### Planning with a limit curve (N={args.limit_n:,}, audio-like lengths, budget {timing.BUDGET:,}, "
              f"cap {timing.CAP}; the curve B*L*(1 + L/median) <= 2 x budget; medians of {args.repeats} "
              f"alternating runs in one process)\n")
        print_limit_table(limit_ratios(args.limit_n, args.worlds, args.planners, args.repeats))
        return
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
