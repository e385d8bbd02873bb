"""Numba kernels of the bucketed planner: bucket sort with a seeded shuffle
inside each bucket (``sort.py``), then step-by-step layout of the sorted
samples (``plan_steps`` here; the candidate layouts in ``layouts.py``, the
outlier head in ``head.py``).

Arrays and integer scalars in, arrays out; inputs are validated by the plan
layer (``plan.py``). Costs and randomness: ``common.py``.
"""

from __future__ import annotations

import numpy as np

from ...core.hashing import _mix
from .common import _below, batch_cost, njit
from .head import _grow_rows, _head_batches, _write_head
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
from .sort import _TAGS, bucket_sort

__all__ = ["_TAGS", "_deal_rank", "batch_cost", "bucket_sort", "plan_steps", "step_permutation"]

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

    Returns (counts, n_steps, n_out, stop): counts[:n_steps] (int64, W wide) are
    the batch sizes; order[stop:] was not
    planned; the final step has empty ranks (for the caller to pad) only when
    fewer than W samples remained.
    """
    n = slen.shape[0]
    cost_limited = max_cost < np.iinfo(np.int64).max
    counts = np.zeros((max(4, n // (w * 16) + 4), w), dtype=np.int64)
    sizes = np.empty((5, w), dtype=np.int64)
    maxes = np.empty((5, w), dtype=np.int64)
    cur = np.empty(w, dtype=np.int64)
    ends = np.zeros(5, dtype=np.int64)
    rates = np.empty(5)
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
        if step + 2 > counts.shape[0]:
            counts = _grow_rows(counts, step, 2 * counts.shape[0])
        rot = _below(rot_key, first_step + step, w) if shuffle else 0
        left = n - p
        if left < w:
            if drop_last or not finish:
                break
            for j in range(left):  # one sample on each of the first ranks
                out[n_out + j] = order[p + j]
                counts[step, j] = 1
            n_out += left
            p = n
            step += 1
            break
        for c in range(rates.shape[0]):
            rates[c] = np.inf
        cheapest = np.iinfo(np.int64).max
        settled = False
        for c in range(n_contig):
            limit = max_cost
            if c > 0:  # hold every batch to 1/0.98 or 1/0.95 of the cheapest greedy one
                if settled or cheapest == 0 or cheapest == np.iinfo(np.int64).max:
                    break
                limit = min(max_cost, cheapest + cheapest // pcts[c] * (100 - pcts[c]))
            end, complete, real = _contiguous(slen, p, w, max_tokens, max_size, code, q, limit, sizes[c], maxes[c])
            ends[c] = end
            if complete:
                rates[c], balance = _waste_rate(sizes[c], maxes[c], real, w, max_tokens, max_size, code, q,
                                                max_cost, cost_limited)
                if c == 0:
                    # Balanced already: nothing else can do much better; skip the rest.
                    settled = balance >= _SETTLED
                    for r in range(w):
                        cheapest = min(cheapest, batch_cost(code, q, sizes[0, r], maxes[0, r]))
        if descending and w > 1 and rates[0] < np.inf:
            # An outlier at the head of the step: the longest sample alone
            # costs as much as the cheapest full batch, so it sets the step's
            # time whatever the layout. Hold every batch to that lone cost:
            # nothing costs more than the step must, and the step still
            # takes the longest samples that fit under it.
            lone = batch_cost(code, q, 1, np.int64(slen[p]))
            top = np.int64(0)
            for r in range(w):
                top = max(top, batch_cost(code, q, sizes[0, r], maxes[0, r]))
            if cheapest <= lone < top:
                hsize, hcost, k, stop = _head_batches(slen, p, w, max_tokens, max_size, code, q,
                                                      min(max_cost, lone))
                if k > 0:
                    if step + k // w + 2 > counts.shape[0]:
                        counts = _grow_rows(counts, step, step + k // w + 2)
                    n_out, step = _write_head(order, p, hsize, hcost, k, w, shuffle, rot_key, first_step, out,
                                              n_out, counts, step)
                    p = stop
                    continue
        b = 0
        if not settled:
            b, b_narrow, complete = _deal_size(slen, p, w, max_tokens, max_size, code, q, max_cost)
        if w > 1 and not settled:
            for c, bc in ((3, b), (4, b_narrow)):
                if bc > 0 and (complete or bc < b):
                    ends[c] = p + w * bc
                    real = _deal_stats(slen, p, ends[c], w, sizes[c], maxes[c])
                    rates[c] = _waste_rate(sizes[c], maxes[c], real, w, max_tokens, max_size, code, q, max_cost,
                                           cost_limited)[0]
        best = np.argmin(rates)
        # How far a full step reaches (to the end of the data when a full
        # layout ran out first): once less than that would remain after this
        # step, the rest is finished as a whole.
        reach = ends[0] if b == 0 else max(ends[0], p + w * b if complete else n)
        near_end = rates[best] == np.inf or n - ends[best] < reach - p
        if near_end and not finish:
            break  # leave the end to the caller
        if near_end and not drop_last:
            h = _finish_split(slen, p, w, max_tokens, max_size, code, q, max_cost, cost_limited,
                              sizes[0], maxes[0])
            if h > 0:
                n_out = _write_deal(order, p, p + h, w, rot, out, n_out, counts[step], cur)
                step += 1
                if h < left:
                    rot = _below(rot_key, first_step + step, w) if shuffle else 0
                    n_out = _write_deal(order, p + h, n, w, rot, out, n_out, counts[step], cur)
                    step += 1
                p = n
                break
        if rates[best] == np.inf:
            if drop_last:
                break
            best = 3  # nothing completes a step nor fits in two: deal what fits, then go on
            ends[3] = p + w * b
        if best >= 3:
            n_out = _write_deal(order, p, ends[best], w, rot, out, n_out, counts[step], cur)
            p = ends[best]
        else:
            n_out, p = _write_contiguous(order, p, sizes[best], w, rot, out, n_out, counts[step], cur)
        step += 1
    return counts, step, n_out, p


@njit(cache=True)
def step_permutation(n_steps, key):
    """(n_steps,) int64 Fisher-Yates permutation drawn from ``key``."""
    perm = np.arange(n_steps)
    for i in range(n_steps - 1, 0, -1):
        j = _below(key, i, i + 1)
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t
    return perm
