"""Numba kernels of the shard-affine planner (``planner.py``): the walk of every rank's own samples at one pace.

Arrays and integer scalars in, arrays out; the plan layer validates inputs.
Batch costs are the toolkit's one integer cost, ``_cost(ca, cb, count, L)``
with ``(ca, cb) = CostModel.coefficients`` (``scale * cost``).
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _cost, _over


@njit(cache=True)
def _fits(count, longest, max_tokens, max_size, max_cost, ca, cb, tab):
    """Within the size cap, budget, cost cap and the limit curve ``tab``
    (``BatchConstraint.size_table``, or (0,): none)."""
    return (count <= max_size and count * longest <= max_tokens and _cost(ca, cb, count, longest) <= max_cost
            and not _over(tab, count, longest))


@njit(cache=True)
def _packed_over(tok, slen, ttab, p, e):
    """Whether the packed batch slen[p:e] (ascending: its longest is its last)
    holds more tokens than the limit curve allows at its longest (``ttab``:
    ``BatchConstraint.token_table``, or (0,): never)."""
    return ttab.shape[0] > 0 and e - p > 1 and tok[e] - tok[p] > ttab[slen[e - 1]]


@njit(cache=True)
def affine_steps(slen, starts, max_tokens, max_size, ca, cb, max_cost, target_rank, tab):
    """Cut every rank's own samples into the same number of global steps.

    slen: (n,) int64 lengths, ascending within each rank's segment
        ``starts[r]:starts[r + 1]`` (starts: (W + 1,) int64), so a batch
        taken from the front is padded to its last sample.

    Each step's target cost C is that of the cheapest full batch (the
    longest in-budget prefix) any rank can take next. Every rank takes the
    prefix of its remaining samples (at least one, at most its full batch)
    whose cost is nearest C. So a step's batches cost about the same, a rank
    whose samples are longer at that point takes fewer of them (under-filled
    rather than costlier), and ranks holding equal cost run out together.
    Targets are per step, not cumulative: repaying last step's rounding in
    the next would double the per-step spread (measured: balance 0.965 vs
    0.976 at W = 64), and the drift it would prevent is a few samples.

    The walk stops when any rank has no sample left (what the others hold
    then is the caller's to carry or finish).

    target_rank (0 to W - 1): the target is the target_rank-th cheapest of
    the ranks' full batches instead of the cheapest (0): the ranks whose full
    batch costs no more take it, the others the prefix nearest it. W - 1:
    every rank takes its full batch, the fewest steps the ranks' own samples
    allow; between, fewer steps than the balanced walk at some balance, for
    a window that walk would give more steps than its cap.

    tab: (> max length,) int64 the limit curve's largest batch per padded
    length (``BatchConstraint.size_table``), or (0,): none. It is
    non-increasing, so a prefix of a batch within it is too.

    Returns (counts (k, W) int64, k, pos (W,) int64): pos[r] is where rank r
    stopped in its segment.
    """
    w = starts.shape[0] - 1
    shortest = slen.shape[0]  # every step takes >= 1 sample of every rank
    for r in range(w):
        shortest = min(shortest, starts[r + 1] - starts[r])
    counts = np.zeros((shortest, w), dtype=np.int64)
    pos = starts[:w].copy()
    full = np.empty(w, dtype=np.int64)
    fc = np.empty(w, dtype=np.int64)  # each rank's full batch's cost
    k = 0
    while True:
        done = False
        for r in range(w):
            if pos[r] == starts[r + 1]:
                done = True
        if done:
            break
        target = np.iinfo(np.int64).max
        for r in range(w):
            p = pos[r]
            e = p + 1  # the full batch: lengths ascend, so it stops at the first sample that does not fit
            while e < starts[r + 1] and _fits(e + 1 - p, slen[e], max_tokens, max_size, max_cost, ca, cb,
                                                    tab):
                e += 1
            full[r] = e
            fc[r] = _cost(ca, cb, e - p, slen[e - 1])
            target = min(target, fc[r])
        if target_rank > 0:
            target = np.sort(fc)[min(target_rank, w - 1)]
        for r in range(w):
            p = pos[r]
            aim = target
            # largest e in [p + 1, full[r]] costing <= aim, or the next one if nearer
            lo = p + 1
            hi = full[r]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if _cost(ca, cb, mid - p, slen[mid - 1]) <= aim:
                    lo = mid
                else:
                    hi = mid - 1
            e = lo
            c = _cost(ca, cb, e - p, slen[e - 1])
            if e < full[r]:
                up = _cost(ca, cb, e + 1 - p, slen[e])
                if up - aim < aim - c:
                    e += 1
                    c = up
            counts[k, r] = e - p
            pos[r] = e
        k += 1
    return counts, k, pos


@njit(cache=True)
def packed_affine_steps(slen, starts, max_tokens, max_size, ca, cb, max_cost, target_rank, ttab):
    """``affine_steps`` for packed batches: a batch's tokens are the sum of
    its lengths (no padding) and its cost the sum of its samples' costs.

    slen: (n,) int64 lengths, ascending within each rank's segment
        ``starts[r]:starts[r + 1]`` (starts: (W + 1,) int64).

    The same walk: each step's target C is the cost of the cheapest full
    batch (the longest prefix of its remaining samples within the budget,
    size cap and cost cap) any rank can take next, and every rank takes the
    prefix whose cost is nearest C (at least one sample, at most its full
    batch). Prefixes, not batches taken from both ends of a rank's samples
    (long ones down, short ones up to tune the cost): those balanced better
    (0.993 vs 0.987 on a log-normal window of 24,000 samples, budget
    16,000, W = 8) but left the middle lengths, about a batch per rank, to
    carry or to plan across ranks in the final window (1,715 samples vs 9;
    342 ranged reads vs 7), where prefixes leave the few longest. The walk
    stops when any rank has no sample left. target_rank: as ``affine_steps``.
    ttab: (> max length,) int64 the limit curve as tokens per longest length
    (``BatchConstraint.token_table``), or (0,): none. Whether a prefix keeps
    within it need not grow or shrink with the prefix (a longer last sample
    moves the limit), so the chosen prefix is shortened until it does (one
    sample always does).

    Returns (counts (k, W) int64, k, pos (W,) int64) as ``affine_steps``.
    """
    n = slen.shape[0]
    w = starts.shape[0] - 1
    tok = np.zeros(n + 1, dtype=np.int64)  # prefix sums: a batch slen[p:e] has tok[e] - tok[p] tokens
    cst = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        tok[i + 1] = tok[i] + slen[i]
        cst[i + 1] = cst[i] + _cost(ca, cb, 1, slen[i])
    shortest = n
    for r in range(w):
        shortest = min(shortest, starts[r + 1] - starts[r])
    counts = np.zeros((shortest, w), dtype=np.int64)
    pos = starts[:w].copy()
    full = np.empty(w, dtype=np.int64)
    fc = np.empty(w, dtype=np.int64)  # each rank's full batch's cost
    k = 0
    while True:
        done = False
        for r in range(w):
            if pos[r] == starts[r + 1]:
                done = True
        if done:
            break
        target = np.iinfo(np.int64).max
        for r in range(w):
            p = pos[r]
            # the full batch: the largest e in [p + 1, end] within every limit (prefix sums only grow)
            lo = p + 1
            hi = min(starts[r + 1], p + max_size)
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if tok[mid] - tok[p] <= max_tokens and cst[mid] - cst[p] <= max_cost:
                    lo = mid
                else:
                    hi = mid - 1
            while _packed_over(tok, slen, ttab, p, lo):
                lo -= 1
            full[r] = lo
            fc[r] = cst[lo] - cst[p]
            target = min(target, fc[r])
        if target_rank > 0:
            target = np.sort(fc)[min(target_rank, w - 1)]
        for r in range(w):
            p = pos[r]
            # largest e in [p + 1, full[r]] costing <= target, or the next one if nearer
            lo = p + 1
            hi = full[r]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if cst[mid] - cst[p] <= target:
                    lo = mid
                else:
                    hi = mid - 1
            e = lo
            if e < full[r] and (cst[e + 1] - cst[p]) - target < target - (cst[e] - cst[p]):
                e += 1
            while _packed_over(tok, slen, ttab, p, e):
                e -= 1
            counts[k, r] = e - p
            pos[r] = e
        k += 1
    return counts, k, pos
