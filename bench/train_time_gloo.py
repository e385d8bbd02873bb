"""Check ``bench/train_time.py``'s simulation of W ranks against a real
2-process ``torch.distributed`` (gloo) run of the same steps.

    .venv/bin/python bench/train_time_gloo.py              # ~2 minutes on 2 cores (run it on a quiet machine)
    .venv/bin/python bench/train_time_gloo.py --steps 8 --corpus heavy

``train_time.py`` times each rank's batch of a step one after another in one
process and takes the slowest (no gradient all-reduce). Here the same plan
(bucketed, the fitted step cost, W = 2) is also trained for real: two
processes (one torch thread each, gloo on 127.0.0.1), the model wrapped in
``DistributedDataParallel`` so every step all-reduces its gradients, each
rank running its own batch of the step between two barriers. A step's real
time is rank 0's wall time from the first barrier to the second; its
simulated time is the slowest of the two batches timed alone in rank 0's
process (after the real run, the other rank idle), as ``train_time.py`` does.
Both are medians of ``--repeats`` runs. ``--steps`` steps are drawn
stratified over the plan's predicted step times (as ``train_time.py``).

Reported per step: real and simulated seconds and their difference; in sum:
the simulated share of the real time (what the all-reduce, the barrier and
two processes sharing the machine add) and the median |error| per step.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from model import make_step  # noqa: E402
from quality import steps_of  # noqa: E402
from train_time import corpus  # noqa: E402

from streambatch.core.cost import CostModel  # noqa: E402
from streambatch.planners import make_plan  # noqa: E402

W = 2


def chosen_steps(lengths: np.ndarray, cost: CostModel, budget: int, cap: int, k: int, seed: int):
    """[(sizes (W,), longest (W,))] of ``k`` steps of the plan, stratified by predicted time."""
    steps = steps_of(make_plan(lengths, budget, cap, W, planner="bucketed", cost=cost, seed=seed))
    sizes = np.array([[b.size for b in st] for st in steps], dtype=np.int64)
    longest = np.array([[int(lengths[b].max()) for b in st] for st in steps], dtype=np.int64)
    order = np.argsort(cost.batch_cost(sizes, longest).max(axis=1), kind="stable")
    rng = np.random.default_rng(seed)
    picks = [int(rng.choice(g)) for g in np.array_split(order, k)]
    return [(sizes[s], longest[s]) for s in picks]


def worker(rank: int, port: int, shapes, repeats: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W)
    ddp = make_step(seed=0, wrap=lambda m: torch.nn.parallel.DistributedDataParallel(m))
    real = []
    for sizes, longest in shapes:
        b, L = int(sizes[rank]), int(longest[rank])
        ddp(b, L)  # warm this shape's allocations on both ranks
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            ddp(b, L)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        real.append(float(np.median(times)))
    dist.barrier()
    if rank == 0:  # the simulation: each rank's batch alone, in this process, the other rank waiting
        alone = make_step(seed=0)
        sim = []
        for sizes, longest in shapes:
            per = []
            for r in range(W):
                b, L = int(sizes[r]), int(longest[r])
                alone(b, L)
                ts = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    alone(b, L)
                    ts.append(time.perf_counter() - t0)
                per.append(float(np.median(ts)))
            sim.append(max(per))
        out.put((real, sim))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="ps", help="ps id libri vb heavy")
    ap.add_argument("--budget", type=int, default=8000)
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cost", type=float, nargs=3, default=(0.02225, 3.27e-05, 9.355e-09), metavar=("C0", "C1", "C2"),
                    help="the step model to plan with (default: the fit of bench/model.py in the README)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cost = CostModel.step(*args.cost)
    shapes = chosen_steps(corpus(args.corpus), cost, args.budget, args.cap, args.steps, args.seed)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(worker, args=(port, shapes, args.repeats, out), nprocs=W, join=True, start_method="spawn")
    real, sim = (np.array(x) for x in out.get())
    print(f"## {args.corpus}, W = {W}, bucketed with {cost}, {args.steps} steps stratified, medians of "
          f"{args.repeats}\n")
    print("| step | batches (B x L) | real (gloo, DDP) | simulated (slowest batch alone) | sim / real |")
    print("|---:|---|---:|---:|---:|")
    for i, ((sizes, longest), r, s) in enumerate(zip(shapes, real, sim)):
        shape = ", ".join(f"{b}x{L}" for b, L in zip(sizes.tolist(), longest.tolist()))
        print(f"| {i} | {shape} | {r:.3f} s | {s:.3f} s | {s / r:.2f} |")
    err = np.abs(sim - real) / real * 100
    print(f"\nsum: real {real.sum():.2f} s, simulated {sim.sum():.2f} s (simulated/real {sim.sum() / real.sum():.2f}); "
          f"per step |error| median {np.median(err):.1f} %, p90 {np.percentile(err, 90):.1f} %; "
          f"mean real - simulated per step {np.mean(real - sim) * 1000:.1f} ms (all-reduce, barriers, two processes)")


if __name__ == "__main__":
    main()
