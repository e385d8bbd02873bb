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
Deterministic; O(steps x sources**2). Its Numba kernels are ``planners/step_order.py``.

Stream: nothing: a plan with its steps reordered.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.plan import Plan
from ..planners.step_order import count_steps, deficit_order

_PURITY = np.array([0.6, 0.8, 0.95])  # class edges by the majority source's share of the step


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
    count_steps(plan.samples, step_offsets, source_labels(labels, num_sources), out)
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
