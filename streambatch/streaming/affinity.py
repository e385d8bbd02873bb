"""Shard-affine window planning (``read_mode="shard"``): every rank trains
only on samples whose bytes it streamed itself, so each byte of a shard
crosses the network once per epoch across the whole job.

Design (one window; pure function of the window's lengths, the samples
carried into it, config, seed, epoch and window index, so every rank and
worker computes every rank's share without talking):

1. **Deal by cutting, not by whole shards.** The window's samples, in its
   (shuffled) shard order and tar order inside each shard, are cut into W
   contiguous pieces of equal *weight* (a sample weighs its cost under the
   cost model, e.g. L**2, plus one), after the samples each rank carried in
   from the previous window are counted to it (water-filling). Rank r gets
   piece r: the tail of one shard, whole shards, the head of another. So
   every byte is read by exactly one rank, a shard is read in at most
   ``1 + (number of cuts inside it)`` pieces (one ranged GET each: at most
   ``shards + W - 1`` requests per window, <= 2 per shard when a window holds
   >= W shards), and the ranks' totals are equal to within one sample, which
   whole-shard dealing (longest processing time first) cannot promise with a
   few shards per rank.
2. **Per rank, sort.** Each rank's samples are counting-sorted into the
   bucketed planner's geometric length buckets (``bucket_width``, grid
   shifted per window) and shuffled inside each bucket.
3. **Walk all ranks at one pace** (``affinity_kernels.affine_steps``): a
   step's frontier F is the smallest weight fraction any rank reaches with
   its fullest in-budget batch; every rank takes its samples up to F of its
   own total. Batches of a step thus carry equal shares of equal totals:
   balanced steps, token budget and size cap kept, every rank the same
   number of steps, and ranks run out together. Where one rank's lengths run
   ahead of another's, the other's batch is under-filled rather than made
   costlier (balance is kept, a few more steps are taken).
4. **What is left** when the first rank runs out (a few samples per rank)
   stays with its rank: carried into the next window and counted to that
   rank there. The rank keeps those samples' bytes in memory (it read them
   in this window; at most about one batch per rank), so nothing is read
   twice. In the epoch's final window the walk goes on until every rank is
   empty and a rank already empty gets a one-sample batch repeating its own
   shortest sample of the window (counted in ``num_padded``); only a rank
   that holds no sample at all in the final window repeats another rank's
   sample (one ranged read). With ``drop_last`` the rest is dropped instead.
5. Step order inside the window is shuffled from (seed, epoch, window).

A rank's batches mix all of its window share, so it needs its whole share
(about window bytes / W) before the window's first step; prefetching the
next window's share while one trains keeps two shares per rank resident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..bucketed import bucket_edges, check_options
from ..plan import Plan, assemble
from ..planners import make_plan
from .affinity_kernels import affine_steps

_U64 = 1 << 64
_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class AffineWindow:
    """One shard-affine window.

    plan: global steps; sample indices address the window's samples, which
        are the carried-in samples followed by the new ones.
    holder: (n,) int64 rank that streams (or carried in) each sample.
    cuts: (W + 1,) int64; rank r reads new samples ``cuts[r]:cuts[r + 1]``
        (positions in the new sequence, i.e. window index - n_carried).
    leftover: (k,) int64 window indices not trained on here: carried into the
        next window by their owner, or (final window, drop_last) dropped.
    """

    plan: Plan
    holder: np.ndarray
    cuts: np.ndarray
    leftover: np.ndarray


def sample_weights(lengths: np.ndarray, cost: Any, max_tokens: int, max_size: int, max_cost: int,
                   world_size: int) -> np.ndarray:
    """(n,) float64 weight of each sample: its scaled cost alone, plus one
    (so zero-length samples still count), but at most the cost of a full
    batch at the window's W-th longest length (about the longest length
    every rank reaches). A longer outlier fills a step by itself whatever it
    costs; weighed in full, it would leave its rank short of other samples,
    so that rank would run out steps before the others."""
    weights = cost.scaled(1, lengths).astype(np.float64)
    n = lengths.shape[0]
    if n > world_size:
        top = int(np.partition(lengths, n - world_size)[n - world_size])
        count = max(1, min(max_size, max_tokens // max(top, 1)))
        while count > 1 and int(cost.scaled(count, top)) > max_cost:
            count -= 1
        np.minimum(weights, float(cost.scaled(count, top)), out=weights)
    return weights + 1.0


def water_levels(carry: np.ndarray, total_new: float) -> np.ndarray:
    """(W,) float64 share of ``total_new`` weight each rank gets so that
    carry + share is as even as possible (ranks above the level get none)."""
    w = carry.shape[0]
    order = np.argsort(carry, kind="stable")
    ks = carry[order]
    level = (total_new + ks.sum()) / w
    for j in range(w, 0, -1):  # largest set of lowest ranks that sit below the level
        level = (total_new + ks[:j].sum()) / j
        if j == w or level <= ks[j]:
            break
    return np.maximum(level - carry, 0.0)


def cut_points(weights: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """(W + 1,) int64 monotone cuts of ``weights`` (m,) into W contiguous
    pieces whose sums are as close as can be to ``shares`` (W,)."""
    run = np.concatenate([[0.0], np.cumsum(weights)])
    bounds = np.cumsum(shares)[:-1]
    hi = np.searchsorted(run, bounds).clip(1, run.shape[0] - 1)
    nearer_lo = (bounds - run[hi - 1]) <= (run[hi] - bounds)
    inner = np.where(nearer_lo, hi - 1, hi)
    cuts = np.concatenate([[0], np.maximum.accumulate(inner), [weights.shape[0]]]).astype(np.int64)
    return np.minimum(cuts, weights.shape[0])


def plan_affine_window(carry_len: np.ndarray, carry_holder: np.ndarray, new_len: np.ndarray,
                       max_batch_tokens: int, max_batch_size: int, world_size: int, shuffle: bool,
                       final: bool, drop_last: bool, seed: int, options: dict[str, Any]) -> AffineWindow:
    """Plan one window in shard-affine mode (inputs validated by the caller).

    carry_len, carry_holder: (c,) int64 lengths and holding ranks of the
    samples carried in; new_len: (m,) int64 lengths of the window's new
    samples in shard order. ``final``: the epoch's last window (its tail is
    planned across ranks and ``drop_last`` applies); otherwise what cannot
    form balanced steps is returned as leftover, to carry.
    options: the bucketed planner's (bucket_width, cost, max_step_cost).
    """
    width, cost, max_step_cost = check_options(options)
    w = world_size
    c = carry_len.shape[0]
    lengths = np.concatenate([carry_len, new_len]).astype(np.int64, copy=False)
    n = lengths.shape[0]
    lmax = int(lengths.max(initial=0))
    cap = min(max_batch_size, max(n, 1))
    tokens = min(max_batch_tokens, cap * max(lmax, 1) + 1)
    cost.check_range(lmax, tokens, cap, w)
    max_cost = _INT64_MAX
    if max_step_cost is not None:
        max_cost = int(min(np.floor(max_step_cost * cost.scale), _INT64_MAX))
        if max_cost < 1:
            raise ValueError(f"max_step_cost={max_step_cost} is below the cost of any batch ({cost}); raise it")
    weights = sample_weights(lengths, cost, tokens, cap, max_cost, w)
    carry_w = np.bincount(carry_holder, weights=weights[:c], minlength=w).astype(np.float64)
    cuts = cut_points(weights[c:], water_levels(carry_w, float(weights[c:].sum())))
    holder = np.concatenate([carry_holder.astype(np.int64), np.repeat(np.arange(w, dtype=np.int64), np.diff(cuts))])

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % _U64, 0xAFF])))
    phase = float(rng.random()) if shuffle else 0.0
    bucket = np.searchsorted(bucket_edges(lmax, width, phase), lengths, side="right")
    tags = rng.integers(0, 1 << 62, size=n) if shuffle else np.arange(n)
    order = np.lexsort((tags, lengths, holder)).astype(np.int64)
    starts = np.searchsorted(holder[order], np.arange(w + 1)).astype(np.int64)
    counts, k, pos = affine_steps(lengths[order], starts, tokens, cap, cost.code, cost.q, max_cost, 0.0)
    counts = counts[:k]
    # rank r's batches are consecutive slices of its segment of ``order``
    begin = starts[:w] + np.cumsum(counts, axis=0) - counts
    flat = counts.ravel()
    samples = order[np.repeat(begin.ravel() - (np.cumsum(flat) - flat), flat) + np.arange(int(flat.sum()))]
    rest = order[np.concatenate([np.arange(pos[r], starts[r + 1]) for r in range(w)]).astype(np.int64)]
    padded = 0
    if final and rest.size:
        # The epoch's tail (a few samples per rank) is planned across ranks,
        # as in sample mode: a sample given to a rank other than its holder
        # costs that rank one ranged read, instead of steps of padding.
        tail = make_plan(lengths[rest], max_batch_tokens, max_batch_size, w, shuffle=shuffle, drop_last=drop_last,
                         seed=int(rng.integers(0, 1 << 62)), planner="bucketed", **options)
        samples = np.concatenate([samples, rest[tail.samples]])
        counts = np.concatenate([counts, np.diff(tail.offsets).reshape(-1, w)])
        padded = tail.num_padded
        rest = rest[tail.leftover]
    steps = counts.shape[0]
    step_order = rng.permutation(steps).astype(np.int64) if shuffle else np.arange(steps, dtype=np.int64)
    plan = assemble(samples, counts, step_order, w, padded, rest)
    return AffineWindow(plan, holder, cuts, rest)


def foreign_samples(plan: Plan, holder: np.ndarray) -> np.ndarray:
    """(k, 2) int64 rows (rank, sample) of samples a rank trains on without
    holding them (the final window's tail and padding), deduplicated: each
    costs that rank one ranged read."""
    w = plan.world_size
    sizes = np.diff(plan.offsets)
    rank = np.repeat(np.arange(sizes.shape[0], dtype=np.int64) % w, sizes)
    samples = plan.samples.astype(np.int64)
    away = holder[samples] != rank
    rows = np.unique(np.stack([rank[away], samples[away]], axis=1), axis=0)
    return rows.reshape(-1, 2)
