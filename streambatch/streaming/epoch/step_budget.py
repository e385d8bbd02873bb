"""The epoch's step limit, spent window by window (pure numpy).

A streamed epoch is planned window by window, each window's partial last
step carried into the next: the bound a plan must meet, 1.05 x the fewest
steps + 1 (``core/bounds.py``), is on the epoch's total, not on each window
(a window's own + 1, summed over the windows, would not be). So before a
window is planned its cap is the epoch's limit so far minus the steps
already planned: ``step_limit(F) - P``, with F the fewest steps of every
sample trained so far together with this window's samples (``drop_last``
for a window that carries: its partial step is not lost) and P the steps of
the windows before. A cap below the window's own fewest is raised to it (the
window cannot do better; the epoch's bound then rests on the earlier windows'
slack). Planners that take ``max_steps`` get the cap; others plan as they
will.

After an elastic resize the accounting starts again at the new world size:
steps of different world sizes do not add up to one bound.

Stream: none; ``StepBudget.cap`` before each window's plan, ``spend`` after.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.bounds import STEP_SLACK_DIV, LengthCounts, fewest_batches, fewest_steps, step_limit
from ...core.config import PlanConfig
from ...core.registry import get_planner

MAX_STEPS = "max_steps"  # the planner option that caps a plan's steps


class StepBudget:
    """One epoch's step accounting for ``config`` (its planner's budget, cap,
    cost model, cost cap and packing); ``slack_div``: the limit is
    ``step_limit(F, slack_div)``, 1 + 1/slack_div times the fewest, plus one."""

    def __init__(self, config: PlanConfig, slack_div: int = STEP_SLACK_DIV):
        self.slack_div = slack_div
        p = get_planner(config.planner)
        resolved = p.resolve(config.options)
        self.takes_cap = MAX_STEPS in p.option_names()
        self.user_cap = resolved.get(MAX_STEPS)
        self.pack = p.packs(resolved)
        self.cost = p.cost_model(resolved)
        self.max_cost = self.cost.cost_cap(resolved.get("max_step_cost"))
        self.tokens, self.size = config.max_batch_tokens, config.max_batch_size
        self.reset()

    def reset(self) -> None:
        """Start the accounting again (a new world size)."""
        self.trained = LengthCounts()
        self.steps = 0

    def _fewest(self, lengths: np.ndarray | None, world: int, drop_last: bool) -> int:
        b = self.trained.fewest_batches(self.tokens, self.size, self.pack, self.cost, self.max_cost, lengths)
        return fewest_steps(b, world, drop_last)

    def cap(self, lengths: np.ndarray, world: int, drop_last: bool) -> int | None:
        """The most steps the next window (its (n,) int64 ``lengths``) may
        take at ``world`` ranks, or None for a planner without ``max_steps``."""
        if not self.takes_cap:
            return None
        own = fewest_steps(fewest_batches(lengths, self.tokens, self.size, self.pack, self.cost, self.max_cost),
                           world, drop_last)
        cap = max(step_limit(self._fewest(lengths, world, drop_last), self.slack_div) - self.steps, own)
        return cap if self.user_cap is None else max(min(cap, self.user_cap), own)

    def fewest_of(self, counts: LengthCounts, world: int, drop_last: bool) -> int:
        """The fewest steps of the lengths in ``counts`` at ``world`` ranks."""
        b = counts.fewest_batches(self.tokens, self.size, self.pack, self.cost, self.max_cost)
        return fewest_steps(b, world, drop_last)

    def spend(self, trained: np.ndarray, steps: int) -> None:
        """Count a planned window: (k,) int64 lengths of the samples its steps train, and its steps."""
        self.trained.add(trained)
        self.steps += steps

    def options(self, config: PlanConfig, cap: int | None) -> dict[str, Any]:
        """The planner options of a window's config with its cap."""
        options = config.options
        if cap is not None:
            options[MAX_STEPS] = cap
        return options
