"""The seed's greedy global-step planner as a Numba kernel.

Samples are taken in planning order. Each one goes to the rank of the current
global step whose key is lexicographically smallest, with the seed's key:

    (cost spread, max cost, total cost, token spread, projected cost,
     projected tokens, new count, (rank - step) mod W, rank)

where the spreads, max and total are over the step's W batch costs (B * L**2)
and tokens (B * L) after a hypothetical placement. A rank is closed to a
sample once the batch is non-empty and the sample would break the size cap or
the token budget; a step ends when every rank is closed.

The seed evaluates each candidate in O(W); here the max/min "over the other
ranks" come from top-two/bottom-two statistics, so a candidate is O(1) and a
sample O(W).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BIG = np.iinfo(np.int64).max


@njit(cache=True)
def _top2(values, w):
    """(max, argmax, max over the others, min, argmin, min over the others)."""
    max1 = -1
    imax = -1
    max2 = -1
    min1 = _BIG
    imin = -1
    min2 = _BIG
    for r in range(w):
        v = values[r]
        if v > max1:
            max2 = max1
            max1 = v
            imax = r
        elif v > max2:
            max2 = v
        if v < min1:
            min2 = min1
            min1 = v
            imin = r
        elif v < min2:
            min2 = v
    return max1, imax, max2, min1, imin, min2


@njit(cache=True)
def _key_less(a, b):
    for i in range(a.shape[0]):
        if a[i] != b[i]:
            return a[i] < b[i]
    return False


@njit(cache=True)
def greedy_steps(order, lengths, world_size, max_tokens, max_size, out):
    """Plan global steps greedily over ``order``.

    order: (n,) int sample indices in planning order. lengths: (N,) int64.
    max_tokens, max_size: budget and cap (>= 1); costs must fit in int64
    (checked by the caller; ``max_size <= n``). out: (>= n,) int, receives the
    samples grouped by step then rank, in placement order within a batch.

    Returns counts: (n_steps, world_size) int64 batch sizes. Every step is full
    (all ranks non-empty) except possibly the last.
    """
    n = order.shape[0]
    w = world_size
    cnt = np.zeros(w, dtype=np.int64)
    mx = np.zeros(w, dtype=np.int64)
    cost = np.zeros(w, dtype=np.int64)
    tok = np.zeros(w, dtype=np.int64)
    step_samples = np.empty(max(1, min(n, w * max_size)), dtype=np.int64)
    step_ranks = np.empty(step_samples.shape[0], dtype=np.int64)
    rank_pos = np.zeros(w, dtype=np.int64)
    best = np.empty(9, dtype=np.int64)
    cand = np.empty(9, dtype=np.int64)
    # Only steps that end before the data does are full; grow as needed.
    counts = np.empty((max(4, n // (w * 16)), w), dtype=np.int64)
    pos = 0
    n_out = 0
    step = 0
    while pos < n:
        cnt[:] = 0
        mx[:] = 0
        cost[:] = 0
        tok[:] = 0
        total = 0
        m = 0  # samples placed in this step
        while pos < n:
            s = order[pos]
            ln = lengths[s]
            cmax1, cimax, cmax2, cmin1, cimin, cmin2 = _top2(cost, w)
            tmax1, timax, tmax2, tmin1, timin, tmin2 = _top2(tok, w)
            chosen = -1
            for r in range(w):
                c = cnt[r]
                nm = mx[r] if mx[r] > ln else ln
                nc = c + 1
                pt = nc * nm
                if c > 0 and (nc > max_size or pt > max_tokens):
                    continue
                pc = pt * nm
                hi = cmax2 if r == cimax else cmax1
                lo = cmin2 if r == cimin else cmin1
                smax = hi if hi > pc else pc
                smin = lo if lo < pc else pc
                spread = smax - smin
                if chosen >= 0 and spread > best[0]:
                    continue
                cand[0] = spread
                cand[1] = smax
                cand[2] = total - cost[r] + pc
                thi = tmax2 if r == timax else tmax1
                tlo = tmin2 if r == timin else tmin1
                cand[3] = (thi if thi > pt else pt) - (tlo if tlo < pt else pt)
                cand[4] = pc
                cand[5] = pt
                cand[6] = nc
                cand[7] = (r - step) % w
                cand[8] = r
                if chosen < 0 or _key_less(cand, best):
                    best[:] = cand
                    chosen = r
            if chosen < 0:
                break
            if m == step_samples.shape[0]:
                grown = np.empty(2 * m, dtype=np.int64)
                grown[:m] = step_samples
                step_samples = grown
                grown = np.empty(2 * m, dtype=np.int64)
                grown[:m] = step_ranks
                step_ranks = grown
            step_samples[m] = s
            step_ranks[m] = chosen
            m += 1
            total += best[4] - cost[chosen]
            cnt[chosen] += 1
            if ln > mx[chosen]:
                mx[chosen] = ln
            cost[chosen] = best[4]
            tok[chosen] = best[5]
            pos += 1
        if step == counts.shape[0]:
            grown2 = np.empty((2 * step, w), dtype=np.int64)
            grown2[:step] = counts
            counts = grown2
        # Stable counting sort of the step's samples by rank.
        acc = n_out
        for r in range(w):
            rank_pos[r] = acc
            acc += cnt[r]
            counts[step, r] = cnt[r]
        for i in range(m):
            r = step_ranks[i]
            out[rank_pos[r]] = step_samples[i]
            rank_pos[r] += 1
        n_out += m
        step += 1
    return counts[:step].copy()
