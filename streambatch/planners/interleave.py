"""Step order of a mixed epoch: sources spread evenly over training time.

A planner groups samples by length, and sources usually differ in length
(read audiobooks vs short prompts), so most steps hold mostly one source.
In a shuffled step order the mix of any stretch of training is then only
right on average: on 300 steps, the first 30 can be 70 % one source instead
of 40 %. ``interleave_steps`` reorders whole steps (batches, balance and
budget are untouched) so that every prefix of the epoch holds each source
in its epoch share, within about one step: steps are classed by their
majority source and how pure they are, each class keeps the planner's
(shuffled) order, and the next step is the head of the class that leaves
the running mix closest to the shares (least squares over sources).
Deterministic; O(steps x sources**2).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..core.plan import Plan
from .bucketed.common import _helper, _new, _zeros

_PURITY = np.array([0.6, 0.8, 0.95])  # class edges by the majority source's share of the step


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
def _count_steps(samples, step_offsets, labels, out):
    """out[s, c] += samples of source c in planned step s (out: (n_steps, S) int64)."""
    for s in range(step_offsets.shape[0] - 1):
        for k in range(step_offsets[s], step_offsets[s + 1]):
            out[s, labels[samples[k]]] += 1


def source_labels(sources: np.ndarray, num_sources: int) -> np.ndarray:
    """Per-sample source ids in the narrowest integer type: the counting
    kernel reads them in plan order (random access), and 1 byte per sample
    stays in cache where 8 would not."""
    dtype = np.int8 if num_sources < 128 else np.int16 if num_sources < 32768 else np.int32
    return np.asarray(sources).astype(dtype, copy=False)


def step_counts(plan: Plan, labels: np.ndarray, num_sources: int) -> np.ndarray:
    """(n_steps, S) int64 samples of each source in each *planned* step
    (index with ``plan.step_order`` for training order).

    labels: (N,) integer source of each sample the plan indexes.
    """
    step_offsets = np.ascontiguousarray(plan.offsets[:: plan.world_size])
    out = np.zeros((step_offsets.shape[0] - 1, num_sources), dtype=np.int64)
    _count_steps(plan.samples, step_offsets, source_labels(labels, num_sources), out)
    return out


def interleave_steps(plan: Plan, labels: np.ndarray, num_sources: int) -> Plan:
    """``plan`` with its steps reordered so that sources are spread evenly.

    labels: (N,) int64 source of each sample the plan indexes.
    """
    if plan.num_steps < 2 or num_sources < 2:
        return plan
    counts = step_counts(plan, labels, num_sources)
    n = counts.shape[0]
    per_step = counts.sum(axis=1)
    # classes: majority source x how pure the step is, so that a class's
    # steps are alike and the least-squares choice has mixed steps to use
    major = counts.argmax(axis=1)
    purity = counts[np.arange(n), major] / np.maximum(per_step, 1)
    level = np.searchsorted(_PURITY, purity, side="right")
    classes = (major * (len(_PURITY) + 1) + level).astype(np.int64)
    order = deficit_order(counts, classes, (len(_PURITY) + 1) * num_sources, plan.step_order.astype(np.int64))
    return dataclasses.replace(plan, step_order=order)
