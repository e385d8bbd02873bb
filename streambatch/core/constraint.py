"""The batch rule, written once and asked by every planner (as lhotse's ``TimeConstraint`` holds its limit).

Two objects, one per moment a setting becomes known:

- ``BatchLimits``: the rule as set — token budget, size cap, cost model, cost cap, packing and the
  long-sample policy — checked once per configuration (``PlanConfig.limits``: the planner's options
  resolved once). It knows nothing of lengths.
- ``BatchConstraint``: the limits bound to one plan's lengths and world (``BatchLimits.bind``), built
  once per plan by the epoch layer and passed down to the planner, whose kernels take its numbers:
  ``max_tokens`` (the budget clamped to what a batch can hold and range-checked against int64),
  ``max_size``, ``coefficients`` (the one kernel encoding of the cost formula) and ``max_cost``.

So a walk of ``cost`` or ``max_batch_tokens`` reads: glue -> ``PlanConfig`` (options resolved once,
``limits``) -> the epoch layer (``bind``, once per plan) -> the planner -> its kernels.

Where the rule grows: a per-step cost term (a cost every step pays, so that needless steps cost
time) belongs beside ``cost`` in ``BatchLimits`` and in kernel units in ``BatchConstraint``; a
per-length batch limit (a length -> largest batch curve, e.g. from a memory model) likewise: the curve
in ``BatchLimits``, its lookup table up to ``max_len`` in ``BatchConstraint``, and ``fits`` asks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost import INT64_MAX, CostModel, clamp_budget


@dataclass(frozen=True)
class BatchLimits:
    """What a batch may hold and what it costs, as set (checked values).

    max_batch_tokens: the budget, padded tokens (count x longest), or real
        tokens (the sum of lengths) when ``pack``.
    max_batch_size: the cap on samples per batch.
    cost: the ``CostModel`` ranks are balanced under.
    max_step_cost: cap on a batch's cost, in cost units (None: none).
    pack: batches are packed (concatenated, no padding).
    max_length: the long-sample policy: longer samples are left out of
        every plan and counted (None: no limit). A lone sample over the
        budget is never left out: it is a batch of its own.
    max_cost: ``max_step_cost`` as the kernels' cap on scaled batch costs
        (``CostModel.cost_cap``; int64 max: none), computed once here.
    """

    max_batch_tokens: int
    max_batch_size: int
    cost: CostModel = field(default_factory=CostModel.quadratic)
    max_step_cost: float | None = None
    pack: bool = False
    max_length: int | None = None
    max_cost: int = field(init=False, default=INT64_MAX)

    def __post_init__(self) -> None:
        # raises, naming the value, when no batch can fit under the cap
        object.__setattr__(self, "max_cost", self.cost.cost_cap(self.max_step_cost))

    def too_long(self, lengths: np.ndarray) -> np.ndarray:
        """(n,) bool: the samples the long-sample policy leaves out."""
        if self.max_length is None:
            return np.zeros(lengths.shape[0], dtype=bool)
        return lengths > self.max_length

    def bind(self, lengths: np.ndarray, world_size: int) -> BatchConstraint:
        """The constraint of one plan of ``lengths`` ((N,) int64 >= 0, checked)
        at ``world_size``: the budget clamped and range-checked once (a
        ValueError when step costs could overflow int64)."""
        n = int(lengths.shape[0])
        max_len = int(lengths.max(initial=0))
        size = min(self.max_batch_size, max(n, 1))  # a cap above N never binds
        tokens = clamp_budget(self.max_batch_tokens, size, max_len)
        self.cost.check_range(max_len, tokens, size, world_size)
        return BatchConstraint(self, world_size, max_len, tokens, size)


@dataclass(frozen=True)
class BatchConstraint:
    """``BatchLimits`` bound to one plan: what its planner and kernels take.

    max_len: the plan's longest sample (0 without samples).
    max_tokens: the budget kernels work with: ``max_batch_tokens`` clamped to
        what a batch can hold (``clamp_budget``), range-checked.
    max_size: the size cap kernels work with, at most N (and >= 1).
    """

    limits: BatchLimits
    world_size: int
    max_len: int
    max_tokens: int
    max_size: int

    @property
    def cost(self) -> CostModel:
        return self.limits.cost

    @property
    def pack(self) -> bool:
        return self.limits.pack

    @property
    def max_cost(self) -> int:
        """The kernels' cap on a batch's scaled cost (int64 max: none)."""
        return self.limits.max_cost

    @property
    def coefficients(self) -> tuple[int, int]:
        """(ca, cb): a batch's scaled cost is ``count * L * (ca * L + cb)``."""
        return self.limits.cost.coefficients

    def fits(self, lengths: np.ndarray) -> bool:
        """Whether a batch of these samples ((n,) int64 lengths) is within the
        rule: at most ``max_size`` samples, the budget (count x longest, or the
        sum of lengths when packed) and the cost cap; a lone sample always fits."""
        n = int(lengths.shape[0])
        if n <= 1:
            return n == 1
        if n > self.max_size:
            return False
        if self.pack:
            cost = int(self.cost.packed_scaled(lengths).sum())
            return int(lengths.sum()) <= self.max_tokens and cost <= self.max_cost
        longest = int(lengths.max())
        return n * longest <= self.max_tokens and int(self.cost.scaled(n, longest)) <= self.max_cost
