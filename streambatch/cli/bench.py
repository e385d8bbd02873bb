"""``streambatch bench``: planning speed over a grid of N and W, against the seed.

The sweep runs in this process, warm (each planner is compiled, or loaded
from Numba's cache, before timing), best of ``repeats`` runs per cell.
Memory is the growth of peak resident memory during one planning call
(Linux: the VmHWM mark is reset before it), with the lengths already
loaded. The pure-Python seed comparison and compile times come from
``streambatch.cli.timing``, shared with ``bench/planning.py``.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..planners import make_plan
from . import timing
from .args import Formatter, whole


class SweepProgress:
    """One progress bar over named steps: tqdm on a terminal (if installed), else a line per step."""

    def __init__(self, total: int):
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        # A bar in a terminal; in logs and pipes a plain line per step reads better.
        live = tqdm is not None and sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True) if live else None
        self.total, self.done, self.started = total, 0, False

    def step(self, desc: str) -> None:
        """Start step ``desc``, counting the previous one as done."""
        if self.started:
            self.done += 1
            if self.bar:
                self.bar.update(1)
        self.started = True
        if self.bar:
            self.bar.set_description(desc, refresh=False)
        else:
            print(f"  [{self.done + 1}/{self.total}] {desc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar:
            if self.started:
                self.bar.update(1)
            self.bar.close()


def sweep(sizes: Iterable[int], worlds: Iterable[int], planners: Iterable[str], repeats: int | None,
          progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Rows of {planner, n, world_size, seconds, samples_per_s, peak_bytes} for every cell."""
    sizes, worlds, planners = sorted(set(sizes)), sorted(set(worlds)), list(planners)
    every = timing.audio_lengths(max(sizes))  # prefixes of one i.i.d. draw: every N sees the same distribution
    rows = []
    for name in planners:
        make_plan(every[:1000], timing.BUDGET, timing.CAP, 8, planner=name)  # compile / load from cache
        for n in sizes:
            lengths = every[:n]
            for w in worlds:
                progress(f"{name} N={n:,} W={w}")
                run = functools.partial(make_plan, lengths, timing.BUDGET, timing.CAP, w, planner=name)
                reps = repeats or (3 if n < 10_000_000 else 1)
                t = time.perf_counter()
                peak = timing.peak_growth(run)  # also the first timed run: at 40M samples each run counts
                seconds = time.perf_counter() - t
                if reps > 1:
                    seconds = min(seconds, timing.best_time(run, reps - 1))
                rows.append({"planner": name, "n": n, "world_size": w, "seconds": seconds,
                             "samples_per_s": n / seconds, "peak_bytes": peak})
    return rows


def run_bench(args: argparse.Namespace) -> int:
    import numba

    from .figures import check_figure_path, plot_throughput

    plot = check_figure_path(args.plot) if args.plot else None
    sizes, worlds = sorted(set(args.sizes)), sorted(set(args.worlds))
    planners = list(dict.fromkeys(args.planners))
    seed_runs = len(args.seed_worlds) * (1 + len(planners)) if args.seed_n else 0
    print(f"## Planning speed: {', '.join(planners)} ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, numba {numba.__version__}, numpy {np.__version__})\n")
    print(f"Audio-like lengths (log-normal 0.5-30 s at 50 frames/s), budget {timing.BUDGET:,} frames, "
          f"at most {timing.CAP} per batch; warm, one thread, best of "
          f"{args.repeats or '3 (1 from N = 10M)'} runs.\n")
    progress = SweepProgress(len(planners) * len(sizes) * len(worlds) + seed_runs)
    try:
        rows = sweep(sizes, worlds, planners, args.repeats, progress.step)
        seed_rows = timing.versus_seed(args.seed_n, args.seed_worlds, planners, progress.step) \
            if args.seed_n else []
    finally:
        progress.close()
    print("| planner | N | W | time (s) | samples/s | peak memory (MiB) | bytes/sample |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mem = ("n/a", "n/a") if r["peak_bytes"] is None else \
            (f"{r['peak_bytes'] / 2**20:,.0f}", f"{r['peak_bytes'] / r['n']:.1f}")
        print(f"| {r['planner']} | {_short(r['n'])} | {r['world_size']} | {r['seconds']:.3f} | "
              f"{_short(r['samples_per_s'])} | {mem[0]} | {mem[1]} |")
    if seed_rows:
        print(f"\n### Against the pure-Python seed algorithm (N={args.seed_n:,}, a size it finishes: it is "
              f"O(N x W^2), about a minute at W=64 and N=20,000)\n")
        print("| W | planner | streambatch (ms) | seed algorithm (s) | speed-up |")
        print("|---:|---|---:|---:|---:|")
        for r in seed_rows:
            print(f"| {r['world_size']} | {r['planner']} | {r['seconds'] * 1e3:.2f} | {r['seed_seconds']:.2f} | "
                  f"{r['ratio']:,.0f}x |")
    if args.compile_times:
        print("\n### Numba compile (fresh processes)\n")
        print("| planner | cold compile, first call (s) | warm cache, first call (s) | import streambatch (s) |")
        print("|---|---:|---:|---:|")
        for r in timing.compile_times(planners):
            print(f"| {r['planner']} | {r['cold_first_call']:.2f} | {r['warm_first_call']:.3f} | {r['import']:.2f} |")
    if plot:
        plot_throughput(plot, rows)
        print(f"\nwrote {plot}")
    return 0


def _short(v: float) -> str:
    """1234567 -> 1.2M; 40000000 -> 40M."""
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= div:
            x = v / div
            return f"{x:.1f}{unit}" if x < 10 and x != int(x) else f"{x:.0f}{unit}"
    return f"{v:.0f}"


def add_parser(sub: Any, planners: list[str]) -> None:
    b = sub.add_parser("bench", formatter_class=Formatter, help="planning speed at scale",
                       description=(
        "Planning speed on audio-like lengths (log-normal 0.5-30 s at 50 frames/s, budget 16,000\n"
        "frames, cap 64): every planner over a grid of N and W, warm, one process: time, samples/s,\n"
        "peak planning memory. Then the pure-Python seed algorithm, O(N x W^2), at a size it\n"
        "finishes. Tables are markdown; progress goes to stderr.\n\n"
        "example (Emilia scale, several minutes):\n"
        "  streambatch bench --sizes 1e6 1e7 4e7 --worlds 8 64 512 --plot bench.png"))
    b.add_argument("-n", "--sizes", type=whole(1), nargs="+", default=[100_000, 1_000_000], metavar="N",
                   help="numbers of samples (1e6 and 4e7 work)")
    b.add_argument("-w", "--worlds", type=whole(1), nargs="+", default=[8, 64], metavar="W", help="world sizes")
    b.add_argument("--planners", nargs="+", choices=planners, default=planners, metavar="P",
                   help=f"planners to time (default: all: {' '.join(planners)})")
    b.add_argument("--repeats", type=whole(1), metavar="R",
                   help="timed runs per cell, best kept (default: 3, 1 from N >= 1e7)")
    b.add_argument("--seed-n", type=whole(0), default=20_000, metavar="N",
                   help="samples for the pure-Python seed comparison (0 skips it)")
    b.add_argument("--seed-worlds", type=whole(1), nargs="+", default=[8], metavar="W",
                   help="world sizes for the seed comparison (its time grows as W^2: W=64 at 20,000 takes ~1 min)")
    b.add_argument("--compile-times", action="store_true",
                   help="also time Numba compilation in fresh processes (cold and warm cache; ~1 min)")
    b.add_argument("--plot", metavar="FILE.png", help="also draw throughput against N and W (needs matplotlib)")
    b.set_defaults(run=("bench", "run_bench"))
