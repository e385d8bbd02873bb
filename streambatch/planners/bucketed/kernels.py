"""Numba kernels of the bucketed planner: bucket sort with a seeded shuffle
inside each bucket (``sort.py``), then step-by-step layout of the sorted
samples (``plan_steps`` here; the candidate layouts in ``layouts.py``, the
outlier head in ``head.py``).

Arrays and integer scalars in, arrays out; inputs are validated by the plan
layer (``plan.py``). Costs and randomness: ``common.py``.
"""

from __future__ import annotations

import numpy as np

from .common import _I64_MAX, _below, _cost, _grow, _mix, _new, _zeros, batch_cost, njit
from .head import _head_batches, _write_head
from .layouts import (
    _contiguous,
    _deal_rank,
    _deal_size,
    _deal_stats,
    _finish_split,
    _waste_rate,
    _write_contiguous,
    _write_deal,
)
from .sort import _TAGS, bucket_sort, table_size

__all__ = ["_TAGS", "batch_cost", "bucket_sort", "deal_rank", "plan_steps", "step_permutation", "table_size"]

_SETTLED = 0.995  # a greedy step this balanced is taken without trying other layouts


@njit(cache=True)
def plan_steps(order, slen, w, max_tokens, max_size, code, q, max_cost, descending, finish, drop_last, shuffle,
               key, first_step, out):
    """Lay bucket-sorted samples out as global steps of W batches.

    order, slen: (n,) sample indices and their lengths in bucket order,
    ascending or descending. max_tokens, max_size, max_cost >= 1 (int64 max
    for no cost cap). key: uint64; step s of this call turns its batches by
    a rank offset drawn from (key, first_step + s) when shuffling. out:
    (>= n,) receives samples grouped by step, then rank.

    Each step takes the next samples in order, laid out in whichever way
    wastes the fewest tokens per real token (``_waste_rate``):
      0.   W contiguous batches, each filled until the next sample would not
           fit (padding least);
      1-2. the same with every batch held to 1/0.98 or 1/0.95 of the
           cheapest one's cost in layout 0 (balance at some budget use);
      3.   W * b samples dealt over the ranks in turn, so that every rank's
           longest is among the step's W longest (balance at some padding);
      4.   such a deal stopped while the step spans <= 1 + 1/_NARROW in
           length (narrow but under-filled: for sparse lengths and gaps).
    Layouts that run out of data before a limit closes the step do not count.

    With ``finish`` False the call stops, unwritten, at the first step after
    which less than another step would remain: the caller finishes those
    samples. With ``finish`` (slen ascending), that tail is dealt evenly into
    one or two final steps (``_finish_split``); with ``drop_last`` instead,
    what cannot complete a step is left out.

    Returns (counts, n_steps, n_out, stop): counts[:n_steps * W] (int64) are
    the batch sizes, step-major; order[stop:] was not planned; the final step
    has empty ranks (for the caller to pad) only when fewer than W samples
    remained.
    """
    n = slen.shape[0]
    cost_limited = max_cost < _I64_MAX
    counts = _zeros((n // (w * 16) + 4) * w)
    # Scratch: sizes and longest sample of candidate layout c in
    # sizes[c * W:(c + 1) * W], maxes[...]; where each candidate ends.
    work = _new(11 * w + 5)
    sizes = work[: 5 * w]
    maxes = work[5 * w : 10 * w]
    cur = work[10 * w : 11 * w]
    ends = work[11 * w :]
    pcts = (0, 98, 95)
    # With one rank there is nothing to balance: capped variants and deals
    # reduce to plain contiguous batches.
    n_contig = 3 if w > 1 else 1
    rot_key = _mix(key, np.uint64(0x5EED))
    # np.int64(0), not 0: a literal 0 would make Numba compile every callee
    # twice (once for Literal[int](0), once for int64).
    p = np.int64(0)
    n_out = np.int64(0)
    step = np.int64(0)
    while p < n:
        if (step + 2) * w > counts.shape[0]:
            counts = _grow(counts, step * w, 2 * counts.shape[0])
        rot = _below(rot_key, first_step + step, w) if shuffle else 0
        left = n - p
        if left < w:
            if drop_last or not finish:
                break
            for j in range(left):  # one sample on each of the first ranks
                out[n_out + j] = order[p + j]
                counts[step * w + j] = 1
            n_out += left
            p = n
            step += 1
            break
        # The layout wasting the least (the first of equals), and its rate:
        # inf when no layout completes a step.
        best = 0
        best_rate = np.inf
        cheapest = _I64_MAX
        settled = False
        for c in range(n_contig):
            limit = max_cost
            if c > 0:  # hold every batch to 1/0.98 or 1/0.95 of the cheapest greedy one
                if settled or cheapest == 0 or cheapest == _I64_MAX:
                    break
                held = cheapest + cheapest // pcts[c] * (100 - pcts[c])
                limit = held if held < max_cost else max_cost
            sz = sizes[c * w : (c + 1) * w]
            mx = maxes[c * w : (c + 1) * w]
            end, complete, real = _contiguous(slen, p, w, max_tokens, max_size, code, q, limit, sz, mx)
            ends[c] = end
            if complete:
                rate, balance = _waste_rate(sz, mx, real, w, max_tokens, max_size, code, q, max_cost, cost_limited)
                if rate < best_rate:
                    best_rate = rate
                    best = c
                if c == 0:
                    # Balanced already: nothing else can do much better; skip the rest.
                    settled = balance >= _SETTLED
                    for r in range(w):
                        cr = _cost(code, q, sizes[r], maxes[r])
                        cheapest = cr if cr < cheapest else cheapest
        if descending and w > 1 and best_rate < np.inf:  # layout 0 completed
            # An outlier at the head of the step: the longest sample alone
            # costs as much as the cheapest full batch, so it sets the step's
            # time whatever the layout. Hold every batch to that lone cost:
            # nothing costs more than the step must, and the step still
            # takes the longest samples that fit under it.
            lone = _cost(code, q, np.int64(1), np.int64(slen[p]))
            top = np.int64(0)
            for r in range(w):
                cr = _cost(code, q, sizes[r], maxes[r])
                top = cr if cr > top else top
            if cheapest <= lone < top:
                hsize, hcost, k, stop = _head_batches(slen, p, w, max_tokens, max_size, code, q,
                                                      lone if lone < max_cost else max_cost)
                if k > 0:
                    if (step + k // w + 2) * w > counts.shape[0]:
                        counts = _grow(counts, step * w, (step + k // w + 2) * w)
                    n_out, step = _write_head(order, p, hsize, hcost, k, w, shuffle, rot_key, first_step, out,
                                              n_out, counts, step)
                    p = stop
                    continue
        b = np.int64(0)
        if not settled:
            b, b_narrow, complete = _deal_size(slen, p, w, max_tokens, max_size, code, q, max_cost)
        if w > 1 and not settled:
            for c, bc in ((3, b), (4, b_narrow)):
                if bc > 0 and (complete or bc < b):
                    ends[c] = p + w * bc
                    sz = sizes[c * w : (c + 1) * w]
                    mx = maxes[c * w : (c + 1) * w]
                    real = _deal_stats(slen, p, ends[c], w, sz, mx)
                    rate = _waste_rate(sz, mx, real, w, max_tokens, max_size, code, q, max_cost, cost_limited)[0]
                    if rate < best_rate:
                        best_rate = rate
                        best = c
        # How far a full step reaches (to the end of the data when a full
        # layout ran out first): once less than that would remain after this
        # step, the rest is finished as a whole.
        reach = ends[0]
        if b > 0:
            deal_end = p + w * b if complete else n
            reach = deal_end if deal_end > reach else reach
        near_end = best_rate == np.inf or n - ends[best] < reach - p
        if near_end and not finish:
            break  # leave the end to the caller
        if near_end and not drop_last:
            h = _finish_split(slen, p, w, max_tokens, max_size, code, q, max_cost, cost_limited,
                              sizes[:w], maxes[:w])
            if h > 0:
                n_out = _write_deal(order, p, p + h, w, rot, out, n_out, counts[step * w : (step + 1) * w], cur)
                step += 1
                if h < left:
                    rot = _below(rot_key, first_step + step, w) if shuffle else 0
                    n_out = _write_deal(order, p + h, n, w, rot, out, n_out, counts[step * w : (step + 1) * w],
                                        cur)
                    step += 1
                p = n
                break
        if best_rate == np.inf:
            if drop_last:
                break
            best = 3  # nothing completes a step nor fits in two: deal what fits, then go on
            ends[3] = p + w * b
        row = counts[step * w : (step + 1) * w]
        if best >= 3:
            n_out = _write_deal(order, p, ends[best], w, rot, out, n_out, row, cur)
            p = ends[best]
        else:
            n_out, p = _write_contiguous(order, p, sizes[best * w : (best + 1) * w], w, rot, out, n_out, row, cur)
        step += 1
    return counts, step, n_out, p


@njit(cache=True)
def step_permutation(n_steps, key):
    """(n_steps,) int64 Fisher-Yates permutation drawn from ``key``."""
    perm = _new(n_steps)
    for i in range(n_steps):
        perm[i] = i
    for i in range(n_steps - 1, 0, -1):
        j = _below(key, i, i + 1)
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t
    return perm


@njit(cache=True)
def deal_rank(t, m, w):
    """``_deal_rank`` callable from Python (tests)."""
    return _deal_rank(np.int64(t), np.int64(m), np.int64(w))
