"""Keeping a bucketed plan within its step limit (plan layer).

The layouts of ``steps.plan_steps`` balance a step's W batches by
under-filling some of them (the head of long samples after an outlier, cost-
held batches, deals): under B * L**2 alone that costs nothing, but every
under-filled batch is a share of a step more. A plan may take at most its
limit (the batch rule's ``BatchConstraint.step_limit``): 1.05 x the fewest
steps + 1 (``core/bounds.py``) unless the caller set ``max_steps``. When the
first plan takes more, the candidates within the limit are:

- the layouts with the head cut back: without it, then the longest reach of
  the head still within the limit, found by halving over the long samples'
  lengths (the head's steps are the under-filled ones where lengths are long);
- the fill (``fill.py``): the fewest batches, cut where that lowers the
  costliest, within the limit;
- for a streamed window (bound with its share of the epoch's limit,
  ``BatchConstraint.step_cap``), also the fill under the lowest cost cap
  that keeps it within the limit (``capped_level``): a window held to its
  fewest steps (its epoch's slack spent by the windows before it) otherwise
  fills every batch of long samples to the budget, B x its longest, and the
  step holding one is the window's longest; under the lower cap they spread
  over more batches of the same steps (measured: a window of 3,593 samples
  at W = 4, 1.19x the planned epoch of its uncapped layouts -> 1.04x). Not
  for map-style plans (no ``step_cap``): those stay as they were. It takes
  at most the steps of the other candidates: a step one window spends is one
  the windows after it lack (the epoch's final window, holding the held-back
  outliers, needs them most), which no window can see.

The first plan is today's plan; among the candidates the one kept pads about
as little (real / padded tokens at most PAD_TOLERANCE below it) and, of
those, plans the shortest epoch under the planner's cost plus a per-step term: a step is
assumed to cost ``BatchLimits.step_share`` (``core/constraint.py``: 0.1) of
a full batch of median-length samples on top of its costliest batch
(optimizer, gradient all-reduce, launches: ``core/plan_time.py``), the
default objective's stand-in for a measured ``c0``. If no candidate pads as
little, the least padding wins. A measured step model (c0 > 0) decides by
itself: its plan is kept over the limit when the model predicts it faster
than the fill, and ``Plan.fewest_steps`` shows by how many steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...core.constraint import BatchConstraint
from ...core.cost import INT64_MAX
from ...core.plan import Plan
from ...core.plan_time import epoch_time, padding

NO_HEAD = int(INT64_MAX)  # head_min that lays no long samples out as head steps (outliers still are)
HEAD_SEARCH = 4  # halvings of the head's reach tried between none and all of it
PAD_TOLERANCE = 0.002  # a candidate may pad this much more than the first plan (real / padded tokens)


def within_limit(plan: Plan, lengths: np.ndarray, constraint: BatchConstraint, limit: int,
                 lay_out: Callable[[int], Plan], fill: Callable[[], Plan]) -> Plan:
    """A plan of at most ``limit`` steps in place of ``plan``, which has more
    (see the module docstring). lengths: (N,) int64, N >= 1; constraint: the
    batch rule bound to them (its clamped budget and size cap, cost model and
    default per-step term); lay_out(head_min): the layouts with the head
    reaching down to that length; fill(): the fill plan."""
    from .head import LONG  # lazy for start-up: no numba before the first plan

    cost = constraint.cost
    candidates = []
    if cost.per_step <= 0:
        bare = lay_out(NO_HEAD)
        if bare.num_steps <= limit:
            long = np.sort(lengths[constraint.max_tokens < LONG * lengths])[::-1]  # the lengths the head may reach
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
    if constraint.step_cap is not None and cost.per_step <= 0:
        # no more steps than any other candidate: a step a streamed window spends is one the windows after it lack
        level = capped_level(lengths, constraint, min(p.num_steps for p in candidates))
        if level is not None:
            candidates.append(fill(level))
    if cost.per_step > 0:  # the measured model decides: more steps only when it predicts them faster
        fewest = candidates[-1]
        return plan if epoch_time(plan, lengths, cost) < epoch_time(fewest, lengths, cost) else fewest
    c0 = constraint.default_step_cost(lengths)
    pads = [padding(p, lengths) for p in candidates]
    first = padding(plan, lengths)
    kept = [p for p, x in zip(candidates, pads) if x >= first - PAD_TOLERANCE] or [candidates[int(np.argmax(pads))]]
    return min(kept, key=lambda p: epoch_time(p, lengths, cost, c0))


def capped_level(lengths: np.ndarray, constraint: BatchConstraint, limit: int) -> int | None:
    """The lowest cost cap under which the fill of ``lengths`` (longest first) still takes at most ``limit``
    steps, or None when it is the batch rule's own."""
    from .steps import fill_sizes  # lazy for start-up: no numba before the first plan

    w = constraint.world_size
    slen = np.ascontiguousarray(np.sort(lengths)[::-1])
    ca, cb = constraint.coefficients
    tab = constraint.size_table

    def steps(level: int) -> int:
        return -(-fill_sizes(slen, constraint.max_tokens, constraint.max_size, tab, ca, cb, level).shape[0] // w)

    top = fill_sizes(slen, constraint.max_tokens, constraint.max_size, tab, ca, cb, constraint.max_cost)
    longest = np.maximum.reduceat(slen, np.concatenate([[0], np.cumsum(top)[:-1]]))
    hi = int((top * longest * (ca * longest + cb)).max())  # the fill's costliest batch
    lo = int(slen[0]) * (ca * int(slen[0]) + cb) - 1  # below a lone longest sample: every batch over it
    if hi <= lo + 1 or steps(hi) > limit:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if steps(mid) <= limit:
            hi = mid
        else:
            lo = mid
    return hi
