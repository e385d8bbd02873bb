"""Shard-affine window planning (``read_mode="shard"``): every rank trains
on samples whose bytes it streamed itself, so each byte of a shard crosses
the network once per epoch across the whole job, in a few large reads.

Design (one window; a pure function of the window's lengths, the samples
carried into it, config, seed, epoch and window index, so every rank and
worker computes every rank's share without talking):

1. **Deal by cutting, not by whole shards.** The window's new samples, in
   its (shuffled) shard order and tar order inside each shard, are cut into
   W contiguous pieces of equal *weight* (a sample weighs its cost under the
   cost model, e.g. L**2, plus one, clipped at a full batch's cost at the
   window's W-th longest length), after counting to each rank the samples
   it carried in (water-filling). Rank r streams piece r: the tail of one
   shard, whole shards, the head of another. Every byte is read by one
   rank, a window costs at most ``shards + W - 1`` ranged reads (windows hold
   >= W shards, so < 2 per shard), and the ranks' totals are equal to within
   one sample, which whole-shard dealing (e.g. longest processing time
   first) cannot promise with a few shards per rank.
2. **Per rank, sort** its samples by length (random tie order).
3. **Walk all ranks at one pace** (``walk.affine_steps``): a
   step's target is the cost of the cheapest full batch any rank can take
   next; that rank takes it and every other rank takes the prefix of its
   sorted samples whose cost is nearest the target. Steps are balanced,
   within the token budget and size cap, every rank has the same number,
   and ranks with equal totals run out together. Where one rank's lengths
   run ahead of another's, its batch is under-filled rather than made
   costlier: balance is kept at the price of a few more steps.
4. **Outliers are pooled.** Samples longer than a fifth of the token budget
   (a batch at their length holds <= 4) cannot be balanced by the rank that
   happens to hold them; up to 4 * W of them per window are planned across
   ranks with the bucketed planner, then matched to holders
   (``holders.py``: each batch to the rank holding most of it, then
   swaps of samples between batches that keep every batch's size and
   longest length, then swaps that keep each step's costliest batch and
   cost it <= 0.03 balance). A pooled sample trained by another rank is
   one ranged read; the holder streamed its bytes too (its piece is one read).
5. **What is left** when the first rank runs out (a few samples per rank)
   stays with its holder: carried into the next window and counted to that
   rank there. The holder keeps those samples' bytes in memory (about one
   batch per rank), so nothing is read twice. In the epoch's final window
   that tail is planned across ranks like the outliers (``drop_last`` as
   the user set it; padding by the planners' rule), instead of leaving
   ranks idle. To keep it small (each tail sample a rank does not hold is
   a ranged read), the final window is cut up to RECUTS more times, each
   time giving every rank half its tail's weight less (more, if below the
   mean) and keeping the cut with the fewest tail samples.
6. Step order inside the window is shuffled from (seed, epoch, window).
7. **Steps within the cap.** A window takes at most its cap (``max_steps``:
   in streaming, the window's share of the epoch's limit, ``epoch/step_budget.py``;
   as a planner of its own, 1.10 x the fewest + 1, ``STEP_SLACK``). Over it,
   the walk is tried again with each step's target raised towards the ranks'
   full batches (``walk.affine_steps``' ``target_rank``), keeping the one
   within the cap that plans the shortest epoch under the cost plus the
   default per-step term; when none is within, the window (the same cut:
   each rank still streams its own piece) is planned across ranks by the
   cross-rank planner, each sample a rank trains without holding it one
   ranged read.

Packed batches (``pack=True``: the sum of a batch's lengths within the
budget, its cost the sum of its samples' costs): the same cut, pooling and
tail, with the walk of ``walk.packed_affine_steps`` (prefixes
of each rank's ascending lengths, their costs and tokens summed) and the
pool planned packed. Holder swaps are then only the cost-checked ones
(``relax_to_holders``): the size-and-longest-keeping swaps do not keep a
packed batch's sum.

A rank's batches mix all of its window share, so it needs its whole share
(about window bytes / W) before the window's first step; prefetching the
next window's share while one trains keeps two shares per rank resident.
``bucket_width`` has no effect here (per-rank pools are sorted exactly).

Stream: per window, per-rank cuts of its shards and the steps that train them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.constraint import BatchConstraint, BatchLimits
from ...core.plan import Plan, assemble
from ...core.plan_time import epoch_time, packed_epoch_time
from ...core.registry import get_planner
from ..base import Planner
from ..options import BUCKET_WIDTH, COST, COST_KINDS, DEFAULT_BUCKET_WIDTH, LIMIT, MAX_STEP_COST, MAX_STEPS, PACK
from ..tail import epoch_drop_last
from .holders import relax_to_holders, swap_to_holders, to_holders

_U64 = 1 << 64
# A sample so long that a batch at its length holds at most POOL_BATCH samples
# is an outlier, planned across ranks; at most POOL_CAP * W of them per window
# (each costs one ranged read unless its holder gets it).
POOL_BATCH = 4
POOL_CAP = 4
# Final window: cut again up to RECUTS times, moving half of each rank's share of
# the walk's tail to the ranks that ran out (the whole of it oscillates), and keep
# the cut with the smallest tail: tail samples are planned across ranks, each a
# ranged read for the rank that trains it (bench/affinity.py).
RECUTS = 12
# A swap moving a pooled sample to its holder may cost its step this much balance.
RELAX_TOL = 0.03
# Pooled outliers and the final window's tail (and, in epoch/shard_loop.py, an elastic rest) are planned across
# ranks by this registered planner, looked up by name: a planner composes another through the registry, never by
# importing it.
CROSS_RANK_PLANNER = "bucketed"


@dataclass(frozen=True)
class AffineWindow:
    """One shard-affine window.

    plan: global steps; sample indices address the window's samples, which
        are the carried-in samples followed by the new ones.
    holder: (n,) int64 rank that streams (or carried in) each sample.
    cuts: (W + 1,) int64; rank r reads new samples ``cuts[r]:cuts[r + 1]``
        (positions in the new sequence, i.e. window index - n_carried);
        with groups, (G, W + 1): the cuts of each group (positions in the
        new sequence).
    leftover: (k,) int64 window indices not trained on here: carried into the
        next window by their owner, or (final window, drop_last) dropped.
    """

    plan: Plan
    holder: np.ndarray
    cuts: np.ndarray
    leftover: np.ndarray


def sample_weights(lengths: np.ndarray, cost: Any, max_tokens: int, max_size: int, max_cost: int,
                   world_size: int, table: np.ndarray | None = None) -> np.ndarray:
    """(n,) int64 weight of each sample: its scaled cost alone, plus one
    (so zero-length samples still count), but at most the cost of a full
    batch at the window's W-th longest length (about the longest length
    every rank reaches). A longer outlier fills a step by itself whatever it
    costs; weighed in full, it would leave its rank short of other samples,
    so that rank would run out steps before the others. Integers, so that
    every machine cuts a window at the same samples. table: the limit
    curve's sizes per length (``BatchConstraint.size_table``), or None."""
    weights = cost.scaled(1, lengths)
    n = lengths.shape[0]
    if n > world_size:
        top = int(np.partition(lengths, n - world_size)[n - world_size])
        count = max(1, min(max_size, max_tokens // max(top, 1)))
        if table is not None and table.shape[0]:
            count = max(1, min(count, int(table[top])))
        while count > 1 and int(cost.scaled(count, top)) > max_cost:
            count -= 1
        np.minimum(weights, int(cost.scaled(count, top)), out=weights)
    return weights + 1


def pooled_mask(lengths: np.ndarray, max_tokens: int, world_size: int) -> np.ndarray:
    """(n,) bool: the outliers planned across ranks, samples so long that a
    batch at their length holds at most POOL_BATCH of them (at most the
    W * POOL_CAP longest such samples of the window, to bound extra reads)."""
    mask = lengths > max_tokens // (POOL_BATCH + 1)
    limit = POOL_CAP * world_size
    if mask.sum() > limit:
        mask[:] = False
        mask[np.argsort(-lengths, kind="stable")[:limit]] = True
    return mask


def water_levels(carry: np.ndarray, total_new: int) -> np.ndarray:
    """(W,) int64 share of ``total_new`` weight each rank gets so that
    carry + share is as even as possible (ranks above the level get none).
    carry: (W,) int64."""
    w = carry.shape[0]
    ks = np.sort(carry)
    level = 0
    for j in range(w, 0, -1):  # the most ranks (the lowest j) that all sit at or below their common level
        level = (total_new + int(ks[:j].sum())) // j
        if level >= ks[j - 1]:
            break
    return np.maximum(level - carry, 0)


def cut_points(weights: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """(W + 1,) int64 monotone cuts of ``weights`` (m,) int64 into W contiguous
    pieces whose sums are as close as can be to ``shares`` (W,) int64; the
    last piece ends at m whatever its share."""
    run = np.concatenate([[0], np.cumsum(weights)])
    bounds = np.cumsum(shares)[:-1]
    hi = np.searchsorted(run, bounds).clip(1, run.shape[0] - 1)
    nearer_lo = (bounds - run[hi - 1]) <= (run[hi] - bounds)
    inner = np.where(nearer_lo, hi - 1, hi)
    cuts = np.concatenate([[0], np.maximum.accumulate(inner), [weights.shape[0]]]).astype(np.int64)
    return np.minimum(cuts, weights.shape[0])


def plan_affine_window(carry_len: np.ndarray, carry_holder: np.ndarray, new_len: np.ndarray, limits: BatchLimits,
                       world_size: int, shuffle: bool, final: bool, drop_last: bool, seed: int,
                       bucket_width: float = DEFAULT_BUCKET_WIDTH, groups: np.ndarray | None = None,
                       max_steps: int | None = None) -> AffineWindow:
    """Plan one window in shard-affine mode (inputs validated by the caller).

    carry_len, carry_holder: (c,) int64 lengths and holding ranks of the
    samples carried in; new_len: (m,) int64 lengths of the window's new
    samples in shard order. limits: the batch rule (budget, cap, cost model,
    cost cap, packing), bound here to the window's lengths once. ``final``:
    the epoch's last window (its tail is planned across ranks and
    ``drop_last`` applies); otherwise what cannot form balanced steps is
    returned as leftover, to carry. bucket_width: the pooled plan's buckets.
    groups: (G + 1,) int64 bounds of contiguous groups of the new samples
    (a mix's sources): each group is cut into W pieces on its own, each rank
    getting the same fraction of every group, so that every rank's samples
    follow the window's mix of lengths (one source per rank would leave the
    ranks' walks far apart: measured, 1.6x the steps). None: one group.
    max_steps: the window's step cap (``epoch/step_budget.py``; None: none),
    which a walk's steps and the full steps of what it carries (its leftover,
    planned by the windows after it) must fit together. When the balanced
    walk and its pooled plan take more steps, the window is
    walked again with the step's target raised to a quarter, half, three
    quarters and all of the ranks' full batches (``affine_steps``'
    ``target_rank``; all: every rank takes its full batch, the fewest steps
    its own samples allow), and of those within the cap the one planning the
    shortest epoch under the cost plus the default per-step term
    (``BatchConstraint.default_step_cost``) is kept. When none is within it
    (each rank's own samples, cut into batches, lose up to a batch each:
    many steps' worth where windows hold few steps), the same cut is planned
    across ranks by the cross-rank planner within the cap, as sample mode
    plans; a sample trained by a rank that did not stream it costs that rank
    a ranged read (``foreign_samples``), as the pooled outliers do.
    """
    w = world_size
    c = carry_len.shape[0]
    lengths = np.concatenate([carry_len, new_len]).astype(np.int64, copy=False)
    constraint = limits.bind(lengths, w)
    pooled = pooled_mask(lengths, limits.max_batch_tokens, w)
    weights = sample_weights(lengths, constraint.cost, constraint.max_tokens, constraint.max_size,
                             constraint.max_cost, w, constraint.size_table)
    weights[pooled] = 1
    carry_w = np.zeros(w, dtype=np.int64)
    np.add.at(carry_w, carry_holder, weights[:c])
    new_w = weights[c:]
    shares = water_levels(carry_w, int(new_w.sum()))
    tried = []

    def spent(a: AffineWindow) -> int:
        # the window's steps and the full steps of what it carries: the windows after it plan those, and their
        # caps (epoch/step_budget.py) reserved nothing for them (a walk that left 9,352 of 20,000 heavy-tailed
        # samples to carry at W = 4 took 1.18 x the epoch's fewest steps)
        if final or a.leftover.size == 0:
            return a.plan.num_steps
        return a.plan.num_steps + limits.fewest_steps(lengths[a.leftover], w, True)

    for rank in sorted({0, w // 4, w // 2, (3 * w) // 4, w - 1}):
        aw = _plan_window(lengths, weights, pooled, carry_holder, new_w, shares, constraint, shuffle, final,
                          drop_last, seed, bucket_width, groups, rank, max_steps)
        if max_steps is None or (rank == 0 and spent(aw) <= max_steps):
            return aw  # the balanced walk, when it is within the cap
        tried.append(aw)
    within = [a for a in tried if spent(a) <= max_steps]
    if not within:
        # the same cut planned across ranks, within the cap (each rank still streams its own piece)
        aw = min(tried, key=lambda a: a.plan.num_steps)
        plan = _cross_rank(lengths, limits, w, shuffle, drop_last if final else True, seed, bucket_width, max_steps,
                           carry=not final)
        return dataclasses.replace(aw, plan=plan, leftover=plan.leftover)
    # of the walks within the cap, the shortest planned epoch under the cost plus the default per-step term, with
    # what each carries priced too (else the walk that plans least here looks cheapest: one carried 15,884 of a
    # window's 20,000 samples, which the next rank's memory holds until then)
    c0 = constraint.default_step_cost(lengths)
    return min(within, key=lambda a: _epoch(a.plan, lengths, constraint, c0) + _carried(a, lengths, constraint, c0))


def _cross_rank(lengths: np.ndarray, limits: BatchLimits, world_size: int, shuffle: bool, drop_last: bool, seed: int,
                bucket_width: float, step_cap: int | None, carry: bool = False) -> Plan:
    """``lengths`` ((n,) int64) planned across ranks by ``CROSS_RANK_PLANNER``
    (epoch 0 of ``seed``), under the same batch rule with that planner's own
    step bound, or within ``step_cap`` when given (``BatchLimits.bind``);
    ``carry``: its leftover goes on to the next window (not the epoch's last)."""
    cross = get_planner(CROSS_RANK_PLANNER)
    rule = dataclasses.replace(limits, max_steps=None, step_slack=cross.step_slack)
    return cross.run(lengths, rule.bind(lengths, world_size, step_cap, carry), world_size, shuffle, drop_last, seed, 0,
                     {"bucket_width": bucket_width})


def _carried(a: AffineWindow, lengths: np.ndarray, constraint: BatchConstraint, c0: float) -> float:
    """What a window's leftover will cost the windows after it, at the least: its samples' costs spread evenly
    over the W ranks and c0 for each full step they make (``_epoch``'s units)."""
    left = lengths[a.leftover]
    if left.shape[0] == 0:
        return 0.0
    w = constraint.world_size
    if constraint.pack:
        each = constraint.cost.packed_cost(left, np.arange(left.shape[0] + 1, dtype=np.int64))
    else:
        each = constraint.cost.batch_cost(np.ones_like(left), left)
    return float(np.sum(each, dtype=np.float64)) / w + c0 * constraint.limits.fewest_steps(left, w, True)


def _epoch(plan: Plan, lengths: np.ndarray, constraint: BatchConstraint, c0: float) -> float:
    """The planned epoch: sum over steps of c0 + the costliest batch (packed: its samples' costs summed)."""
    if constraint.pack:
        return packed_epoch_time(plan, lengths, constraint.cost, c0)
    return epoch_time(plan, lengths, constraint.cost, c0)


def _plan_window(lengths: np.ndarray, weights: np.ndarray, pooled: np.ndarray, carry_holder: np.ndarray,
                 new_w: np.ndarray, shares: np.ndarray, constraint: BatchConstraint, shuffle: bool, final: bool,
                 drop_last: bool, seed: int, bucket_width: float, groups: np.ndarray | None, target_rank: int,
                 max_steps: int | None) -> AffineWindow:
    """Steps 1-6 of the module docstring for one window (``plan_affine_window``'s checked values, its
    constraint bound to the window's lengths), the walk aiming at ``target_rank``."""
    n = lengths.shape[0]
    w = constraint.world_size
    limits = constraint.limits
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % _U64, 0xAFF])))
    tags = rng.integers(0, 1 << 62, size=n) if shuffle else np.arange(n)
    best = None
    for _ in range(RECUTS + 1 if final else 1):
        if groups is None:
            cuts = cut_points(new_w, shares)
            new_holder = np.repeat(np.arange(w, dtype=np.int64), np.diff(cuts))
        else:  # mixed sources: each source's part cut into W pieces
            cuts, new_holder = group_cuts(new_w, shares, groups)
        holder = np.concatenate([carry_holder.astype(np.int64), new_holder])
        walker = np.where(pooled, w, holder)  # pooled samples sort after every rank's segment
        order = np.lexsort((tags, lengths, walker)).astype(np.int64)
        starts = np.searchsorted(walker[order], np.arange(w + 1)).astype(np.int64)
        samples, counts, rest = _walk(lengths, order, starts, constraint, target_rank)
        if best is None or rest.size < best[-1].size:
            best = (cuts, holder, order, starts, samples, counts, rest)
        if rest.size == 0:
            break
        left = np.bincount(holder[rest], weights=weights[rest], minlength=w)
        shares = np.maximum(shares - ((left - left.mean()) / 2).astype(np.int64), 0)
    cuts, holder, order, starts, samples, counts, rest = best
    pool = order[starts[w]:]
    padded = 0
    if final:
        pool = np.concatenate([pool, rest])
        rest = rest[:0]
    if pool.size:
        # Pooled outliers (and, in the epoch's final window, the walk's tail of a
        # few samples per rank) are planned across ranks, as in sample mode: a
        # sample given to a rank other than its holder costs that rank one
        # ranged read, instead of a lopsided step or steps of padding.
        pool_len = lengths[pool]
        x_drop = drop_last or not final
        # what the window's cap leaves after the walk (raised to the pool's fewest where below: ``step_cap``)
        x_cap = None if max_steps is None else max_steps - counts.shape[0]
        extra = _cross_rank(pool_len, limits, w, shuffle, x_drop, int(rng.integers(0, 1 << 62)), bucket_width, x_cap,
                            carry=not final)
        x_samples, x_counts = to_holders(pool[extra.samples], np.diff(extra.offsets).reshape(-1, w), holder)
        if not constraint.pack:  # (its swaps keep each batch's longest, not its sum of lengths)
            x_samples = swap_to_holders(x_samples, x_counts, holder, lengths)
        x_samples = relax_to_holders(x_samples, x_counts, holder, lengths, constraint.cost, limits.max_batch_tokens,
                                     constraint.max_cost, RELAX_TOL, constraint.pack,
                                     constraint.token_table if constraint.pack else constraint.size_table)
        samples = np.concatenate([samples, x_samples])
        counts = np.concatenate([counts, x_counts])
        padded = extra.num_padded
        rest = np.concatenate([rest, pool[extra.leftover]])
    steps = counts.shape[0]
    step_order = rng.permutation(steps).astype(np.int64) if shuffle else np.arange(steps, dtype=np.int64)
    plan = assemble(samples, counts, step_order, w, padded, rest)
    return AffineWindow(plan, holder, cuts, rest)


def _walk(lengths: np.ndarray, order: np.ndarray, starts: np.ndarray, constraint: BatchConstraint,
          target_rank: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 3, the walk of every rank's own samples at one pace.

    order: (n,) int64 window indices, each rank's segment
    ``starts[r]:starts[r + 1]`` ascending by length (the pooled ones after
    ``starts[W]``); target_rank: ``walk.affine_steps``'. Returns (samples
    grouped by (step, rank), (k, W) int64 batch sizes, rest: the samples
    the walk left, rank by rank)."""
    from .walk import affine_steps, packed_affine_steps  # lazy for start-up: no numba before the first plan

    w = starts.shape[0] - 1
    slen = lengths[order]
    walk = packed_affine_steps if constraint.pack else affine_steps
    table = constraint.token_table if constraint.pack else constraint.size_table
    counts, k, pos = walk(slen, starts, constraint.max_tokens, constraint.max_size, *constraint.coefficients,
                          constraint.max_cost, target_rank, table)
    counts = counts[:k]
    rest = order[np.concatenate([np.arange(pos[r], starts[r + 1]) for r in range(w)]).astype(np.int64)]
    # rank r's batches are consecutive slices of its segment of ``order``
    begin = starts[:w] + np.cumsum(counts, axis=0) - counts
    flat = counts.ravel()
    samples = order[np.repeat(begin.ravel() - (np.cumsum(flat) - flat), flat) + np.arange(int(flat.sum()))]
    return samples, counts, rest


def group_cuts(weights: np.ndarray, levels: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((G, W + 1) int64 cuts, (m,) int64 rank of each sample): each group
    ``groups[g]:groups[g + 1]`` of ``weights`` (m,) int64 cut into W pieces
    whose shares are ``levels`` (W,) int64 scaled to the group's weight
    (integer arithmetic, so every machine cuts alike)."""
    w = levels.shape[0]
    total = max(int(levels.sum()), 1)
    cuts = np.zeros((groups.shape[0] - 1, w + 1), dtype=np.int64)
    rank = np.zeros(weights.shape[0], dtype=np.int64)
    for g in range(groups.shape[0] - 1):
        a, b = int(groups[g]), int(groups[g + 1])
        part = weights[a:b]
        weight = int(part.sum())  # Python ints: level x weight overflows int64 on large windows
        shares = np.array([int(x) * weight // total for x in levels.tolist()], dtype=np.int64)
        cuts[g] = cut_points(part, shares) + a
        rank[a:b] = np.repeat(np.arange(w, dtype=np.int64), np.diff(cuts[g]))
    return cuts, rank


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


def warm_up(limits: BatchLimits, world_size: int, bucket_width: float = DEFAULT_BUCKET_WIDTH) -> None:
    """Load the compiled kernels (a tiny window with a pooled outlier), so
    DataLoader workers forked later inherit them."""
    w = world_size
    lengths = np.ones(2 * w + 1, dtype=np.int64)
    lengths[-1] = limits.max_batch_tokens
    none = np.zeros(0, dtype=np.int64)
    # without a limit curve: the kernels take its table with the same types either way, and the synthetic
    # outlier (one budget long) would reach past the curve
    plan_affine_window(none, none, lengths, dataclasses.replace(limits, limit=None), w, True, True, False, 0,
                       bucket_width)


def plan_shard_affine(lengths: np.ndarray, constraint: BatchConstraint, world_size: int, shuffle: bool,
                      drop_last: bool, seed: int, epoch: int, bucket_width: float = DEFAULT_BUCKET_WIDTH) -> Plan:
    """The shard-affine walk as a planner of its own: ``lengths`` in their
    given (streaming) order are one final window with nothing carried in,
    cut into W contiguous pieces, rank r training piece r (plus the pooled
    outliers and the walk's tail, planned across ranks). Streaming's shard
    read mode calls ``plan_affine_window`` window by window instead, with the
    samples each window carries in and who holds them.

    lengths: (N,) int64 >= 0; constraint: the batch rule bound to them, its
    ``step_limit`` the window's cap (``STEP_SLACK``: 1.10 x the fewest + 1).
    The window's seed is drawn from (seed, epoch)."""
    none = np.zeros(0, dtype=np.int64)
    if lengths.shape[0] == 0:  # nothing to cut
        return assemble(none, np.zeros((0, world_size), dtype=np.int64), none, world_size, fewest_steps=0)
    if drop_last and not constraint.carry:
        # an epoch's own drop_last: as little left out as the step limit allows, rotated (planners/tail.py)
        key = int(np.random.SeedSequence([seed % _U64, 0x7A11]).generate_state(1, np.uint64)[0])
        return epoch_drop_last(lengths, constraint, lambda drop, cap: plan_shard_affine(
            lengths, dataclasses.replace(constraint, carry=True, step_cap=cap), world_size, shuffle, drop, seed, epoch,
            bucket_width), (key, epoch) if shuffle else None)
    bound = constraint.step_bound(lengths, drop_last)
    cap = constraint.step_limit(bound.steps)
    window_seed = int(np.random.SeedSequence([seed % _U64, epoch, 0x5A]).generate_state(1, np.uint64)[0])
    plan = plan_affine_window(none, none, lengths, constraint.limits, world_size, shuffle, True, drop_last,
                              window_seed, bucket_width, max_steps=cap).plan
    return dataclasses.replace(plan, fewest_steps=bound.steps, fewest_exact=bound.exact)


# The shard-affine planner's step bound: 1.10 x the fewest + 1, not the others' 1.05. Every rank trains only the
# samples it streamed, cut into batches of its own: where a rank's lengths do not fill its last batch of a stretch,
# that batch is under-filled, up to a batch per rank per window (many steps' worth where windows hold few steps).
# The walk takes fuller batches (a raised target) to stay within the bound, and only past it is a window planned
# across ranks, each sample a rank trains without having streamed it costing one ranged read: the wider slack keeps
# the reads shard-affine for the windows that need a few steps more (measured, bench/steps.py).
STEP_SLACK = 10

PLANNER = Planner(
    "shard_affine", plan_shard_affine, options=(BUCKET_WIDTH, COST, MAX_STEP_COST, PACK, MAX_STEPS, LIMIT),
    costs=COST_KINDS,
    summary="each rank trains a contiguous piece of the samples in their order (streaming's shard read mode)",
    takes_constraint=True, kernels="streambatch.planners.shard_affine.walk", step_slack=STEP_SLACK,
)
