"""Keeping a bucketed plan within its step limit (plan layer).

The layouts of ``kernels.plan_steps`` balance a step's W batches by
under-filling some of them (the head of long samples after an outlier, cost-
held batches, deals): under B * L**2 alone that costs nothing, but every
under-filled batch is a share of a step more. A plan may take at most its
limit, 1.05 x the fewest steps + 1 (``core/bounds.py``) unless the caller set
``max_steps``. When the first plan takes more, the candidates within the
limit are:

- the layouts with the head cut back: without it, then the longest reach of
  the head still within the limit, found by halving over the long samples'
  lengths (the head's steps are the under-filled ones where lengths are long);
- the fill (``fill.py``): the fewest batches, cut where that lowers the
  costliest, within the limit.

The first plan is today's plan; among the candidates the one kept pads about
as little (real / padded tokens at most PAD_TOLERANCE below it) and, of those, plans the
shortest epoch under the planner's cost plus a per-step term: a step is
assumed to cost ``STEP_SHARE`` of a full batch of median-length samples on
top of its costliest batch (optimizer, gradient all-reduce, launches), the
default objective's stand-in for a measured ``c0``. If no candidate pads as
little, the least padding wins. A measured step model (c0 > 0) decides by
itself: its plan is kept over the limit when the model predicts it faster
than the fill, and ``Plan.fewest_steps`` shows by how many steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...core.cost import INT64_MAX, CostModel
from ...core.plan import Plan

NO_HEAD = int(INT64_MAX)  # head_min that lays no long samples out as head steps (outliers still are)
HEAD_SEARCH = 4  # halvings of the head's reach tried between none and all of it
STEP_SHARE = 0.1  # the default per-step term: this share of a full batch's cost at the median length
PAD_TOLERANCE = 0.002  # a candidate may pad this much more than the first plan (real / padded tokens)


def within_limit(plan: Plan, lengths: np.ndarray, tokens: int, cap: int, cost: CostModel, limit: int,
                 lay_out: Callable[[int], Plan], fill: Callable[[], Plan]) -> Plan:
    """A plan of at most ``limit`` steps in place of ``plan``, which has more
    (see the module docstring). lengths: (N,) int64, N >= 1; tokens, cap:
    the clamped budget and size cap; lay_out(head_min): the layouts with the
    head reaching down to that length; fill(): the fill plan."""
    from .head import LONG  # lazy for start-up: no numba before the first plan

    candidates = []
    if cost.per_step <= 0:
        bare = lay_out(NO_HEAD)
        if bare.num_steps <= limit:
            long = np.sort(lengths[tokens < LONG * lengths])[::-1]  # the lengths the head may reach
            lo, hi = 0, long.shape[0]  # a reach of lo long samples is within the limit, hi is not
            best = bare
            for _ in range(HEAD_SEARCH):
                if hi - lo <= 1:
                    break
                mid = (lo + hi) // 2
                tried = lay_out(int(long[mid - 1]))
                if tried.num_steps <= limit:
                    lo, best = mid, tried
                else:
                    hi = mid
            candidates.append(best)
    candidates.append(fill())
    if cost.per_step > 0:  # the measured model decides: more steps only when it predicts them faster
        fewest = candidates[-1]
        return plan if epoch_time(plan, lengths, cost) < epoch_time(fewest, lengths, cost) else fewest
    c0 = default_step_cost(lengths, tokens, cap, cost)
    pads = [padding(p, lengths) for p in candidates]
    first = padding(plan, lengths)
    kept = [p for p, x in zip(candidates, pads) if x >= first - PAD_TOLERANCE] or [candidates[int(np.argmax(pads))]]
    return min(kept, key=lambda p: epoch_time(p, lengths, cost, c0))


def default_step_cost(lengths: np.ndarray, tokens: int, cap: int, cost: CostModel) -> float:
    """STEP_SHARE of the cost of a full batch of median-length samples (cost units)."""
    med = max(1, int(np.partition(lengths, lengths.shape[0] // 2)[lengths.shape[0] // 2]))
    full = max(1, min(cap, tokens // med))
    return STEP_SHARE * float(cost.batch_cost(full, med))


def batch_shapes(plan: Plan, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B,) int64 sizes, longest lengths and real tokens of the plan's batches, in planned order."""
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
    """Real / padded tokens of the plan's batches."""
    sizes, longest, real = batch_shapes(plan, lengths)
    padded = float((sizes * longest).sum())
    return float(real.sum()) / padded if padded else 1.0


def epoch_time(plan: Plan, lengths: np.ndarray, cost: CostModel, c0: float | None = None) -> float:
    """The planned epoch under ``cost``: the sum over steps of the step's
    costliest batch plus the per-step term (``c0``; default: the model's own,
    0 for the plain kinds), float (seconds for a step model)."""
    if plan.num_steps == 0:
        return 0.0
    sizes, longest, _ = batch_shapes(plan, lengths)
    per = cost.batch_cost(sizes, longest).reshape(-1, plan.world_size)
    return float(per.max(axis=1).sum() + (cost.per_step if c0 is None else c0) * plan.num_steps)
