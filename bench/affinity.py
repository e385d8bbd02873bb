"""Shard-affine planning (``read_mode="shard"``) against global window
planning (``read_mode="sample"``): plan quality, bytes and requests per rank.

    .venv/bin/python bench/affinity.py                 # about a minute on 2 cores
    .venv/bin/python bench/affinity.py --quick         # one epoch, W = 8 and 64 only

Reads the shared real corpus lengths in ../shared/data/real-lengths/*.npy
(seconds; frames = ceil(s * 50)) when they are there (``--real-lengths DIR``),
besides the four synthetic distributions of bench/distributions.py. No tar
is written: windows are planned from lengths, as every rank does before
reading, and I/O is simulated from the plans.

Setup: budget 16,000 frames, at most 64 per batch, bucketed options for
both modes (sample mode: ``planner="bucketed"``). N = 400,000 samples per
corpus: the synthetic ones drawn at that size, the real ones (12k-59k
utterances each) resampled with replacement to it, so that W = 64 has
several windows. Shards hold 500-2,000 samples (uniform), each a random
sample of the corpus. The window is ``window_samples = PER_RANK * W``
(default 2,500 per rank: 20,000 at W = 8, 160,000 at W = 64: shard mode's
default window); shard mode also puts at least W shards in a window.

Metrics (mean over epochs 0 and 1, as bench/quality.py defines them):
padding = real / padded tokens; balance = per step, sum of the W batch
costs B*L^2 / (W x the largest); budget use = padded tokens / budget over
batches the size cap does not bind; steps (per rank, per epoch); exactly
once (every sample trained once, final padding aside) is checked, as is
each rank's batches holding only samples it streamed (final window aside).

I/O (shard mode, simulated): a sample's bytes = 640 per frame (16 kHz
16-bit PCM at 50 frames/s) + 1,024 of tar headers; bytes per rank = the
sample ranges it streams (its pieces plus one-sample reads of pooled
outliers and of the final tail that another rank holds); share = max over
ranks / (total / W) (1.00 = even; the issue's bound is 1.25). Requests =
ranged GETs (one per piece or one-sample read) per shard, split into
pieces + pooled outliers + the final window's tail. Carry = most samples any rank holds over from one window to
the next (kept in memory), and its bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from streambatch.epoch.read_modes import iter_windows  # noqa: E402
from streambatch.epoch.windows import WindowConfig  # noqa: E402
from streambatch.planners.shard_affine.planner import pooled_mask  # noqa: E402

from distributions import DISTRIBUTIONS, FRAME_RATE, make_lengths  # noqa: E402

BUDGET, CAP = 16_000, 64
N = 400_000
PER_RANK = 2_500
SHARD_MIN, SHARD_MAX = 500, 2_000
BYTES_PER_FRAME, HEADER_BYTES = 640, 1_024
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ../shared beside the checkout (/work/main -> /work/shared); a worktree one level deeper also finds it
REAL_DIRS = [os.path.join(_REPO, *[".."] * up, "shared", "data", "real-lengths") for up in (1, 2)]
REAL_DIR = next((d for d in REAL_DIRS if os.path.isdir(d)), REAL_DIRS[0])


def corpora(n: int, real_dir: str) -> dict[str, np.ndarray]:
    out = {name: make_lengths(name, n, 0) for name in DISTRIBUTIONS}
    if os.path.isdir(real_dir):
        for f in sorted(os.listdir(real_dir)):
            if f.endswith(".npy"):
                secs = np.load(os.path.join(real_dir, f))
                frames = np.maximum(np.ceil(secs * FRAME_RATE), 1).astype(np.int64)
                out[f[:-4]] = np.random.default_rng(1).choice(frames, n)  # resampled with replacement
    return out


def shard_counts(n: int, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(SHARD_MIN, SHARD_MAX + 1, size=n // SHARD_MIN + 1)
    cut = int(np.searchsorted(np.cumsum(sizes), n))
    sizes = sizes[: cut + 1]
    sizes[-1] -= sizes.sum() - n
    return sizes[sizes > 0].astype(np.int64)


def run(lengths: np.ndarray, counts: np.ndarray, w: int, mode: str, window: int, epoch: int) -> dict:
    """Plan one epoch window by window and measure it."""
    edges = np.concatenate([[0], np.cumsum(counts)])
    sample_bytes = lengths * BYTES_PER_FRAME + HEADER_BYTES
    config = WindowConfig(BUDGET, CAP, w, window, True, False, 0, "bucketed", (), mode)
    real = padded = 0
    balance, use = [], []
    seen = np.zeros(lengths.shape[0], dtype=np.int64)
    rank_bytes = np.zeros(w)
    requests = steps = carry = carry_bytes = from_pool = from_tail = 0
    for win in iter_windows(counts, lambda s: lengths[edges[s] : edges[s + 1]], config, epoch):
        gid = edges[win.shard_ids] + win.local
        plan = win.plan
        sizes = np.diff(plan.offsets)
        lens = lengths[gid[plan.samples]]
        longest = np.maximum.reduceat(lens, plan.offsets[:-1])
        real += int(lens.sum())
        padded += int((sizes * longest).sum())
        cost = (sizes * longest.astype(np.float64) ** 2).reshape(-1, w)
        balance.extend(cost.sum(axis=1) / (w * cost.max(axis=1)))
        open_ = CAP * longest > BUDGET
        use.extend(sizes[open_] * longest[open_] / BUDGET)
        np.add.at(seen, gid[plan.samples], 1)
        steps += plan.num_steps
        if mode == "shard":
            rank = np.repeat(np.arange(sizes.shape[0]) % w, sizes)
            away = win.holder[plan.samples] != rank
            fetched = {(r, s, lo) for r, s, lo, hi in win.reads.tolist() if hi == lo + 1}
            for r, i in zip(rank[away].tolist(), plan.samples[away].tolist()):
                if (r, int(win.shard_ids[i]), int(win.local[i])) not in fetched:
                    raise AssertionError("a rank trains on a sample it neither streams nor fetches")
            carried = win.holder[: win.n_carried]
            if carried.size:
                carry = max(carry, int(np.bincount(carried, minlength=w).max()))
                per = np.bincount(carried, weights=sample_bytes[gid[: win.n_carried]], minlength=w)
                carry_bytes = max(carry_bytes, float(per.max()))
            for r, s, lo, hi in win.reads.tolist():
                rank_bytes[r] += sample_bytes[edges[s] + lo : edges[s] + hi].sum()
            requests += win.reads.shape[0]
            # one-sample reads of samples held by another rank: pooled outliers or the final tail
            foreign = np.unique(np.stack([rank[away], plan.samples[away]], axis=1), axis=0)[:, 1]
            outlier = pooled_mask(lengths[gid], BUDGET, w)[foreign]
            from_pool += int(outlier.sum())
            from_tail += int((~outlier).sum())
    once = seen[seen > 0].size == lengths.shape[0] and (seen > 1).sum() < w
    if not once:
        raise AssertionError(f"not exactly once: {int((seen == 0).sum())} missing, {int((seen > 1).sum())} repeated")
    out = {"padding": real / padded, "balance": float(np.mean(balance)), "budget": float(np.mean(use)),
           "steps": steps}
    if mode == "shard":
        ns = counts.shape[0]
        out.update(share=float(rank_bytes.max() / (sample_bytes.sum() / w)), requests=requests / ns,
                   pieces=(requests - from_pool - from_tail) / ns, pool=from_pool / ns, tail=from_tail / ns,
                   carry=carry, carry_mb=carry_bytes / 2**20)
    return out


def mean_over(lengths, counts, w, mode, window, epochs) -> dict:
    runs = [run(lengths, counts, w, mode, window, e) for e in range(epochs)]
    worst = ("carry", "carry_mb")  # maxima over epochs; the rest are means
    return {k: max(r[k] for r in runs) if k in worst else float(np.mean([r[k] for r in runs])) for k in runs[0]}


def quality(data: dict[str, np.ndarray], counts: np.ndarray, worlds, per_rank: int, epochs: int) -> None:
    print(f"\n### Plan quality: sample mode (global window plan) vs shard mode (shard-affine), "
          f"window = {per_rank:,} x W samples, mean of {epochs} epoch(s)\n")
    print("| corpus | W | padding sample / shard | balance sample / shard | budget use sample / shard "
          "| steps sample / shard |")
    print("|---|---:|---|---|---|---|")
    for name, lengths in data.items():
        for w in worlds:
            a = mean_over(lengths, counts, w, "sample", per_rank * w, epochs)
            b = mean_over(lengths, counts, w, "shard", per_rank * w, epochs)
            print(f"| {name} | {w} | {a['padding']:.3f} / {b['padding']:.3f} | {a['balance']:.3f} / "
                  f"**{b['balance']:.3f}** | {a['budget']:.3f} / {b['budget']:.3f} | {a['steps']:.0f} / "
                  f"{b['steps']:.0f} ({b['steps'] / a['steps'] - 1:+.1%}) |", flush=True)


def io_table(data: dict[str, np.ndarray], counts: np.ndarray, worlds, per_rank: int) -> None:
    print(f"\n### Shard mode I/O per epoch (simulated), {counts.shape[0]} shards of {SHARD_MIN}-{SHARD_MAX} "
          "samples\n")
    print("| corpus | W | bytes of the busiest rank x W / total | ranged GETs per shard (pieces + outliers "
          "+ final tail) | max carried samples (MB) per rank |")
    print("|---|---:|---:|---|---|")
    for name, lengths in data.items():
        for w in worlds:
            r = run(lengths, counts, w, "shard", per_rank * w, 0)
            print(f"| {name} | {w} | {r['share']:.3f} | **{r['requests']:.2f}** ({r['pieces']:.2f} + {r['pool']:.2f} "
                  f"+ {r['tail']:.2f}) | {r['carry']:.0f} "
                  f"({r['carry_mb']:.1f}) |", flush=True)


def window_sweep(data: dict[str, np.ndarray], counts: np.ndarray, w: int, names, per_ranks) -> None:
    print(f"\n### Window size, shard mode, W = {w} (epoch 0)\n")
    print("| corpus | window (samples per rank) | padding | balance | budget use | steps |")
    print("|---|---:|---|---|---|---|")
    for name in names:
        if name not in data:
            continue
        for pr in per_ranks:
            r = run(data[name], counts, w, "shard", pr * w, 0)
            print(f"| {name} | {pr:,} | {r['padding']:.3f} | {r['balance']:.3f} | {r['budget']:.3f} "
                  f"| {r['steps']} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--per-rank", type=int, default=PER_RANK, help="window_samples = this x W")
    ap.add_argument("--real-lengths", default=REAL_DIR)
    ap.add_argument("--quick", action="store_true", help="one epoch, W = 8 and 64, no sweep")
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = corpora(args.n, args.real_lengths)
    counts = shard_counts(args.n)
    print(f"Budget {BUDGET:,} frames, at most {CAP} per batch; N = {args.n:,} per corpus "
          f"({', '.join(data)}); {counts.shape[0]} shards")
    quality(data, counts, (8, 64), args.per_rank, 1 if args.quick else 2)
    if not args.quick:
        io_table(data, counts, (4, 8, 16, 64), args.per_rank)
        window_sweep(data, counts, 64, ("lognormal", "heavytail", "commonvoice-ps"), (1_250, 2_500, 5_000))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
