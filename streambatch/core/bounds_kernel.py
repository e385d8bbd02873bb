"""The Numba kernels of ``core/bounds.py``: the batch count of the fill (the
fewest batches of padded plans) from a length histogram, and the fractional
fill of packed batches under a limit curve."""

from __future__ import annotations

import numpy as np

from .jit import njit  # numba's, with a cache that may fail to save (core/jit.py)

_I64_MAX = np.int64(np.iinfo(np.int64).max)  # a typed global (np.iinfo in a kernel compiles code each time)


@njit(cache=True, no_cfunc_wrapper=True)
def fill_count(values, counts, budget, cap, ca, cb, max_cost, table):
    """Batches of the fill (``core/bounds.py``'s docstring) of a length histogram.

    values: (k,) int64 distinct lengths, descending; counts: (k,) int64 >= 1
    samples of each. budget, cap, max_cost >= 1 (int64 max: no cost cap);
    (ca, cb): ``CostModel.coefficients``, a batch costs ``B * L * (ca * L + cb)``
    (scaled). table: (> values[0],) int64 a limit curve's largest batch per
    length, non-increasing (``BatchConstraint.size_table``), or (0,): none.
    A batch started at a longer length may take the next shorter
    samples into its room: its longest, and so its capacity, is its first.
    Returns the count (int64)."""
    batches = np.int64(0)
    room = np.int64(0)  # samples the open batch (started at a longer length) may still take
    for i in range(values.shape[0]):
        v = values[i]
        c = counts[i]
        take = room if room < c else c
        room -= take
        c -= take
        if c == 0:
            continue
        k = cap
        if v > 0:
            by_budget = budget // v
            k = by_budget if by_budget < k else k
            per = v * (ca * v + cb)
            if per > 0 and max_cost < _I64_MAX:
                by_cost = max_cost // per
                k = by_cost if by_cost < k else k
        if table.shape[0] > 0 and table[v] < k:
            k = table[v]
        k = k if k > 1 else np.int64(1)
        full = c // k
        batches += full
        rest = c - full * k
        if rest > 0:
            batches += 1
            room = k - rest
    return batches


@njit(cache=True, no_cfunc_wrapper=True)
def token_fill_count(values, counts, room_of):
    """Batches of the fractional longest-first fill (``core/bounds.py``'s
    ``_curve_bound``): values (k,) int64 distinct lengths, descending, > 0;
    counts (k,) int64 >= 1; room_of: (> values[0],) float64 ``C*``, the most
    tokens a batch holding a sample of that length may hold (>= 1, not
    increasing with length). A batch started at a longer length takes the
    next samples' tokens into its room. Returns the count (int64), each
    batch count rounded down a little so that float error cannot lift it."""
    batches = np.int64(0)
    room = 0.0
    for i in range(values.shape[0]):
        tokens = float(values[i]) * float(counts[i])
        take = room if room < tokens else tokens
        room -= take
        tokens -= take
        if tokens > 0.0:
            cap = room_of[values[i]]
            opened = np.int64(np.ceil(tokens / cap * (1 - 1e-12) - 1e-9))
            batches += opened
            left = opened * cap - tokens
            room = left if left > 0.0 else 0.0
    return batches
