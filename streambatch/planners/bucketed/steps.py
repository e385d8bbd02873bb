"""Numba kernels of the bucketed planner: bucket sort with a seeded shuffle
inside each bucket (``sort.py``), then step-by-step layout of the sorted
samples (``plan_steps`` here; the candidate layouts in ``layouts.py``, the
head of long samples in ``head.py``).

Arrays and integer scalars in, arrays out; inputs are validated by the plan
layer (``planner.py``). Costs, randomness and the step shuffle: ``planners/toolkit.py``.
"""

from __future__ import annotations

import numpy as np

from ..toolkit import _I64_MAX, _below, _cost, _grow, _mix, _new, _over, _zeros, njit
from .head import LONG, POOL, _head_pool, _take_head
from .layouts import (
    _contiguous,
    _deal_rank,
    _deal_size,
    _deal_stats,
    _finish_split,
    _sparse_cap,
    _time_rate,
    _waste_rate,
    _write_contiguous,
    _write_deal,
)
from .sort import _TAGS, bucket_sort, table_size

__all__ = ["_TAGS", "bucket_sort", "deal_rank", "fill_sizes", "head_step", "mix_batches", "plan_steps", "sparse_layout",
           "table_size"]

_SETTLED = 0.995  # a greedy step this balanced is taken without trying other layouts
_SPARSE = 0.9  # a descending step less balanced than this spans sparse long samples


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def plan_steps(order, slen, w, max_tokens, max_size, tab, ca, cb, max_cost, head_min, descending, finish, drop_last,
               shuffle, key, first_step, out):
    """Lay bucket-sorted samples out as global steps of W batches.

    order, slen: (n,) sample indices and their lengths in bucket order,
    ascending or descending (the head reorders a few of them in place).
    max_tokens, max_size, max_cost >= 1 (int64 max for no cost cap). tab:
    (> max length,) int64 the limit curve's largest batch per padded length
    (``BatchConstraint.size_table``), or (0,): none. ca,
    cb: the cost model's ``CostModel.coefficients``. head_min: after an
    outlier's head step, keep laying long samples of at least this length
    out as head steps (int64; its max for none: those steps hold batches
    held to one long sample's cost, so the same samples can take several
    times the steps, and the plan layer lowers the reach of the head only as
    far as its step limit allows). key: uint64; step s of
    this call turns its batches by a rank offset drawn from (key,
    first_step + s) when shuffling. out: (>= n,) receives samples grouped by
    step, then rank.

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
    Descending, two more (step time first, budget use second):
      head: when the longest sample alone costs as much as the cheapest
           batch of layout 0 (an outlier), and after that while samples
           stay long, the W costliest of a pool of batches each held to
           that lone cost (``head.py``);
      5.   when even the chosen layout leaves ranks idle (balance under
           _SPARSE) on long samples, the cost limit with the least step
           time per unit of work (``_sparse_cap``).

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
    # Helpers get an offset (c * W) into these, never a slice (see
    # ``planners/toolkit.py``).
    sizes = _new(7 * w)
    maxes = _new(7 * w)
    cur = _new(w)
    pool_sizes = _new(POOL * w)
    pool_costs = _new(POOL * w)
    ends = _new(np.int64(6))
    # With one rank there is nothing to balance: capped variants and deals
    # reduce to plain contiguous batches.
    n_contig = 3 if w > 1 else 1
    rot_key = _mix(key, np.uint64(0x5EED))
    # np.int64(0), not 0: a literal 0 would make Numba compile every callee
    # twice (once for Literal[int](0), once for int64).
    p = np.int64(0)
    n_out = np.int64(0)
    step = np.int64(0)
    in_head = False  # the last step was a head step
    rest = False  # this step is the second of the two final steps: the rest, dealt
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
        # The layout to write: best (slot of sizes/maxes; 3 and 4 are deals
        # of slen[p:ends[best]]), the one wasting the least (the first of
        # equals), and its rate: inf when no layout completes a step.
        best = 3
        ends[3] = n
        best_rate = 0.0
        if not rest:
            best = 0
            best_rate = np.inf
            best_balance = 1.0
            cheapest = _I64_MAX
            settled = False
            for c in range(n_contig):
                limit = max_cost
                if c > 0:  # hold every batch to 1/0.98 or 1/0.95 of the cheapest greedy one
                    if settled or cheapest == 0 or cheapest == _I64_MAX:
                        break
                    pct = 98 if c == 1 else 95
                    held = cheapest + cheapest // pct * (100 - pct)
                    limit = held if held < max_cost else max_cost
                end, complete, real = _contiguous(slen, p, w, max_tokens, max_size, tab, ca, cb, limit, sizes, maxes,
                                                  c * w)
                ends[c] = end
                if complete:
                    rate, balance = _waste_rate(sizes, maxes, c * w, real, w, max_tokens, max_size, ca, cb, max_cost,
                                                cost_limited)
                    if rate < best_rate:
                        best_rate = rate
                        best_balance = balance
                        best = c
                    if c == 0:
                        # Balanced already: nothing else can do much better; skip the rest.
                        settled = balance >= _SETTLED
                        for r in range(w):
                            cr = _cost(ca, cb, sizes[r], maxes[r])
                            cheapest = cr if cr < cheapest else cheapest
            lone = np.int64(0)
            top = np.int64(0)
            head = False
            if descending and w > 1 and best_rate < np.inf:  # layout 0 completed
                lone = _cost(ca, cb, np.int64(1), np.int64(slen[p]))
                for r in range(w):
                    cr = _cost(ca, cb, sizes[r], maxes[r])
                    top = cr if cr > top else top
                # The head (``head.py``): an outlier (the longest sample alone
                # costs as much as the cheapest full batch: it sets the step's
                # time whatever the layout), or, after a head step, long
                # samples (fewer than LONG fit the budget) while they last.
                outlier = cheapest <= lone < top
                if outlier or (in_head and np.int64(slen[p]) >= head_min and max_tokens < LONG * np.int64(slen[p])):
                    k = _head_pool(slen, p, w, max_tokens, max_size, tab, ca, cb, lone if lone < max_cost else max_cost,
                                   not outlier, pool_sizes, pool_costs)
                    if k > 0:
                        _take_head(order, slen, p, w, pool_sizes, pool_costs, k, sizes)
                        best = 0
                        head = True
            in_head = head
            if not head:
                b = np.int64(0)
                if not settled:
                    b, b_narrow, complete = _deal_size(slen, p, w, max_tokens, max_size, tab, ca, cb, max_cost)
                if w > 1 and not settled:
                    for c in range(3, 5):
                        bc = b if c == 3 else b_narrow
                        if bc > 0 and (complete or bc < b):
                            ends[c] = p + w * bc
                            real = _deal_stats(slen, p, ends[c], w, sizes, maxes, c * w)
                            rate, balance = _waste_rate(sizes, maxes, c * w, real, w, max_tokens, max_size, ca, cb,
                                                        max_cost, cost_limited)
                            if rate < best_rate:
                                best_rate = rate
                                best_balance = balance
                                best = c
                if top > 0 and best_balance < _SPARSE and max_tokens < LONG * np.int64(slen[p]):
                    # Sparse long samples (descending): even the best layout
                    # leaves ranks idle. Judge cost limits by step time per
                    # unit of work alone, not budget use (slot 5), if a full
                    # step would remain after it (a smaller step here would
                    # leave more to the final steps, dealt over wider lengths).
                    end = _sparse_cap(slen, p, w, max_tokens, max_size, tab, ca, cb,
                                      top if top < max_cost else max_cost, lone,
                                      _time_rate(slen, p, ends[best], sizes, maxes, best * w, w, ca, cb),
                                      sizes, maxes, 5 * w)
                    if end >= 0 and n - end >= ends[0] - p:
                        best = 5
                        ends[5] = end
                # How far a full step reaches (to the end of the data when a
                # full layout ran out first): once less than that would remain
                # after this step, the rest is finished as a whole.
                reach = ends[0]
                if b > 0:
                    deal_end = p + w * b if complete else n
                    reach = deal_end if deal_end > reach else reach
                near_end = best_rate == np.inf or n - ends[best] < reach - p
                if near_end and not finish:
                    break  # leave the end to the caller
                h = np.int64(-1)
                if near_end and not drop_last:
                    h = _finish_split(slen, p, w, max_tokens, max_size, tab, ca, cb, max_cost, cost_limited,
                                      sizes, maxes)
                if h > 0:  # one or two final steps, dealt
                    best = 3
                    ends[3] = p + h
                    rest = h < left
                elif best_rate == np.inf:
                    if drop_last:
                        break
                    best = 3  # nothing completes a step nor fits in two: deal what fits, then go on
                    ends[3] = p + w * b
        if best == 3 or best == 4:
            n_out = _write_deal(order, p, ends[best], w, rot, out, n_out, counts, step * w, cur)
            p = ends[best]
        else:
            n_out, p = _write_contiguous(order, p, sizes, best * w, w, rot, out, n_out, counts, step * w, cur)
        step += 1
    return counts, step, n_out, p


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def deal_rank(t, m, w):
    """``_deal_rank`` callable from Python (tests)."""
    return _deal_rank(np.int64(t), np.int64(m), np.int64(w))


# Python-callable wrappers of helpers, for the tests' naive twins (compiled
# only when called).


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def head_step(order, slen, p, w, max_tokens, max_size, tab, ca, cb, cap, long_only):
    """One head step from order/slen[p:] (``_head_pool``, ``_take_head``):
    ((W,) int64 sizes of the chosen batches, samples they hold), 0 samples
    when the pool is empty. order and slen are reordered in place. (ca, cb):
    ``CostModel.coefficients``, as int64."""
    sizes = _new(POOL * w)
    costs = _new(POOL * w)
    chosen = _zeros(w)
    k = _head_pool(slen, p, w, max_tokens, max_size, tab, ca, cb, cap, long_only, sizes, costs)
    used = np.int64(0)
    if k > 0:
        used = _take_head(order, slen, p, w, sizes, costs, k, chosen)
    return chosen, used


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def sparse_layout(slen, p, w, max_tokens, max_size, tab, ca, cb, top, lone, rate):
    """``_sparse_cap``: (end or -1, (W,) sizes, (W,) longest) of the chosen layout."""
    sizes = _zeros(2 * w)
    maxes = _zeros(2 * w)
    end = _sparse_cap(slen, p, w, max_tokens, max_size, tab, ca, cb, top, lone, rate, sizes, maxes, np.int64(0))
    return end, sizes[:w], maxes[:w]


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def time_rate(slen, p, end, sizes, maxes, w, ca, cb):
    """``_time_rate``."""
    return _time_rate(slen, p, end, sizes, maxes, np.int64(0), w, ca, cb)


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def fill_sizes(slen, max_tokens, max_size, tab, ca, cb, max_cost):
    """Cut slen (n,) into batches of consecutive samples, each filled until
    the next sample would break the size cap, token budget, cost cap or the
    limit curve ``tab`` ((0,): none)
    (count x the running longest; a lone sample over them is a batch of
    its own). Sorted longest first, this is the fill of ``core/bounds.py``:
    the fewest batches. Returns ((nb,) int64 batch sizes)."""
    n = slen.shape[0]
    sizes = _new(n)
    nb = np.int64(0)
    p = np.int64(0)
    while p < n:
        cnt = np.int64(1)
        mx = np.int64(slen[p])
        p += 1
        while p < n:
            ln = np.int64(slen[p])
            nm = ln if ln > mx else mx
            if (cnt + 1 > max_size or (cnt + 1) * nm > max_tokens or _cost(ca, cb, cnt + 1, nm) > max_cost
                    or _over(tab, cnt + 1, nm)):
                break
            cnt += 1
            mx = nm
            p += 1
        sizes[nb] = cnt
        nb += 1
    out = _new(nb)
    for i in range(nb):
        out[i] = sizes[i]
    return out


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def mix_batches(slen, starts, sizes, w, key):
    """Shuffle batch-mates inside each step, keeping every batch valid.

    slen: (n,) lengths of the plan's order; starts, sizes: (k * W,) int64
    runs of it, W batches to a step. Each batch keeps its longest sample
    (its anchor: the first longest) and its size; every other sample of the
    step goes, longest first, to a random free slot of a batch whose anchor
    is at least as long. So no batch's longest or size changes (nor its
    cost, budget or cost-cap check), while samples of neighbouring lengths
    change batch-mates from epoch to epoch. Longest first, a free slot always
    exists: the samples at least as long as any length t fill at most the
    slots of batches whose anchor is at least t, as they did before.

    key: uint64. Returns (sum(sizes),) int64 positions into slen, grouped by
    batch (anchor first), batch after batch.
    """
    nb = sizes.shape[0]
    total = np.int64(0)
    for b in range(nb):
        total += sizes[b]
    out = _new(total)
    anchor = _new(w)
    at = _new(w)
    rank = _new(w)
    counter = np.int64(0)
    acc = np.int64(0)
    for s in range(nb // w):
        m = np.int64(0)
        for j in range(w):
            b = s * w + j
            best = starts[b]
            for i in range(starts[b] + 1, starts[b] + sizes[b]):
                if slen[i] > slen[best]:
                    best = i
            anchor[j] = best
            m += sizes[b]
        rest = _new(m - w)  # the step's other samples, then their lengths (negated: argsort ascends)
        neg = _new(m - w)
        r = 0
        for j in range(w):
            b = s * w + j
            for i in range(starts[b], starts[b] + sizes[b]):
                if i != anchor[j]:
                    rest[r] = i
                    neg[r] = -np.int64(slen[i])
                    r += 1
        by_len = np.argsort(neg, kind="mergesort")
        for j in range(w):
            rank[j] = -np.int64(slen[anchor[j]])
        batch_order = np.argsort(rank, kind="mergesort")  # batches, longest anchor first
        # out: batch j of the step at [at[j], at[j] + size), anchor first
        for j in range(w):
            at[j] = acc
            out[acc] = anchor[j]
            acc += sizes[s * w + j]
        pool = _new(m - w)  # one entry per free slot of the batches eligible so far
        pool_n = np.int64(0)
        fill = _new(w)
        for j in range(w):
            fill[j] = 1
        k = 0
        for t in range(m - w):
            i = rest[by_len[t]]
            ln = np.int64(slen[i])
            while k < w and np.int64(slen[anchor[batch_order[k]]]) >= ln:
                j = batch_order[k]
                for _ in range(sizes[s * w + j] - 1):
                    pool[pool_n] = j
                    pool_n += 1
                k += 1
            pick = _below(key, counter, pool_n)
            counter += 1
            j = pool[pick]
            pool_n -= 1
            pool[pick] = pool[pool_n]
            out[at[j] + fill[j]] = i
            fill[j] += 1
    return out
