"""Weighted mixing and elastic resume: mix accuracy and plan quality.

    .venv/bin/python bench/mixing.py      # about a minute on 2 cores

Setup: budget 16,000 frames (50 frames/s), at most 64 samples per batch,
W = 8 and 64, epochs 0-2 (seed 0), both planners. Source pairs:

- synthetic (``bench/distributions.py``): log-normal 60,000 + read speech
  20,000 at weights 0.6 / 0.4 (read speech up-sampled 1.6x); bimodal 40,000
  + heavy-tailed 40,000 at 0.9 / 0.1 (heavy-tailed down-sampled 4x);
- real (``/work/shared/data/real-lengths``, skipped if absent): LibriSpeech
  train-clean-100 (28,539, long read speech) + Common Voice Indonesian
  (58,741, short prompts) at 0.6 / 0.4; and the four real corpora at
  0.4 / 0.3 / 0.2 / 0.1.

Tables:

1. Mix accuracy, map-style: each source's share of the samples trained in
   an epoch (padding included) against its weight, worst absolute error in
   percentage points over epochs and sources; and the same over the first
   10 % and 50 % of the epoch's steps (the planner groups samples by
   length, so a short prefix of steps holds the sources by their lengths;
   only whole epochs are exact). Exactly-once per cycle is checked over
   enough epochs to close every cycle.
2. Mix accuracy, streaming: the worst per-window share error (windows of
   20,000 samples, shards of 1,000).
3. Quality: padding and balance efficiency (as ``streambatch plan``) of the
   mixed epoch against planning the plain concatenation of the sources
   (every sample once), same planner, W.
4. Elastic: a 64-rank epoch cut at 50 % and finished on 48 ranks (and 8 ->
   5 at 30 %): quality of the finished steps against the uninterrupted
   epoch, and that every sample ran exactly once.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from streambatch.cli.report import plan_batches, quality  # noqa: E402
from streambatch.core.mix import Mix, SourceSpec  # noqa: E402
from streambatch.epoch.elastic import step_samples  # noqa: E402
from streambatch.epoch.in_memory import plan_epoch_steps  # noqa: E402
from streambatch.epoch.interleave import step_counts  # noqa: E402
from streambatch.epoch.mixed_windows import mixed_inputs, source_of_shards  # noqa: E402
from streambatch.epoch.sample_loop import plan_windows  # noqa: E402
from streambatch.epoch.windows import WindowConfig  # noqa: E402
from streambatch.planners import make_plan  # noqa: E402
from streambatch.streaming.shards.catalog import Catalog  # noqa: E402
from streambatch.streaming.shards.sources import SourceCatalog  # noqa: E402

from distributions import FRAME_RATE, make_lengths  # noqa: E402

BUDGET, CAP, SEED, EPOCHS = 16_000, 64, 0, 3
WORLDS = (8, 64)
PLANNERS = ("bucketed", "greedy")
REAL = "/work/shared/data/real-lengths"


def real(name: str) -> np.ndarray:
    return np.ceil(np.load(os.path.join(REAL, f"{name}.npy")) * FRAME_RATE).astype(np.int64)


def mixes() -> list[tuple[str, list[np.ndarray], list[float]]]:
    out = [("lognormal 600k + read 200k @ .6/.4", [make_lengths("lognormal", 600_000, 7),
                                                   make_lengths("read", 200_000, 8)], [0.6, 0.4]),
           ("lognormal 60k + read 20k @ .6/.4", [make_lengths("lognormal", 60_000, 1), make_lengths("read", 20_000, 2)],
            [0.6, 0.4]),
           ("bimodal 40k + heavytail 40k @ .9/.1", [make_lengths("bimodal", 40_000, 3),
                                                    make_lengths("heavytail", 40_000, 4)], [0.9, 0.1])]
    if os.path.isdir(REAL):
        out.append(("LibriSpeech-100 + CV-id @ .6/.4", [real("librispeech-train-clean-100"), real("commonvoice-id")],
                    [0.6, 0.4]))
        out.append(("4 real corpora @ .4/.3/.2/.1", [real(n) for n in ("librispeech-train-clean-100", "commonvoice-id",
                                                                        "commonvoice-ps", "voicebank-demand")],
                    [0.4, 0.3, 0.2, 0.1]))
    return out


def plan_fn(planner: str):
    return lambda lens, w, seed, epoch: make_plan(lens, BUDGET, CAP, w, seed=seed, epoch=epoch, planner=planner)


def prefix_errors(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Worst |share - weight| (points) over the whole (n_steps, S) per-step
    source counts (training order), its first 10 % and 50 % of steps."""
    out = []
    for frac in (1.0, 0.1, 0.5):
        c = counts[: max(1, int(round(frac * counts.shape[0])))].sum(axis=0)
        out.append(np.abs(c / c.sum() - weights).max() * 100)
    return np.array(out)


def accuracy(mix: Mix, lengths: np.ndarray, weights: np.ndarray, planner: str, world: int) -> np.ndarray:
    """Worst |share - weight| (points) over the epoch, its first 10 % and 50 %
    of steps; then the same two prefixes in the planner's own shuffled step
    order (without ``interleave_steps``)."""
    worst = np.zeros(5)
    labels = mix.source_of(np.arange(lengths.shape[0]))
    for e in range(EPOCHS):
        plan = plan_epoch_steps(lengths, plan_fn(planner), world, SEED, e, mix=mix)[0]
        counts = step_counts(plan, labels, mix.num_sources)
        worst[:3] = np.maximum(worst[:3], prefix_errors(counts[plan.step_order], weights))
        drawn = mix.draw(SEED, e)
        raw = plan_fn(planner)(lengths[drawn], world, SEED, e)
        raw_counts = step_counts(raw, labels[drawn], mix.num_sources)[raw.step_order]
        worst[3:] = np.maximum(worst[3:], prefix_errors(raw_counts, weights)[1:])
    return worst


def once_per_cycle(mix: Mix) -> bool:
    """Over the epochs that close every source's cycles, each sample of a
    source appears (epochs x quota / size) times: once per cycle."""
    from math import lcm

    epochs = 1
    for n, c in zip(mix.sizes, mix.counts):
        epochs = lcm(epochs, n // np.gcd(n, c))
    if epochs > 40:
        return True  # too many epochs to close every cycle cheaply; the unit tests cover it
    counts = np.bincount(np.concatenate([mix.draw(SEED, e) for e in range(epochs)]), minlength=sum(mix.sizes))
    off = mix.offsets
    return all((counts[off[i]:off[i + 1]] == epochs * c // n).all() for i, (n, c) in enumerate(zip(mix.sizes,
                                                                                                   mix.counts)))


def memory_catalog(shards: list[np.ndarray]) -> Catalog:
    """A catalog of in-memory shard lengths (planning only: no sidecars, no tar)."""
    counts = np.array([x.shape[0] for x in shards], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Catalog(tuple(f"mem{i}" for i in range(len(shards))), (), counts, (), np.concatenate(shards), starts)


def stream_accuracy(sources: list[np.ndarray], weights: list[float], world: int, planner: str) -> tuple[float, ...]:
    """Streaming: worst |share - weight| (points) over the epoch, its first
    10 % and 50 % of steps, and over each window's samples, epochs 0-2."""
    shards, bounds = [], [0]
    for x in sources:
        shards += [x[i:i + 1000] for i in range(0, x.shape[0], 1000)]
        bounds.append(len(shards))
    mix = Mix.build([x.shape[0] for x in sources], [SourceSpec(weight=w) for w in weights])
    sc = SourceCatalog(memory_catalog(shards), np.array(bounds), mix, ())
    cfg = WindowConfig(BUDGET, CAP, world, 20_000, True, False, SEED, planner)
    target = np.asarray(weights) / sum(weights)
    worst = np.zeros(4)
    for e in range(EPOCHS):
        for win in mixed_inputs(sc, 20_000, SEED, e, True):
            share = np.bincount(source_of_shards(sc, win.ids), minlength=len(sources)) / win.ids.shape[0]
            worst[3] = max(worst[3], float(np.abs(share - target).max() * 100))
        counts = [step_counts(win.plan, source_of_shards(sc, win.shard_ids), len(sources))[win.plan.step_order]
                  for win in plan_windows(mixed_inputs(sc, 20_000, SEED, e, True), cfg, e, (),
                                          lambda ids: source_of_shards(sc, ids), len(sources))]
        worst[:3] = np.maximum(worst[:3], prefix_errors(np.concatenate(counts), target))
    return tuple(worst)


def qual(plan, lengths) -> tuple[float, float]:
    q = quality(plan_batches(plan, lengths), BUDGET)
    return q.padding_efficiency, q.balance_efficiency


def main() -> None:
    print(f"budget {BUDGET} frames ({BUDGET / FRAME_RATE:.0f} s), <= {CAP} per batch, seed {SEED}, "
          f"epochs 0-{EPOCHS - 1}\n")
    print("## Mix accuracy (worst |share - weight|, percentage points) and quality vs the plain concatenation\n")
    print("| sources | planner | W | epoch | first 10 % | first 50 % | not interleaved: 10 % / 50 % "
          "| streaming: epoch / 10 % / 50 % / per window | once per cycle | padding mixed / concat "
          "| balance mixed / concat |")
    print("|---|---|---:|---:|---:|---:|---|---|---|---|---|")
    for name, sources, weights in mixes():
        lengths = np.concatenate(sources)
        mix = Mix.build([x.shape[0] for x in sources], [SourceSpec(weight=w) for w in weights])
        w_arr = np.asarray(weights) / sum(weights)
        once = once_per_cycle(mix)
        for planner in PLANNERS:
            for world in WORLDS:
                acc = accuracy(mix, lengths, w_arr, planner, world)
                stream = stream_accuracy(sources, weights, world, planner)
                qm = np.mean([qual(plan_epoch_steps(lengths, plan_fn(planner), world, SEED, e, mix=mix)[0], lengths)
                              for e in range(EPOCHS)], axis=0)
                qc = np.mean([qual(make_plan(lengths, BUDGET, CAP, world, seed=SEED, epoch=e, planner=planner), lengths)
                              for e in range(EPOCHS)], axis=0)
                print(f"| {name} | {planner} | {world} | {acc[0]:.3f} | {acc[1]:.2f} | {acc[2]:.2f} "
                      f"| {acc[3]:.1f} / {acc[4]:.1f} "
                      f"| {stream[0]:.2f} / {stream[1]:.2f} / "
                      f"{stream[2]:.2f} / {stream[3]:.2f} "
                      f"| {'yes' if once else 'NO'} | {qm[0]:.3f} / {qc[0]:.3f} | {qm[1]:.3f} / {qc[1]:.3f} |")
    print("\n## Elastic resume: quality of the steps after the resize vs the uninterrupted epoch (bucketed)\n")
    print("| lengths | W -> W' at | steps before / after | padding after / uninterrupted "
          "| balance after / uninterrupted | every sample once |")
    print("|---|---|---|---|---|---|")
    for name, lengths in [("lognormal 200k", make_lengths("lognormal", 200_000, 5)),
                          ("read 200k", make_lengths("read", 200_000, 6))]:
        for w0, w1, frac in [(64, 48, 0.5), (8, 5, 0.3), (16, 32, 0.7)]:
            fn = plan_fn("bucketed")
            full = fn(lengths, w0, SEED, 1)
            k = int(frac * full.num_steps)
            rest, _ = plan_epoch_steps(lengths, fn, w1, SEED, 1, segments=((w0, k),))
            trained = np.concatenate([step_samples(full, k), step_samples(rest, rest.num_steps)])
            once = np.bincount(trained, minlength=lengths.shape[0])
            ok = (once >= 1).all() and (once > 1).sum() <= w1 - 1
            qa, qf = qual(rest, lengths), qual(fn(lengths, w1, SEED, 1), lengths)
            print(f"| {name} | {w0} -> {w1} at {frac:.0%} | {k} / {rest.num_steps} | {qa[0]:.3f} / {qf[0]:.3f} "
                  f"| {qa[1]:.3f} / {qf[1]:.3f} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
