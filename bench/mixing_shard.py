"""Mixed streaming in read_mode="shard" against read_mode="sample": plan
quality, mix accuracy and I/O per rank, from lengths only (no tar).

    .venv/bin/python bench/mixing_shard.py            # a few minutes on 2 cores

Setup: budget 16,000 frames, at most 64 per batch, bucketed options,
epochs 0-1, shards of 1,000 samples (each a run of its corpus), weights as
listed; window = shard mode's default (max(20,000, 2,500 x W)) for both
modes, so the windows (and the samples drawn) are the same. Metrics as
bench/affinity.py: padding = real / padded tokens; balance = per step, sum of
the W batch costs B*L^2 / (W x the largest); mix error = worst |share -
weight| (points) over the epoch and its first 10 % of steps. Shard mode
only: bytes share = max over ranks / mean (640 bytes per frame + 1,024 of
headers per sample; a rank's pieces plus its one-sample fetches), requests
per shard (ranged GETs). Checks every drawn sample trained once per window
(padding aside) and each trained sample read by its rank.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mixing import REAL, memory_catalog, prefix_errors, real  # noqa: E402

from streambatch.core.mix import Mix, SourceSpec  # noqa: E402
from streambatch.epoch.interleave import step_counts  # noqa: E402
from streambatch.epoch.mixed_windows import mixed_inputs, source_of_shards  # noqa: E402
from streambatch.epoch.read_modes import READ_MODES  # noqa: E402
from streambatch.epoch.sample_loop import plan_windows  # noqa: E402
from streambatch.epoch.shard_loop import plan_affine  # noqa: E402
from streambatch.epoch.windows import WindowConfig  # noqa: E402
from streambatch.streaming.shards.sources import SourceCatalog  # noqa: E402

from distributions import make_lengths  # noqa: E402

BUDGET, CAP, SEED, EPOCHS = 16_000, 64, 0, 2
BYTES_PER_FRAME, HEADER_BYTES = 640, 1_024


def catalog(sources: list[np.ndarray], weights: list[float]) -> SourceCatalog:
    shards, bounds = [], [0]
    for x in sources:
        shards += [x[i:i + 1000] for i in range(0, x.shape[0], 1000)]
        bounds.append(len(shards))
    mix = Mix.build([x.shape[0] for x in sources], [SourceSpec(weight=w) for w in weights])
    return SourceCatalog(memory_catalog(shards), np.array(bounds), mix, ())


def next_of(inputs, _world: int):
    return next(inputs, None)


def run(sc: SourceCatalog, weights: np.ndarray, world: int, mode: str) -> dict:
    cat = sc.catalog
    window = READ_MODES["shard"].default_window(world)
    cfg = WindowConfig(BUDGET, CAP, world, window, True, False, SEED, "bucketed", (), mode)
    real_t = padded = 0
    balance, counts = [], []
    rank_bytes = np.zeros(world)
    requests = 0
    for e in range(EPOCHS):
        inputs = mixed_inputs(sc, window, SEED, e, True)
        label = lambda ids: source_of_shards(sc, ids)  # noqa: E731
        if mode == "shard":
            wins = plan_affine(partial(next_of, inputs), cfg, e, (), label, sc.mix.num_sources)
        else:
            wins = plan_windows(inputs, cfg, e, (), label, sc.mix.num_sources)
        trained = 0
        for win in wins:
            gid = cat.starts[win.shard_ids] + win.local
            lengths = cat.all_lengths[gid].astype(np.int64)
            plan = win.plan
            sizes = np.diff(plan.offsets)
            lens = lengths[plan.samples]
            longest = np.maximum.reduceat(lens, plan.offsets[:-1])
            real_t += int(lens.sum())
            padded += int((sizes * longest).sum())
            cost = (sizes * longest.astype(np.float64) ** 2).reshape(-1, world)
            balance.extend(cost.sum(axis=1) / (world * cost.max(axis=1)))
            counts.append(step_counts(plan, label(win.shard_ids), sc.mix.num_sources)[plan.step_order])
            trained += int(sizes.sum()) - plan.num_padded
            if mode == "shard":
                rank = np.repeat(np.arange(sizes.shape[0]) % world, sizes)
                rows = {(r, s, j) for r, s, lo, hi in win.reads.tolist() for j in range(lo, hi)}
                held = set(zip(win.holder[: win.n_carried].tolist(), win.shard_ids[: win.n_carried].tolist(),
                               win.local[: win.n_carried].tolist()))
                for r, i in zip(rank.tolist(), plan.samples.tolist()):
                    k = (r, int(win.shard_ids[i]), int(win.local[i]))
                    assert k in rows or k in held, "a rank trains a sample it never read"
                for r, s, lo, hi in win.reads.tolist():
                    b = cat.starts[s]
                    rank_bytes[r] += float((cat.all_lengths[b + lo:b + hi] * BYTES_PER_FRAME + HEADER_BYTES).sum())
                requests += win.reads.shape[0]
        assert trained == sc.mix.samples_per_epoch, (trained, sc.mix.samples_per_epoch)  # every drawn sample once
    errs = prefix_errors(np.concatenate(counts), weights)
    out = {"padding": real_t / padded, "balance": float(np.mean(balance)), "epoch": errs[0], "p10": errs[1],
           "steps": sum(c.shape[0] for c in counts) / EPOCHS}
    if mode == "shard":
        out.update(share=float(rank_bytes.max() / rank_bytes.mean()),
                   requests=requests / (EPOCHS * len(cat.urls)))
    return out


def main() -> None:
    mixes = [("lognormal 300k + read 100k @ .6/.4", [make_lengths("lognormal", 300_000, 7),
                                                     make_lengths("read", 100_000, 8)], [0.6, 0.4])]
    if os.path.isdir(REAL):
        mixes.append(("4 real corpora @ .4/.3/.2/.1", [real(n) for n in ("librispeech-train-clean-100",
                      "commonvoice-id", "commonvoice-ps", "voicebank-demand")], [0.4, 0.3, 0.2, 0.1]))
    print("| sources | W | padding sample / shard | balance sample / shard | mix error epoch, first 10 % "
          "(points) sample / shard | steps sample / shard | bytes share | requests per shard |")
    print("|---|---:|---|---|---|---|---:|---:|")
    for name, sources, weights in mixes:
        sc = catalog(sources, weights)
        w_arr = np.asarray(weights) / sum(weights)
        for world in (8, 32, 64):
            a, b = run(sc, w_arr, world, "sample"), run(sc, w_arr, world, "shard")
            print(f"| {name} | {world} | {a['padding']:.3f} / {b['padding']:.3f} | {a['balance']:.3f} / "
                  f"**{b['balance']:.3f}** | {a['epoch']:.2f}, {a['p10']:.2f} / {b['epoch']:.2f}, {b['p10']:.2f} "
                  f"| {a['steps']:.0f} / {b['steps']:.0f} | {b['share']:.3f} | {b['requests']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
