"""Packed (padding-free) batches against padded bucketed batches and lhotse's
DynamicBucketingSampler: plan quality, then the measured training throughput
of a real model.

    .venv/bin/python bench/packing.py                # both parts (~15 min on 2 busy cores)
    .venv/bin/python bench/packing.py --plan-only    # part 1 only (~1 min)
    .venv/bin/python bench/packing.py --check        # the packed model step computes the per-sample one

Part 1, plan quality: the four real corpora of ``../shared/data/real-lengths``
(when present) and the four distributions of ``bench/distributions.py``
(N = 20,000), 50 frames/s, budget 16,000 frames, cap 64, W = 8 and 64, mean of
epochs 0-2 (``bench/quality.py``'s setup). Per planner:

- padding: real tokens / tokens the model processes (padded: batch size x
  longest; packed: the sum of lengths, so 1 by construction; repeats of the
  final step's padding count as real, as in quality.py);
- budget use: tokens processed / budget, over the batches the size cap does
  not bind (padded: 64 x longest > budget; packed: fewer than 64 samples),
  but the epoch's smallest step (its tail: "-" when no other batch is left);
- balance: per step, sum of the W batch costs / (W x the largest), averaged
  over steps, each batch costed as the model runs it (B·L², the seed's
  attention proxy): padded B x longest², packed sum(L²) (varlen attention);
  "tw balance" weights steps by their time;
- epoch: sum over steps of the costliest batch (1e9 frames²): the planned
  epoch time under that cost; "speed-up": the padded bucketed epoch / this one;
- mates kept: share of a sample's epoch-1 batch-mates that were its batch-mates
  in epoch 0 (quality.py's randomness figure).

Part 2, measured throughput: ``bench/model.py``'s encoder (conv subsampling,
4-layer transformer, CTC, AdamW; 1.1M parameters) on one CPU thread; padded
batches run ``model.make_step`` (B x longest frames, no mask: the cheapest a
padded step can be), packed ones ``packed_model.make_packed_step`` (the same
layers on the concatenated samples, attention per sample; ``--check`` shows
it equals each sample's own forward). The step cost is fitted once
(``CostModel.fit``) and both streambatch planners balance under it; ranks are
simulated as in ``bench/train_time.py``: a step takes its slowest rank's
batch, every batch a whole training step timed in CPU seconds of the torch
thread, steps subsampled in ``--strata`` strata of predicted time (W > 8: the
``--top-ranks`` batches predicted costliest per step), planners interleaved
stratum by stratum. Corpora: Common Voice Pashto and a heavy-tailed
broadcast-news-like set, repeated until an epoch has >= 100 steps, budget
8,000 frames, cap 64 (train_time.py's setup). Reported: steps, measured epoch,
samples/s and tokens/s (real frames), and the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from quality import lhotse_planner, randomness, steps_of  # noqa: E402

from streambatch.core.cost import CostModel  # noqa: E402
from streambatch.planners import make_plan  # noqa: E402

from distributions import DISTRIBUTIONS, FRAME_RATE, make_lengths  # noqa: E402

# beside the repository (``../shared``), or one level further up from a git worktree (``wt/NAME``)
REAL = next((d for d in (os.path.join(os.path.dirname(os.path.abspath(__file__)), *up, "shared", "data", "real-lengths")
                         for up in (("..", ".."), ("..", "..", ".."))) if os.path.isdir(d)),
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "real-lengths"))
REAL_FILES = ("librispeech-train-clean-100", "commonvoice-id", "commonvoice-ps", "voicebank-demand")
N, BUDGET, CAP, SEED, EPOCHS = 20_000, 16_000, 64, 0, 3


def corpora() -> list[tuple[str, np.ndarray]]:
    out = []
    for name in REAL_FILES:
        path = os.path.join(REAL, name + ".npy")
        if os.path.exists(path):
            out.append((name, np.ceil(np.load(path) * FRAME_RATE).astype(np.int64)))
    return out + [(f"{d} 20k", make_lengths(d, N, SEED)) for d in DISTRIBUTIONS]


def batch_stats(lengths: np.ndarray, steps: list[list[np.ndarray]], packed: bool, budget: int, cap: int,
                cost: CostModel) -> dict:
    """Part 1's figures of one epoch's steps ([step][rank] sample arrays)."""
    w = len(steps[0])
    sizes = np.array([[b.size for b in st] for st in steps], dtype=np.int64)
    real = np.array([[int(lengths[b].sum()) for b in st] for st in steps], dtype=np.int64)
    longest = np.array([[int(lengths[b].max()) if b.size else 0 for b in st] for st in steps], dtype=np.int64)
    if packed:
        processed = real
        c = np.array([[float(cost.packed_cost(lengths[b])[0]) for b in st] for st in steps])
        open_ = sizes < cap
    else:
        processed = sizes * longest
        c = cost.batch_cost(sizes, longest)
        open_ = cap * longest > budget
    open_[np.argmin(real.sum(axis=1))] = False  # not the epoch's runt step (its tail), which no planner fills
    top = c.max(axis=1)
    return {
        "steps": len(steps),
        "padding": real.sum() / processed.sum(),
        "budget": float((processed[open_] / budget).mean()) if open_.any() else float("nan"),
        "balance": float(np.mean(c.sum(axis=1) / (w * top))),
        "tw": float(c.sum() / (w * top.sum())),
        "epoch": float(top.sum()) / 1e9,
    }


def plan_quality() -> None:
    cost = CostModel.quadratic()
    print(f"## Part 1: plan quality (budget {BUDGET:,} frames, cap {CAP}, {FRAME_RATE} frames/s, mean of epochs "
          f"0-{EPOCHS - 1}, seed {SEED})\n")
    print("| corpus | W | planner | steps | padding | budget use | balance | tw balance | epoch (1e9) | speed-up "
          "| mates kept |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    misses = []
    for name, lengths in corpora():
        for w in (8, 64):
            def ours(e: int, pack: bool, w: int = w, lengths: np.ndarray = lengths) -> list[list[np.ndarray]]:
                return steps_of(make_plan(lengths, BUDGET, CAP, w, seed=SEED, epoch=e, planner="bucketed", pack=pack))

            planners = {"packed": lambda e: ours(e, True), "bucketed (padded)": lambda e: ours(e, False)}
            lh = lhotse_planner(lengths, w, BUDGET, CAP, SEED)
            if lh is not None:
                planners["lhotse DynamicBucketing"] = lh
            rows = {}
            for label, plan in planners.items():
                epochs = [plan(e) for e in range(EPOCHS)]
                stats = [batch_stats(lengths, s, label == "packed", BUDGET, CAP, cost) for s in epochs]
                r = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
                r["mates"] = float(np.mean([randomness(lengths.size, a, b)["mates"]
                                            for a, b in zip(epochs, epochs[1:])]))
                rows[label] = r
            for label, r in rows.items():
                rel = rows["bucketed (padded)"]["epoch"] / r["epoch"]
                use = "-" if np.isnan(r["budget"]) else f"{r['budget']:.3f}"
                print(f"| {name} | {w} | {label} | {r['steps']:.0f} | {r['padding']:.3f} | {use} | "
                      f"{r['balance']:.3f} | {r['tw']:.3f} | {r['epoch']:.4g} | {rel:.2f}x | {r['mates']:.1%} |")
            p = rows["packed"]
            if w == 8 and (p["padding"] < 0.995 or p["balance"] < 0.98):
                misses.append(f"{name}: padding {p['padding']:.3f}, balance {p['balance']:.3f}")
    print(f"\nTargets at W = 8 (padding >= 0.995, balance >= 0.98): "
          f"{'met on every corpus' if not misses else 'missed on ' + '; '.join(misses)}\n")


# ------------------------------------------------------------ part 2: measured throughput


def heavy_tailed(n: int = 39_000, seed: int = 1) -> np.ndarray:
    """train_time.py's broadcast-news-like set: median 6 s, a long tail to 181 s, in frames."""
    rng = np.random.default_rng(seed)
    return np.ceil(np.clip(rng.lognormal(np.log(6), 0.9, n), 0.5, 181) * FRAME_RATE).astype(np.int64)


def measured_corpus(name: str) -> np.ndarray:
    if name == "heavy":
        return heavy_tailed()
    files = {"ps": "commonvoice-ps", "id": "commonvoice-id", "libri": "librispeech-train-clean-100",
             "vb": "voicebank-demand"}
    path = os.path.join(REAL, files[name] + ".npy")
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: measure on --corpora heavy, or run where the shared lengths are")
    return np.ceil(np.load(path) * FRAME_RATE).astype(np.int64)


def throughput(args: argparse.Namespace) -> None:
    from model import make_step
    from packed_model import make_packed_step

    step = make_step(seed=args.seed)
    packed_step = make_packed_step(seed=args.seed)
    t0 = time.perf_counter()
    cost = CostModel.fit(step, max_batch_tokens=args.budget, max_length=args.budget, max_batch_size=args.cap,
                         repeats=3, max_seconds=args.fit_seconds, clock=time.process_time)
    fit = cost.fit_report
    print(f"## Part 2: measured throughput\n\nFitted step cost: {cost} ({fit['shapes_timed']} shapes in "
          f"{time.perf_counter() - t0:.0f} s; median |error| {fit['median_abs_error_pct']:.1f} %, p90 "
          f"{fit['p90_abs_error_pct']:.1f} %)\n")
    rng = np.random.default_rng(args.seed)
    for name in args.corpora:
        lengths = measured_corpus(name)
        for w in args.worlds:
            reps = 1
            while True:  # repeat the corpus until an epoch has >= 100 steps
                lens = np.tile(lengths, reps)
                probe = make_plan(lens, args.budget, args.cap, w, planner="bucketed", cost=cost, seed=args.seed)
                if probe.num_steps >= 100 or reps >= 64:
                    break
                reps *= 2
            plans = {
                "packed (fitted cost)": (steps_of(make_plan(lens, args.budget, args.cap, w, planner="bucketed",
                                                            cost=cost, seed=args.seed, pack=True)), True),
                "bucketed, padded (fitted cost)": (steps_of(probe), False),
            }
            lh = lhotse_planner(lens, w, args.budget, args.cap, args.seed)
            if lh is not None:
                plans["lhotse DynamicBucketing"] = (lh(0), False)
            info = {}
            for k, (st, packed) in plans.items():
                if packed:
                    pred = np.array([[float(cost.packed_cost(lens[b])[0]) for b in s] for s in st]) + cost.c0
                else:
                    sizes = np.array([[b.size for b in s] for s in st])
                    longest = np.array([[int(lens[b].max()) for b in s] for s in st])
                    pred = cost.batch_cost(sizes, longest) + cost.c0
                order = np.argsort(pred.max(axis=1), kind="stable")
                info[k] = dict(steps=st, packed=packed, pred=pred,
                               groups=np.array_split(order, min(args.strata, len(order))), measured=[])
            for g in range(args.strata):  # interleaved: stratum g of every planner, then g + 1
                for d in info.values():
                    if g >= len(d["groups"]):
                        continue
                    s = int(rng.choice(d["groups"][g]))
                    ranks = np.argsort(-d["pred"][s])[: (w if w <= 8 else args.top_ranks)]
                    times = []
                    for r in ranks.tolist():
                        b = d["steps"][s][r]
                        t = time.process_time()
                        if d["packed"]:
                            packed_step([int(x) for x in lens[b]])
                        else:
                            step(int(b.size), int(lens[b].max()))
                        times.append(time.process_time() - t)
                    d["measured"].append((len(d["groups"][g]), max(times)))
            print(f"*{name}, N = {lens.size:,} ({reps}x the corpus), W = {w}, budget {args.budget:,} frames, cap "
                  f"{args.cap}; {args.strata} steps timed per planner*\n")
            print("| planner | steps | measured epoch | samples/s | tokens/s | predicted epoch | vs padded "
                  "| vs lhotse |")
            print("|---|---|---|---|---|---|---|---|")
            est = {k: sum(n * t for n, t in d["measured"]) for k, d in info.items()}
            base = est["bucketed, padded (fitted cost)"]
            for k, d in info.items():
                vs_l = f"{est['lhotse DynamicBucketing'] / est[k]:.2f}x" if "lhotse DynamicBucketing" in est else "-"
                print(f"| {k} | {len(d['steps']):,} | {est[k]:.1f} s | {lens.size / est[k]:,.0f} | "
                      f"{int(lens.sum()) / est[k]:,.0f} | {cost.epoch_time(d['pred'] - cost.c0):.1f} s | "
                      f"{base / est[k]:.2f}x | {vs_l} |")
            print()
    print("(ratios are throughput: > 1x is faster than the baseline it names)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-only", action="store_true", help="part 1 only")
    ap.add_argument("--measure-only", action="store_true", help="part 2 only")
    ap.add_argument("--check", action="store_true", help="check the packed model step and stop")
    ap.add_argument("--corpora", nargs="+", default=["ps", "heavy"], help="part 2: ps id libri vb heavy")
    ap.add_argument("--worlds", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--budget", type=int, default=8000, help="part 2: frames per batch, at 50 frames/s")
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--strata", type=int, default=8, help="part 2: timed steps per planner")
    ap.add_argument("--top-ranks", type=int, default=3, help="part 2: batches timed per step at W > 8")
    ap.add_argument("--fit-seconds", type=float, default=90, help="part 2: time budget of the cost fit")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.check:
        from packed_model import check

        check()
        return
    if not args.measure_only:
        plan_quality()
    if not args.plan_only:
        throughput(args)


if __name__ == "__main__":
    main()
