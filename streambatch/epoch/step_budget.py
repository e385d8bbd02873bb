"""The epoch's step limit, spent window by window (pure numpy).

A streamed epoch is planned window by window, each window's partial last
step carried into the next: the bound a plan must meet, 1.05 x the fewest
steps + 1 (``core/bounds.py``; the planner's ``step_slack``: 1.10 x for the
shard-affine planner), is on the epoch's total, not on each window (a
window's own + 1, summed over the windows, would not be). So before a window
is planned its cap is the epoch's limit so far minus the steps already
planned: ``step_limit(F) - P``, with F the fewest steps of every sample
trained so far together with this window's samples (``drop_last`` for a
window that carries: its partial step is not lost) and P the steps of the
windows before. A cap below the window's own fewest is raised to it (the
window cannot do better; the epoch's bound then rests on the earlier windows'
slack). The cap is bound into the window's constraint (``BatchLimits.bind``'s
``step_cap``); a planner without a bound (``step_slack`` None: the seed-exact
greedy planner) gets none.

Every number comes from the batch rule resolved once (``PlanConfig.limits``:
budget, size cap, cost model, cost cap, packing, ``max_steps``, the planner's
bound), as set: the accounting is over the epoch, not one window's clamp.

After an elastic resize the accounting starts again at the new world size:
steps of different world sizes do not add up to one bound.

Stream: none; ``StepBudget.cap`` before each window's plan, ``spend`` after.
"""

from __future__ import annotations

import numpy as np

from ..core.bounds import LengthCounts, fewest_steps
from ..core.constraint import BatchLimits


class StepBudget:
    """One epoch's step accounting under the batch rule ``limits``."""

    def __init__(self, limits: BatchLimits):
        self.limits = limits
        self.reset()

    def reset(self) -> None:
        """Start the accounting again (a new world size)."""
        self.trained = LengthCounts()
        self.steps = 0

    def cap(self, lengths: np.ndarray, world: int, drop_last: bool) -> int | None:
        """The most steps the next window (its (n,) int64 ``lengths``) may
        take at ``world`` ranks, or None for a planner without a bound."""
        limits = self.limits
        if limits.step_slack is None:
            return None
        own = limits.fewest_steps(lengths, world, drop_last)
        cap = max(limits.limit_of(self._fewest(lengths, world, drop_last)) - self.steps, own)
        return cap if limits.max_steps is None else max(min(cap, limits.max_steps), own)

    def _fewest(self, lengths: np.ndarray | None, world: int, drop_last: bool) -> int:
        """The fewest steps of every sample trained so far, with ``lengths`` ((n,) int64) too."""
        return self.fewest_of(self.trained, world, drop_last, lengths)

    def fewest_of(self, counts: LengthCounts, world: int, drop_last: bool, more: np.ndarray | None = None) -> int:
        """The fewest steps of the lengths in ``counts`` (and ``more``) at ``world`` ranks."""
        limits = self.limits
        b = counts.fewest_batches(limits.max_batch_tokens, limits.max_batch_size, limits.pack, limits.cost,
                                  limits.max_cost, more, limits.limit)
        return fewest_steps(b, world, drop_last)

    def spend(self, trained: np.ndarray, steps: int) -> None:
        """Count a planned window: (k,) int64 lengths of the samples its steps train, and its steps."""
        self.trained.add(trained)
        self.steps += steps
