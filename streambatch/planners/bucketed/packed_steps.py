"""Numba kernel of packed (padding-free) planning: every global step's W
bins filled best-fit decreasing, the least costly bin served first.

Arrays and integer scalars in, arrays out; the plan layer (``packed.py``)
validates and prepares the input. A packed batch's integer cost is the sum
of its samples' ``_cost(ca, cb, 1, L)`` (``CostModel.coefficients``): there is
no padding, so a sample costs the same in any batch.
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _I64_MAX, _cost, _helper


@_helper
def _find(link, j):
    """The largest position <= j not yet taken, or -1 (a union-find over
    positions: ``link[x] == x`` while position x - 1 is free; slot 0 is the
    'none' sentinel). Path halving keeps every call near O(1)."""
    x = j + 1
    while link[x] != x:
        link[x] = link[link[x]]
        x = link[x]
    return x - 1


@_helper
def _longest_within(ca, cb, budget, hi):
    """The largest L in [0, hi] with ``L * (ca * L + cb) <= budget`` (cost is
    increasing in L), or -1 when budget < 0. Compares by division so that no
    product can overflow."""
    if budget < 0:
        return np.int64(-1)
    lo = np.int64(0)
    while lo < hi:
        mid = hi - (hi - lo) // 2  # upper middle: lo < mid <= hi
        if mid <= budget // (ca * mid + cb):
            lo = mid
        else:
            hi = mid - 1
    return lo


@_helper
def _lighter(cost, tok, cnt, r, b):
    """Bin r is served before bin b: less cost, then fewer tokens, then fewer samples."""
    if cost[r] != cost[b]:
        return cost[r] < cost[b]
    if tok[r] != tok[b]:
        return tok[r] < tok[b]
    return cnt[r] < cnt[b]


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def pack_steps(slen, skey, w, max_tokens, max_size, ca, cb, max_cost, out):
    """Pack samples into global steps of W bins, longest samples first.

    slen: (n,) int64 lengths in ascending key order; skey: (n,) float64 the
    keys, ascending, each >= its length (the length times a random factor
    in [1, 1 + width): samples of near-equal length trade places from epoch
    to epoch). max_tokens, max_size >= 1, max_cost >= 1 (int64 max for no
    cap); ca, cb: the cost model's coefficients. out: (n,) int64 receives
    positions (into slen) grouped by step, then bin, in placement order.

    Each step opens W empty bins and serves the least costly open one (ties:
    fewer tokens, fewer samples, lower index) until every bin is closed:
    an empty bin takes the longest remaining sample whatever its length (a
    sample over the budget or cost cap is a batch of its own); any other
    bin takes the longest remaining sample that fits its token room, its
    size cap and its cost cap, and is closed when none fits. So every step
    starts with the W longest samples left, the least costly bin keeps
    taking the longest that fit (the longest-processing-time rule: costs
    stay within about the last sample's cost of each other) and the rooms
    left are filled with ever shorter samples (bins close nearly full).

    Returns (counts, n_steps, complete): counts[:n_steps * W] (int64) the
    bin sizes, step-major; complete is False when the data ran out while a
    bin of the final step was still open (the final step is then partial:
    some bins may be empty when fewer than W samples were left).
    """
    n = slen.shape[0]
    link = np.empty(n + 1, dtype=np.int64)
    for x in range(n + 1):
        link[x] = x
    counts = np.zeros((n // w + 1) * w, dtype=np.int64)  # a step holds >= W samples, but the last
    cost = np.zeros(w, dtype=np.int64)
    tok = np.zeros(w, dtype=np.int64)
    cnt = np.zeros(w, dtype=np.int64)
    shut = np.zeros(w, dtype=np.int64)  # 1: closed
    cursor = np.zeros(w, dtype=np.int64)
    step_pos = np.empty(n, dtype=np.int64)  # this step's placements: position and bin
    step_bin = np.empty(n, dtype=np.int64)
    capped = max_cost < _I64_MAX
    remaining = n
    n_out = np.int64(0)
    step = np.int64(0)
    complete = True
    while remaining > 0:
        for r in range(w):
            cost[r] = 0
            tok[r] = 0
            cnt[r] = 0
            shut[r] = 0
        n_open = w
        k = 0
        while n_open > 0 and remaining > 0:
            b = -1
            for r in range(w):  # the least costly open bin
                if shut[r] == 0 and (b < 0 or _lighter(cost, tok, cnt, r, b)):
                    b = r
            if cnt[b] == 0:
                j = _find(link, n - 1)
            else:
                room = max_tokens - tok[b]
                if capped and room >= 0:
                    limit = _longest_within(ca, cb, max_cost - cost[b], room)
                    room = limit if limit < room else room
                j = np.int64(-1)
                if room >= 0 and cnt[b] < max_size:
                    i = np.searchsorted(skey, float(room), side="right") - 1
                    j = _find(link, i)
                    while j >= 0 and slen[j] > room:  # a float key rounded below its length (lengths > 2**53)
                        j = _find(link, j - 1)
                if j < 0:
                    shut[b] = 1
                    n_open -= 1
                    continue
            ln = slen[j]
            link[j + 1] = j
            remaining -= 1
            cost[b] += _cost(ca, cb, np.int64(1), ln)
            tok[b] += ln
            cnt[b] += 1
            step_pos[k] = j
            step_bin[k] = b
            k += 1
        if remaining == 0 and n_open > 0:
            complete = False
        acc = n_out
        for r in range(w):
            counts[step * w + r] = cnt[r]
            cursor[r] = acc
            acc += cnt[r]
        for t in range(k):
            r = step_bin[t]
            out[cursor[r]] = step_pos[t]
            cursor[r] += 1
        n_out += k
        step += 1
    return counts, step, complete
