"""What a plan costs (pure numpy): its batches' shapes, its padding, and its planned epoch.

A synchronous step lasts as long as its costliest batch, plus what every step pays whatever its batches
(optimizer, gradient all-reduce, launches: a fitted step model's ``c0``, or the default per-step term
``BatchConstraint.default_step_cost``). The planned epoch is the sum of that over the steps: what a planner
weighs candidate plans of different step counts by (``planners/bucketed/step_limit.py``, the shard-affine
planner's walks).
"""

from __future__ import annotations

import numpy as np

from .cost import CostModel
from .plan import Plan


def batch_shapes(plan: Plan, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B,) int64 sizes, longest lengths and real tokens of the plan's batches, in planned order.
    lengths: (N,) int64 lengths the plan's sample indices address."""
    lens = lengths[plan.samples]
    sizes = np.diff(plan.offsets)
    longest = np.zeros(sizes.shape[0], dtype=np.int64)
    real = np.zeros(sizes.shape[0], dtype=np.int64)
    full = sizes > 0
    if full.any():
        longest[full] = np.maximum.reduceat(lens, plan.offsets[:-1][full])
        real[full] = np.add.reduceat(lens, plan.offsets[:-1][full])
    return sizes, longest, real


def padding(plan: Plan, lengths: np.ndarray) -> float:
    """Real / padded tokens of the plan's batches (1.0 for a plan of no tokens)."""
    sizes, longest, real = batch_shapes(plan, lengths)
    padded = float((sizes * longest).sum())
    return float(real.sum()) / padded if padded else 1.0


def epoch_time(plan: Plan, lengths: np.ndarray, cost: CostModel, c0: float | None = None) -> float:
    """The planned epoch of padded batches under ``cost``: the sum over steps
    of the step's costliest batch plus the per-step term (``c0``; default:
    the model's own, 0 for the plain kinds), float (seconds for a step model)."""
    if plan.num_steps == 0:
        return 0.0
    sizes, longest, _ = batch_shapes(plan, lengths)
    per = cost.batch_cost(sizes, longest).reshape(-1, plan.world_size)
    return float(per.max(axis=1).sum() + (cost.per_step if c0 is None else c0) * plan.num_steps)


def packed_epoch_time(plan: Plan, lengths: np.ndarray, cost: CostModel, c0: float) -> float:
    """``epoch_time`` of packed batches: a batch costs its samples' costs summed (``CostModel.packed_cost``)."""
    if plan.num_steps == 0:
        return 0.0
    per = cost.packed_cost(lengths[plan.samples], plan.offsets).reshape(-1, plan.world_size)
    return float(per.max(axis=1).sum() + c0 * plan.num_steps)
