"""Measured epoch time of a real model's training steps, side by side for
batches from: bucketed with the fitted step cost (map-style, and streaming's
shard read mode), bucketed with B·L², greedy (the seed's algorithm), lhotse's
DynamicBucketingSampler and a fixed batch size.

    .venv/bin/python bench/train_time.py                 # CV ps + heavy-tailed, W = 8 and 64 (~40 min, 2 quiet cores)
    .venv/bin/python bench/train_time.py --quick         # fewer timed steps (~5 min)
    .venv/bin/python bench/train_time.py --cells vb:16:2 ps:8:0.5 id:64:2 --quick   # default plans, before/after
    .venv/bin/python bench/train_time.py --cells ... --save-shapes bench/cells.npz   # plan here, time elsewhere:
    python bench/train_time.py --cells ... --shapes bench/cells.npz --device cuda      # ... on a GPU

``--cells CORPUS:W:BUDGET`` (budget in x the corpus's longest clip; corpora ps id libri vb heavy) times the
default plan (bucketed, no cost argument) of the code before a change (``--baseline``, a checkout, planned in a
fresh process) against this checkout's, interleaved, each timed step's batches run for real on ``--device``
(``cuda``: the model on the GPU, each step synchronised, wall time).

How (single process, CPU, one torch thread; times are that thread's CPU seconds, ``time.process_time``, which
a busy shared machine inflates far less than wall time):

1. The model is ``bench/model.py`` (conv subsampling, 4-layer transformer
   encoder, CTC loss, AdamW; 1.1M parameters). Its step cost is fitted once
   with ``CostModel.fit`` over the designed shapes of the budget.
2. Each planner plans one epoch at W ranks: global steps of W batches
   (lhotse's batch stream is cut into steps of W as ``bench/quality.py`` does).
3. A step's time on W synchronous ranks is the slowest rank's batch: every
   timed batch is a whole step of the model (forward, backward, optimizer)
   on that padded shape, and the step's time is the largest of its ranks'.
   At W > 8 only the ``--top-ranks`` batches the fitted model predicts
   costliest are timed (the slowest is among them unless the model misranks
   batches within a step). The all-reduce of gradients is not there: one
   process stands for every rank, and the per-step term the fit measures
   (optimizer, launches) is inside every timed batch.
4. Steps are subsampled, stratified: a planner's steps are sorted by
   predicted time, cut into ``--strata`` groups of equal count, one step
   drawn (seeded) from each is timed, and the epoch estimate is the sum over
   groups of the group's predicted time times its timed step's measured /
   predicted ratio (a ratio estimator: the steps of a group differ in size,
   and the model's prediction carries that, so the estimate's spread is the
   model's error, not the spread of step sizes inside a group; with
   ``--plain`` the group's size times its timed step instead). Each timed
   batch is the median of ``--repeats`` runs: the slowest of W single
   timings is biased upwards by the machine's noise, and most for the
   best-balanced steps. Planners are timed interleaved (stratum by stratum),
   so the machine's drift is shared.

Reported per planner: steps, the estimated epoch time and samples/s, the
fitted model's predicted epoch time, and its error per timed step (median,
p90). lhotse rows need ``pip install lhotse``; corpora are read from
``../shared/data/real-lengths`` when present (a synthetic broadcast-news-like
set otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from model import make_step  # noqa: E402

from streambatch.cli.metrics import Batches, time_report  # noqa: E402
from streambatch.core.cost import CostModel  # noqa: E402
from streambatch.planners import make_plan  # noqa: E402

# The streaming, webdataset and lhotse imports of the planners compared by main() are made there: --cells
# --shapes runs with numpy, numba and torch alone (a GPU machine's image).

FPS = 50
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = next((d for d in (os.path.join(ROOT, "..", "shared", "data", "real-lengths"),
                         os.path.join(ROOT, "..", "..", "shared", "data", "real-lengths")) if os.path.isdir(d)),
            os.path.join(ROOT, "..", "shared", "data", "real-lengths"))


def heavy_tailed(n: int = 39_000, seed: int = 1) -> np.ndarray:
    """Broadcast-news-like: median 6 s, a long tail to 181 s, in frames."""
    rng = np.random.default_rng(seed)
    return np.ceil(np.clip(rng.lognormal(np.log(6), 0.9, n), 0.5, 181) * FPS).astype(np.int64)


def corpus(name: str) -> np.ndarray:
    if name == "heavy":
        return heavy_tailed()
    path = os.path.join(REAL, {"ps": "commonvoice-ps.npy", "id": "commonvoice-id.npy",
                               "libri": "librispeech-train-clean-100.npy", "vb": "voicebank-demand.npy"}[name])
    return np.ceil(np.load(path) * FPS).astype(np.int64)


def lhotse_steps(lengths: np.ndarray, w: int, budget: int, cap: int, seed: int):
    """lhotse's epoch 0 as [step][rank] sample arrays (``quality.lhotse_planner``), or None without lhotse."""
    from quality import lhotse_planner

    plan = lhotse_planner(lengths, w, budget, cap, seed)
    return None if plan is None else plan(0)


def fixed_steps(lengths: np.ndarray, w: int, budget: int, cap: int, seed: int):
    size = max(1, min(cap, budget // int(np.percentile(lengths, 95))))  # p95 fits; longer clips go alone
    perm = np.random.default_rng(seed).permutation(lengths.size)
    batches, cur, longest = [], [], 0
    for i in perm.tolist():  # fixed size, but never over the budget (a long clip closes the batch)
        m = max(longest, int(lengths[i]))
        if cur and (len(cur) == size or (len(cur) + 1) * m > budget):
            batches.append(np.array(cur))
            cur, m = [], int(lengths[i])
        cur.append(i)
        longest = m
    batches.append(np.array(cur))
    from quality import steps_from_stream

    return steps_from_stream(batches, w)


def shard_steps(lengths: np.ndarray, w: int, budget: int, cap: int, cost: CostModel, seed: int):
    """``StreamingBatches(read_mode="shard")``'s epoch 0 over ``lengths`` in shards of 500-2,000 samples
    (``bench/affinity.py``'s layout), planned window by window from the lengths as every rank does, as
    [step][rank] sample arrays."""
    from affinity import shard_counts
    from quality import steps_of

    from streambatch.epoch.read_modes import READ_MODES, iter_windows
    from streambatch.epoch.windows import WindowConfig

    counts = shard_counts(lengths.size)
    edges = np.concatenate([[0], np.cumsum(counts)])
    config = WindowConfig.build(budget, cap, w, True, False, seed, "bucketed", {"cost": cost},
                                window_samples=READ_MODES["shard"].default_window(w), read_mode="shard")
    steps = []
    for win in iter_windows(counts, lambda s: lengths[edges[s] : edges[s + 1]], config, 0):
        gid = edges[win.shard_ids] + win.local
        steps += [[gid[b] for b in st] for st in steps_of(win.plan)]
    return steps


def shapes(lengths: np.ndarray, steps) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.array([[b.size for b in st] for st in steps], dtype=np.int64)
    longest = np.array([[int(lengths[b].max()) if b.size else 0 for b in st] for st in steps], dtype=np.int64)
    return sizes, longest


# ------------------------------------------------------------------------------ before / after cells (issue 30)

CELL_CHILD = r"""
import json, sys
import numpy as np
import streambatch
from streambatch import make_plan
lengths = np.load(sys.argv[1]); w, budget, cap = (int(x) for x in sys.argv[2:5])
p = make_plan(lengths, budget, cap, w, planner="bucketed", seed=0)
steps = [[p.batch(s, r) for r in range(w)] for s in range(p.num_steps)]
sizes = [[int(b.size) for b in st] for st in steps]
longest = [[int(lengths[b].max()) for b in st] for st in steps]
print(json.dumps({"where": streambatch.__file__, "sizes": sizes, "longest": longest}))
"""


def cell_shapes(tree: str, lengths: np.ndarray, w: int, budget: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, W) int64 batch sizes and longest lengths of the default bucketed plan (B*L^2, no cost argument)
    planned by the streambatch of ``tree``, in a fresh process (PYTHONPATH = the tree)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lengths.npy")
        np.save(path, lengths)
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        out = subprocess.run([sys.executable, "-c", CELL_CHILD, path, str(w), str(budget), str(cap)], env=env,
                             cwd=tmp, capture_output=True, text=True, check=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    if not res["where"].startswith(os.path.abspath(tree)):
        raise RuntimeError(f"planned by {res['where']}, not {tree}")
    return np.array(res["sizes"], dtype=np.int64), np.array(res["longest"], dtype=np.int64)


def run_cells(args: argparse.Namespace) -> None:
    """``--cells``: the default plan (bucketed, no cost argument) before (``--baseline``, a checkout of the
    code before the change) and after (this checkout), each step of a stratified sample timed for real on
    ``--device``; every cell's steps timed interleaved, so the machine's drift is shared."""
    import torch

    saved = dict(np.load(args.shapes)) if args.shapes else None
    shapes_out: dict[str, np.ndarray] = {}
    if args.save_shapes:  # plan only: the batch shapes of every cell, before and after, for a later timing run
        for spec in args.cells:
            key, w, factor = spec.split(":")
            lengths = corpus(key)
            budget = int(round(float(factor) * int(lengths.max())))
            shapes_out[f"{spec}/meta"] = np.array([lengths.size, budget], dtype=np.int64)  # samples, budget
            for label, tree in (("before", args.baseline), ("after", ROOT)):
                sizes, longest = cell_shapes(tree, lengths, int(w), budget, args.cap)
                shapes_out[f"{spec}/{label}/sizes"], shapes_out[f"{spec}/{label}/longest"] = sizes, longest
                print(f"{spec} {label}: {sizes.shape[0]:,} steps")
        os.makedirs(os.path.dirname(os.path.abspath(args.save_shapes)), exist_ok=True)
        np.savez(args.save_shapes, **shapes_out)
        return
    cuda = args.device.startswith("cuda")
    step = make_step(seed=args.seed, threads=None if cuda else 1, device=args.device)
    clock = time.perf_counter if cuda else time.process_time  # a GPU's time is wall time (each step synced)
    t0 = time.perf_counter()
    # the fitted model only picks which ranks to time and carries the ratio estimator (see the module docstring)
    cost = CostModel.fit(step, max_batch_tokens=4000, max_length=4000, max_batch_size=args.cap, repeats=3,
                         max_seconds=60, clock=clock)
    name = torch.cuda.get_device_name() if cuda else "CPU, one torch thread"
    print(f"## Default plans before and after, timed on {args.device} ({name})\n")
    print(f"Fitted step: {cost} ({cost.fit_report['shapes_timed']} shapes in {time.perf_counter() - t0:.0f} s; "
          f"median |error| {cost.fit_report['median_abs_error_pct']:.1f} %). {args.strata} steps timed per plan, "
          f"median of {args.repeats} runs per batch, the {args.top_ranks} costliest batches of a step at W > 8.\n")
    print("| corpus | W | budget | plan | steps | measured epoch | samples/s | after / before |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    rng = np.random.default_rng(args.seed)
    for spec in args.cells:
        key, w, factor = spec.split(":")
        w = int(w)
        if saved is not None:  # the lengths stay behind: only their count and the budget travel
            n, budget = (int(x) for x in saved[f"{spec}/meta"])
        else:
            lengths = corpus(key)
            n, budget = lengths.size, int(round(float(factor) * int(lengths.max())))
        info = {}
        for label, tree in (("before", args.baseline), ("after", ROOT)):
            if saved is not None:  # planned earlier (--save-shapes), e.g. on a machine with the baseline tree
                sizes, longest = saved[f"{spec}/{label}/sizes"], saved[f"{spec}/{label}/longest"]
            else:
                sizes, longest = cell_shapes(tree, lengths, w, budget, args.cap)
                shapes_out[f"{spec}/{label}/sizes"], shapes_out[f"{spec}/{label}/longest"] = sizes, longest
            pred = cost.batch_cost(sizes, longest) + cost.c0
            order = np.argsort(pred.max(axis=1), kind="stable")
            info[label] = dict(sizes=sizes, longest=longest, pred=pred,
                               groups=np.array_split(order, min(args.strata, len(order))), measured=[])
        for g in range(args.strata):  # interleaved: stratum g of both plans, then g + 1
            for d in info.values():
                if g >= len(d["groups"]):
                    continue
                s = int(rng.choice(d["groups"][g]))
                ranks = np.argsort(-d["pred"][s])[: (w if w <= 8 else args.top_ranks)]
                times = []
                for r in ranks.tolist():
                    runs = []
                    for _ in range(args.repeats):
                        t = clock()
                        step(int(d["sizes"][s, r]), int(d["longest"][s, r]))
                        runs.append(clock() - t)
                    times.append(float(np.median(runs)))
                group = d["groups"][g]
                d["measured"].append(float(d["pred"][group].max(axis=1).sum()) * max(times) /
                                     float(d["pred"][s].max()))
        est = {k: sum(d["measured"]) for k, d in info.items()}
        for label, d in info.items():
            ratio = f"{est['after'] / est['before']:.2f}x" if label == "after" else ""
            print(f"| {key} | {w} | {budget:,} ({factor}x) | {label} | {d['sizes'].shape[0]:,} | {est[label]:.1f} s | "
                  f"{n / est[label]:,.0f} | {ratio} |")
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", nargs="+", default=["ps", "heavy"], help="ps id libri vb heavy")
    ap.add_argument("--worlds", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--budget", type=int, default=8000, help="frames per batch (padded), at 50 frames/s")
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--strata", type=int, default=16, help="timed steps per planner")
    ap.add_argument("--top-ranks", type=int, default=4, help="batches timed per step at W > 8")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per batch (median)")
    ap.add_argument("--plain", action="store_true", help="plain stratified estimate (group size x timed step)")
    ap.add_argument("--quick", action="store_true", help="8 strata, 3 top ranks, 1 run per batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cells", nargs="+", metavar="CORPUS:W:BUDGET",
                    help="time the default plan before and after instead: e.g. vb:16:2 (budget in x longest clip)")
    ap.add_argument("--baseline", default=next((d for d in (os.path.join(ROOT, "..", "baseline"),
                                                            os.path.join(ROOT, "..", "..", "baseline"))
                                                 if os.path.isdir(d)), os.path.join(ROOT, "..", "baseline")),
                    help="with --cells: the checkout before the change (default ../baseline)")
    ap.add_argument("--device", default="cpu", help="with --cells: cpu or cuda (a GPU: each step synced, wall time)")
    ap.add_argument("--save-shapes", metavar="FILE.npz", help="with --cells: only plan, and save every plan's batch "
                    "shapes (for a timing run on a machine without the baseline checkout)")
    ap.add_argument("--shapes", metavar="FILE.npz", help="with --cells: time the shapes --save-shapes saved")
    args = ap.parse_args()
    if args.quick:
        args.strata, args.top_ranks, args.repeats = 8, 3, 1
    if args.cells:
        run_cells(args)
        return
    from quality import steps_of

    step = make_step(seed=args.seed)
    t0 = time.perf_counter()
    # CPU seconds of the one torch thread (time.process_time): on a shared machine wall time follows the load
    cost = CostModel.fit(step, max_batch_tokens=args.budget, max_length=args.budget, max_batch_size=args.cap,
                         repeats=3, max_seconds=120, clock=time.process_time)
    fit = cost.fit_report
    print(f"## Fitted step cost: {cost}  ({fit['shapes_timed']} shapes in {time.perf_counter() - t0:.0f} s; "
          f"median |error| {fit['median_abs_error_pct']:.1f} %, p90 {fit['p90_abs_error_pct']:.1f} %)\n")
    rng = np.random.default_rng(args.seed)
    for name in args.corpora:
        lengths = corpus(name)
        for w in args.worlds:
            reps = 1
            while True:  # repeat the corpus until an epoch has >= 100 steps (as the issue asks)
                lens = np.tile(lengths, reps)
                probe = make_plan(lens, args.budget, args.cap, w, planner="bucketed", cost=cost, seed=args.seed)
                if probe.num_steps >= 100 or reps >= 64:
                    break
                reps *= 2
            plans = {
                "bucketed, fitted cost": steps_of(probe),
                "bucketed, B·L²": steps_of(make_plan(lens, args.budget, args.cap, w, planner="bucketed",
                                                    seed=args.seed)),
                "greedy (seed)": steps_of(make_plan(lens, args.budget, args.cap, w, seed=args.seed)),
                "bucketed, fitted cost, shard mode": shard_steps(lens, w, args.budget, args.cap, cost, args.seed),
                "fixed size": fixed_steps(lens, w, args.budget, args.cap, args.seed),
            }
            lh = lhotse_steps(lens, w, args.budget, args.cap, args.seed)
            if lh is not None:
                plans["lhotse DynamicBucketing"] = lh
            info = {}
            for k, st in plans.items():
                sizes, longest = shapes(lens, st)
                pred = cost.batch_cost(sizes, longest) + cost.c0
                order = np.argsort(pred.max(axis=1), kind="stable")
                groups = np.array_split(order, min(args.strata, len(order)))
                info[k] = dict(sizes=sizes, longest=longest, pred=pred, groups=groups, measured=[], predicted=[])
            for g in range(args.strata):  # interleaved: stratum g of every planner, then g + 1
                for d in info.values():
                    if g >= len(d["groups"]):
                        continue
                    s = int(rng.choice(d["groups"][g]))
                    ranks = np.argsort(-d["pred"][s])[: (w if w <= 8 else args.top_ranks)]
                    times = []
                    for r in ranks.tolist():
                        b, L = int(d["sizes"][s, r]), int(d["longest"][s, r])
                        runs = []
                        for _ in range(args.repeats):
                            t = time.process_time()
                            step(b, L)
                            runs.append(time.process_time() - t)
                        # the median of repeats: the slowest of W single noisy timings would be biased
                        # upwards by the noise, most for the best-balanced steps (W equal batches)
                        times.append(float(np.median(runs)))
                    group = d["groups"][g]
                    d["measured"].append((len(group), max(times), float(d["pred"][group].max(axis=1).sum()),
                                          float(d["pred"][s].max())))
                    d["predicted"].append(float(d["pred"][s].max()))
            fit = info["bucketed, fitted cost"]
            bound = time_report(Batches(fit["sizes"], fit["longest"], np.zeros_like(fit["sizes"])), lens, cost,
                                args.budget)["bound_seconds"]
            print(f"## {name}, N = {lens.size:,} ({reps}x the corpus), W = {w}, budget {args.budget:,} frames, "
                  f"cap {args.cap}; {args.strata} steps timed per planner, median of {args.repeats} runs per "
                  f"batch\n")
            print(f"Predicted epoch of any plan >= {bound:.1f} s (the fitted model's bound: every sample's own "
                  f"cost spread evenly over W ranks, plus c0 x the fewest steps the budget allows).\n")
            print("| planner | steps | measured epoch | samples/s | predicted epoch | step error median / p90 "
                  "| vs lhotse | vs greedy |")
            print("|---|---|---|---|---|---|---|---|")
            if args.plain:
                est = {k: sum(n * t for n, t, _, _ in d["measured"]) for k, d in info.items()}
            else:
                est = {k: sum(gp * t / p for _, t, gp, p in d["measured"]) for k, d in info.items()}
            for k, d in info.items():
                m = np.array([t for _, t, _, _ in d["measured"]])
                err = np.abs(np.array(d["predicted"]) - m) / m * 100
                vs_l = f"{est[k] / est['lhotse DynamicBucketing']:.2f}x" if "lhotse DynamicBucketing" in est else "-"
                print(f"| {k} | {d['sizes'].shape[0]:,} | {est[k]:.1f} s | {lens.size / est[k]:,.0f} | "
                      f"{cost.epoch_time(d['pred'] - cost.c0):.1f} s | {np.median(err):.1f} % / "
                      f"{np.percentile(err, 90):.1f} % | {vs_l} | {est[k] / est['greedy (seed)']:.2f}x |")
            pred = {k: cost.epoch_time(d["pred"] - cost.c0) for k, d in info.items()}
            limits = ", ".join(f"{bound / pred[k]:.2f}x {k}'s" for k in ("greedy (seed)", "lhotse DynamicBucketing")
                               if k in pred)
            print(f"\nPredicted: bucketed with the fitted cost {pred['bucketed, fitted cost'] / bound:.2f}x the bound; "
                  f"no plan can predict below {limits}.\n")


if __name__ == "__main__":
    main()
