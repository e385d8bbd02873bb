"""Numba kernels that reorder a plan's steps, whatever planner made it: a mix's
sources spread evenly over the epoch (the plan layer is ``epoch/interleave.py``).

Arrays in, arrays out; allocation through the toolkit's helpers.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from .toolkit import _helper, _new, _zeros


@_helper
def _floats(n):
    """(n,) float64 zeros (one allocation overload for the three arrays below)."""
    a = np.empty(n, dtype=np.float64)
    for i in range(n):
        a[i] = 0.0
    return a


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def deficit_order(counts, classes, num_classes, order):
    """(n,) int64 new step order.

    counts: (n, S) int64 samples of each source in planned step i;
    classes: (n,) int64 class of step i, in [0, num_classes); order: (n,)
    int64 the planner's step order (each class keeps it).

    Loops rather than np.zeros, .copy(), .sum() and array division: each of
    those compiles an overload of its own on the first mixed plan (the sums
    are the same left-to-right additions).
    """
    n, s = counts.shape
    k = num_classes
    # steps of each class in the planner's order: a CSR layout
    starts = _zeros(k + 1)
    for i in range(n):
        starts[classes[i] + 1] += 1
    for c in range(k):
        starts[c + 1] += starts[c]
    queue = _new(n)
    fill = _new(k)
    head = _new(k)
    for c in range(k):
        fill[c] = starts[c]
        head[c] = starts[c]
    for i in range(n):
        step = order[i]
        c = classes[step]
        queue[fill[c]] = step
        fill[c] += 1
    totals = _floats(s)
    for i in range(n):
        for c in range(s):
            totals[c] += counts[i, c]
    grand = 0.0
    for c in range(s):
        grand += totals[c]
    share = _floats(s)
    for c in range(s):
        share[c] = totals[c] / grand if grand > 0 else totals[c]
    # err[c]: samples of source c placed so far minus its share of all placed
    err = _floats(s)
    out = _new(n)
    for pos in range(n):
        # the next step of the class that leaves the running mix closest to
        # the shares (least squares); ties to the lower class
        best, best_score = -1, np.inf
        for c in range(k):
            if head[c] < starts[c + 1]:
                step = queue[head[c]]
                size = 0.0
                for d in range(s):
                    size += counts[step, d]
                score = 0.0
                for d in range(s):
                    e = err[d] + counts[step, d] - share[d] * size
                    score += e * e
                if score < best_score:
                    best, best_score = c, score
        step = queue[head[best]]
        head[best] += 1
        out[pos] = step
        size = 0.0
        for d in range(s):
            size += counts[step, d]
        for d in range(s):
            err[d] += counts[step, d] - share[d] * size
    return out


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def count_steps(samples, step_offsets, labels, out):
    """out[s, c] += samples of source c in planned step s (out: (n_steps, S) int64)."""
    for s in range(step_offsets.shape[0] - 1):
        for k in range(step_offsets[s], step_offsets[s + 1]):
            out[s, labels[samples[k]]] += 1
