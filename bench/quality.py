"""Plan quality side by side: bucketed vs the seed-exact greedy planner vs
lhotse's DynamicBucketingSampler vs fixed-size shuffled batches.

    .venv/bin/python bench/quality.py            # about a minute; lhotse rows if lhotse is installed

Setup (the issue's): four audio-like length distributions from
``bench/distributions.py`` (log-normal 0.5-30 s, read speech massed at
12-16 s, bimodal prompts + utterances, heavy-tailed up to 60 s), 50 frames/s,
N = 20,000, budget 16,000 frames (padded: batch size x longest), at most 64
samples per batch, W = 8 and W = 64 ranks; then W = 64 again at N = 200,000.

Why the second set: at W = 64 an epoch of 20,000 such utterances is only
6-15 steps, so a single step must cover a sixth to a fifteenth of the whole
length range (the heavy-tailed set's top step spans 6-60 s). Within a step
the batches must then either differ in length (costs differ: imbalance),
mix lengths (padding), or hold fewer samples than the budget allows; no
planner escapes that, they only choose where the loss goes.

Metrics, computed the same way for every planner from its global steps:

- padding: real tokens / padded tokens (batch size x longest), summed over
  all batches.
- balance: per step, sum of the W batch costs / (W x the largest), averaged
  over steps; cost B * L**2 (the seed's).
- budget use: padded tokens / budget, averaged over the batches the size cap
  does not bind (64 x longest > budget).
- repeated: share of epoch-1 batches that are, as sets, an epoch-0 batch.
- mates kept: share of a sample's epoch-1 batch-mates that were already its
  batch-mates in epoch 0 (averaged over samples).
- time: one epoch's planning, warm (the fastest of the 3 epochs; lhotse: a
  pass of the sampler over in-memory cuts).

Each figure is the mean over epochs 0, 1 and 2 (seed 0): with few steps per
epoch a single epoch can land either side of a close call.

How the others become global steps:

- greedy: ``make_plan(..., planner="greedy")`` (seed-exact).
- lhotse: cuts built from the lengths (duration = frames / 50, no audio),
  ``DynamicBucketingSampler(max_duration=16000/50 s, max_cuts=64,
  num_buckets=30, shuffle=True, world_size=W)``. Its DDP mode draws W
  consecutive batches from one bucket and gives batch i to rank i mod W, so
  we read that global batch stream (``_next_batch``) and cut it into steps of
  W; the final partial step is redistributed over the W ranks as lhotse does
  (combine and split evenly).
- fixed: a seeded permutation cut into batches of B = budget // longest
  sample (the largest fixed size that never exceeds the budget), steps of W
  round-robin, the final partial step redistributed like lhotse's.

Extra tables (log-normal, W = 8): the ``bucket_width`` knob, and the cost
models with and without ``max_step_cost`` (step cost = the largest batch
cost of a step, since a synchronous step waits for it; spread = longest step
/ median step).
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from streambatch.core.cost import CostModel  # noqa: E402
from streambatch.planners import make_plan  # noqa: E402

from distributions import DISTRIBUTIONS, FRAME_RATE, make_lengths  # noqa: E402

N = 20_000
N_LARGE = 200_000  # enough steps at W = 64 for the targets to be reachable
BUDGET = 16_000
CAP = 64
WORLDS = (8, 64)
SEED = 0
EPOCHS = 3  # every figure is a mean over epochs 0-2 (randomness: over epochs 0->1, 1->2)


def steps_of(plan) -> list[list[np.ndarray]]:
    """A Plan as [step][rank] -> sample indices, in training order."""
    return [[plan.batch(s, r) for r in range(plan.world_size)] for s in range(plan.num_steps)]


def steps_from_stream(batches: list[np.ndarray], w: int) -> list[list[np.ndarray]]:
    """Batch i on rank i mod W; the final partial step is combined and split
    evenly over the ranks (lhotse's rule)."""
    full = len(batches) // w * w
    steps = [batches[i : i + w] for i in range(0, full, w)]
    if full < len(batches):
        rest = np.concatenate(batches[full:])
        if rest.size < w:  # too few to go round: repeat some, as lhotse does
            rest = np.resize(rest, w)
        steps.append(np.array_split(rest, w))
    return steps


def metrics(lengths: np.ndarray, steps: list[list[np.ndarray]], cost: CostModel | None = None) -> dict:
    cost = cost or CostModel.quadratic()
    w = len(steps[0])
    sizes = np.array([[b.size for b in st] for st in steps], dtype=np.int64)
    longest = np.array([[lengths[b].max() for b in st] for st in steps], dtype=np.int64)
    real = sum(int(lengths[b].sum()) for st in steps for b in st)
    padded = sizes * longest
    c = cost.batch_cost(sizes, longest)
    step_cost = c.max(axis=1)
    open_batches = CAP * longest > BUDGET
    return {
        "padding": real / padded.sum(),
        "balance": float(np.mean(c.sum(axis=1) / (w * step_cost))),
        "budget": float((padded[open_batches] / BUDGET).mean()) if open_batches.any() else float("nan"),
        "steps": len(steps),
        "spread": float(step_cost.max() / np.median(step_cost)),
        "median_step_cost": float(np.median(step_cost)),
    }


def randomness(n: int, epoch0: list[list[np.ndarray]], epoch1: list[list[np.ndarray]]) -> dict:
    b0 = [np.sort(b) for st in epoch0 for b in st]
    b1 = [np.sort(b) for st in epoch1 for b in st]
    seen = {b.tobytes() for b in b0}
    repeated = sum(b.tobytes() in seen for b in b1) / len(b1)
    # batch id of every sample in epoch 0 (padding repeats keep their first batch)
    home = np.full(n, -1, dtype=np.int64)
    for i, b in enumerate(b0):
        fresh = b[home[b] < 0]
        home[fresh] = i
    kept = []
    for b in b1:
        if b.size > 1:
            same = (home[b][:, None] == home[b][None, :]).sum(axis=1) - 1
            kept.append(same / (b.size - 1))
    return {"repeated": repeated, "mates": float(np.concatenate(kept).mean()) if kept else 0.0}


def over_epochs(lengths: np.ndarray, plan_epoch, cost: CostModel | None = None) -> dict:
    """Metrics averaged over EPOCHS epochs (randomness over consecutive pairs);
    time: the fastest epoch. plan_epoch(e) -> [step][rank] sample arrays."""
    steps, times = [], []
    for e in range(EPOCHS):
        t = time.perf_counter()
        steps.append(plan_epoch(e))
        times.append(time.perf_counter() - t)
    runs = [metrics(lengths, s, cost) for s in steps]
    pairs = [randomness(lengths.size, a, b) for a, b in zip(steps, steps[1:])]
    out = {k: float(np.mean([r[k] for r in runs + pairs if k in r])) for k in {**runs[0], **pairs[0]}}
    out["steps"] = int(round(out["steps"]))
    out["time"] = min(times)
    return out


def run_planner(lengths: np.ndarray, w: int, planner: str, **options) -> dict:
    make_plan(lengths, BUDGET, CAP, w, planner=planner, **options)  # warm: no compile or cache load in the timing
    return over_epochs(lengths, lambda e: steps_of(make_plan(lengths, BUDGET, CAP, w, seed=SEED, epoch=e,
                                                             planner=planner, **options)), options.get("cost"))


def run_fixed(lengths: np.ndarray, w: int) -> dict:
    size = max(1, min(CAP, BUDGET // int(lengths.max())))

    def plan(epoch):
        perm = np.random.default_rng([SEED, epoch]).permutation(lengths.size)
        return steps_from_stream(np.array_split(perm, -(-perm.size // size)), w)

    return over_epochs(lengths, plan)


def lhotse_planner(lengths: np.ndarray, w: int, budget: int = BUDGET, cap: int = CAP, seed: int = SEED):
    """``plan(epoch) -> [step][rank] sample arrays`` from lhotse's
    DynamicBucketingSampler over cuts of ``lengths`` (frames at FRAME_RATE);
    None when lhotse is not installed."""
    try:
        from lhotse import CutSet, MonoCut
        from lhotse.dataset import DynamicBucketingSampler
    except ImportError:
        return None
    warnings.filterwarnings("ignore", module="lhotse")
    cuts = CutSet.from_cuts(MonoCut(id=str(i), start=0.0, duration=float(x) / FRAME_RATE, channel=0)
                            for i, x in enumerate(lengths))

    def plan(epoch):
        sampler = DynamicBucketingSampler(cuts, max_duration=budget / FRAME_RATE, max_cuts=cap, num_buckets=30,
                                          shuffle=True, seed=seed, world_size=w, rank=0)
        sampler.set_epoch(epoch)
        iter(sampler)
        batches = []
        while True:
            try:
                batches.append(np.array([int(c.id) for c in sampler._next_batch()], dtype=np.int64))
            except StopIteration:
                return steps_from_stream(batches, w)

    return plan


def run_lhotse(lengths: np.ndarray, w: int) -> dict | None:
    plan = lhotse_planner(lengths, w)
    return None if plan is None else over_epochs(lengths, plan)


COLUMNS = (("padding", "{:.3f}"), ("balance", "{:.3f}"), ("budget", "{:.3f}"), ("steps", "{:d}"),
           ("repeated", "{:.1%}"), ("mates", "{:.1%}"), ("time", "{:.3f} s"))
HEADER = ("padding", "balance B·L²", "budget use", "steps", "repeated batches", "mates kept", "plan time")


def table(rows: list[tuple[str, dict]], first: str = "planner") -> str:
    out = ["| " + " | ".join((first,) + HEADER) + " |", "|" + "---|" * (len(HEADER) + 1)]
    for name, r in rows:
        out.append("| " + " | ".join([name] + [fmt.format(r[k]) for k, fmt in COLUMNS]) + " |")
    return "\n".join(out)


def compare(n: int, worlds: tuple[int, ...]) -> None:
    """One table per distribution: every planner at every W on the same lengths."""
    for name in DISTRIBUTIONS:
        lengths = make_lengths(name, n, SEED)
        rows = []
        for planner in ("bucketed", "greedy"):
            for w in worlds:
                rows.append((f"{planner} W={w}", run_planner(lengths, w, planner)))
        for w in worlds:
            r = run_lhotse(lengths, w)
            if r is not None:
                rows.append((f"lhotse W={w}", r))
        for w in worlds:
            rows.append((f"fixed W={w}", run_fixed(lengths, w)))
        secs = lengths / FRAME_RATE
        print(f"### {name}, N = {n:,}: {secs.min():.1f}-{secs.max():.1f} s, median {np.median(secs):.1f} s\n")
        print(table(rows) + "\n")


def main() -> None:
    print(f"Budget {BUDGET:,} frames, at most {CAP} per batch, {FRAME_RATE} frames/s, seed {SEED}\n")
    compare(N, WORLDS)
    print(f"W = 64 leaves only 6-15 steps per epoch at N = {N:,}; with {N_LARGE:,} samples:\n")
    compare(N_LARGE, (64,))

    lengths = make_lengths("lognormal", N, SEED)
    print("### bucket_width (bucketed, log-normal, W = 8)\n")
    rows = [(f"{width:g}" + (" (default)" if width == 0.02 else ""),
             run_planner(lengths, 8, "bucketed", bucket_width=width)) for width in (0.005, 0.01, 0.02, 0.05, 0.1)]
    print(table(rows, "bucket_width") + "\n")

    print("### Cost models and max_step_cost (bucketed, log-normal, W = 8)\n")
    print("| cost | max_step_cost | padding | balance (own cost) | budget use | steps | step-cost spread |")
    print("|---|---|---|---|---|---|---|")
    for cost in (CostModel.quadratic(), CostModel.quadratic_duration(30 * FRAME_RATE), CostModel.linear()):
        free = run_planner(lengths, 8, "bucketed", cost=cost)
        for cap_cost in (None, round(free["median_step_cost"], -2)):
            r = free if cap_cost is None else run_planner(lengths, 8, "bucketed", cost=cost, max_step_cost=cap_cost)
            label = "none" if cap_cost is None else f"{cap_cost:.3g} (median)"
            print(f"| {cost} | {label} | {r['padding']:.3f} | {r['balance']:.3f} | {r['budget']:.3f} | "
                  f"{r['steps']} | {r['spread']:.2f} |")


if __name__ == "__main__":
    main()
