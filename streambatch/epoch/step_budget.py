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

The windows' own fewest steps do not add up to the epoch's: a window's
samples batch only with each other (and its carry), so two windows can need
more steps together than their samples at once (45,000 heavy-tailed samples
at W = 512: windows of at least 4 and 10 steps, 13 for the epoch). A window
that spent the epoch's slack would leave the next one raised over the limit.
So with a lookahead (``expect``: the epoch's samples, known before its first
window; ``show``: each window's new samples as it comes) the cap also
reserves for the rest of the epoch: ``step_limit(F_epoch) - P - R``, R the
fewest steps of the samples still to come (ceil: a partial step counts) plus
one step for each window still to come (its partial step, which need not
combine with the next window's). A window spends slack only when the rest
cannot need it; the last windows get what is left.

After an elastic resize the accounting starts again at the new world size:
steps of different world sizes do not add up to one bound (the lookahead
stays: which samples are still to come does not depend on the world size).

Stream: none; ``expect`` once (optional), then per window ``show`` (with a lookahead), ``cap`` before
its plan, ``spend`` after.
"""

from __future__ import annotations

import numpy as np

from ..core.bounds import LengthCounts, fewest_steps
from ..core.constraint import BatchLimits


class StepBudget:
    """One epoch's step accounting under the batch rule ``limits``."""

    def __init__(self, limits: BatchLimits):
        self.limits = limits
        self.unseen: LengthCounts | None = None  # the lookahead: the epoch's samples not shown yet
        self.final_drop = False
        self.reset()

    def reset(self) -> None:
        """Start the accounting again (a new world size); the lookahead stays."""
        self.trained = LengthCounts()
        self.steps = 0

    def expect(self, lengths: np.ndarray, drop_last: bool) -> None:
        """Look ahead: (N,) int64 lengths of every sample the epoch will plan (after the long-sample
        policy), the epoch's ``drop_last``. Each window's new samples are then ``show``-n before its cap."""
        self.unseen = LengthCounts()
        self.unseen.add(lengths)
        self.final_drop = drop_last

    def show(self, lengths: np.ndarray) -> None:
        """(n,) int64 lengths of a window's new samples (given to ``expect`` before): no longer to come."""
        if self.unseen is not None:
            self.unseen.remove(lengths)

    def cap(self, lengths: np.ndarray, world: int, drop_last: bool, held: np.ndarray | None = None,
            windows_left: int = 0) -> int | None:
        """The most steps the next window (its (n,) int64 ``lengths``) may
        take at ``world`` ranks, or None for a planner without a bound.
        With a lookahead: ``held`` ((h,) int64) the lengths shown but kept
        for a later window, ``windows_left`` the windows still to come."""
        limits = self.limits
        if limits.step_slack is None:
            return None
        own = limits.fewest_steps(lengths, world, drop_last)
        cap = limits.limit_of(self._fewest(lengths, world, drop_last)) - self.steps
        if self.unseen is not None:
            rest = _merged(self.unseen, held)
            if rest.total or windows_left:
                # reserve the rest's fewest, one step per window to come for its partial step
                reserve = self.fewest_of(rest, world, False) + windows_left
                whole = self.fewest_of(_merged(rest, self.trained.values, self.trained.counts), world,
                                       self.final_drop, lengths)
                cap = min(cap, limits.limit_of(whole) - self.steps - reserve)
        cap = max(cap, own)
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


def _merged(counts: LengthCounts, lengths: np.ndarray | None, weights: np.ndarray | None = None) -> LengthCounts:
    """A new LengthCounts: ``counts`` with (n,) int64 ``lengths`` (each ``weights`` times, default once)."""
    out = LengthCounts()
    out.values, out.counts = counts.values, counts.counts  # add() replaces them: ``counts`` is left as it was
    if lengths is not None:
        out.add(lengths, weights)
    return out
