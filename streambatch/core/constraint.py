"""The batch rule, written once and asked by every planner (as lhotse's ``TimeConstraint`` holds its limit).

Two objects, one per moment a setting becomes known:

- ``BatchLimits``: the rule as set — token budget, size cap, cost model, cost cap, packing, the
  long-sample limit and policy (``max_length``, ``long_samples``), and the plan's step limit
  (``max_steps``, or the planner's bound ``step_slack``: at most ``fewest + fewest // step_slack + 1``
  steps) with the default per-step term (``step_share``) a planner weighs candidate plans by — checked
  once per configuration
  (``PlanConfig.limits``: the planner's options resolved once). It knows nothing of lengths.
- ``BatchConstraint``: the limits bound to one plan's lengths and world (``BatchLimits.bind``), built
  once per plan by the epoch layer and passed down to the planner, whose kernels take its numbers:
  ``max_tokens`` (the budget clamped to what a batch can hold and range-checked against int64),
  ``max_size``, ``coefficients`` (the one kernel encoding of the cost formula) and ``max_cost``;
  its ``step_bound`` (the fewest steps these lengths can take, ``core/bounds.py``), ``step_limit``
  (the most a plan may take; the epoch layer binds a streamed window with its share of the epoch's
  limit, ``step_cap``) and ``default_step_cost``.

So a walk of ``cost`` or ``max_batch_tokens`` reads: glue -> ``PlanConfig`` (options resolved once,
``limits``) -> the epoch layer (``bind``, once per plan) -> the planner -> its kernels.

Where the rule grows: the per-step term is here (``step_share``: a step is assumed to cost that share
of a full batch of median-length samples on top of its costliest batch, the default objective's
stand-in for a measured ``c0``; a fitted step model's own ``c0`` lives in its ``CostModel``); the
per-length batch limit (``limit``: a ``LimitCurve``, length -> largest batch, e.g. from a memory
model) likewise: the curve in ``BatchLimits``, its lookup table up to ``max_len`` in
``BatchConstraint`` (``size_table``), and ``fits`` asks it.

What the curve means. Padded: a batch of ``n`` samples whose longest is ``L`` fits when ``n <=
size_table[L]`` (beside the budget, cap and cost cap). Packed: a batch of ``T`` tokens whose longest
sample is ``L`` is read as ``ceil(T / L)`` samples padded to ``L`` (``limits.BatchShapes``: its memory
is at most that padded batch's), so it fits when ``T <= size_table[L] * L`` (``token_table``). A lone
sample is always a batch, as under the budget. The curve is non-increasing in length (``LimitCurve``
takes the running minimum from short to long: a longer padding never holds more samples), which keeps
the longest-first fill the fewest batches (``core/bounds.py``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bounds import STEP_SLACK_DIV, StepBound, fewest_batches, fewest_steps, step_bound, step_limit
from .cost import INT64_MAX, CostModel, clamp_budget
from .long_samples import DEFAULT_POLICY

# The default per-step term: a step costs this share of a full batch's cost at the median length on top of its
# costliest batch (optimizer, gradient all-reduce, launches); what candidate plans are weighed by when the cost
# model has no measured per-step cost of its own.
STEP_SHARE = 0.1


@dataclass(frozen=True)
class BatchLimits:
    """What a batch may hold and what it costs, as set (checked values).

    max_batch_tokens: the budget, padded tokens (count x longest), or real
        tokens (the sum of lengths) when ``pack``.
    max_batch_size: the cap on samples per batch.
    cost: the ``CostModel`` ranks are balanced under.
    max_step_cost: cap on a batch's cost, in cost units (None: none).
    pack: batches are packed (concatenated, no padding).
    max_length: the long-sample limit: longer samples are left out of
        every plan and counted (None: no limit).
    long_samples: the long-sample policy (``core/long_samples.py``):
        ``"warn"`` (a lone sample over the budget is a batch of its own,
        warned about), ``"drop"`` (it is left out too, ``too_long``) or
        ``"raise"`` (checked by the entry points).
    max_steps: the most steps a plan may take (the ``max_steps`` option;
        None: the planner's bound, ``step_slack``).
    step_slack: the planner's bound: a plan takes at most ``fewest +
        fewest // step_slack + 1`` steps (20: 1.05 x the fewest + 1; the
        planner's ``Planner.step_slack``); None: no bound (the seed-exact
        greedy planner).
    step_share: the default per-step term (``STEP_SHARE``, see
        ``default_step_cost``).
    limit: the largest batch per padded length (a ``LimitCurve``, the
        ``limit`` option), or None.
    max_cost: ``max_step_cost`` as the kernels' cap on scaled batch costs
        (``CostModel.cost_cap``; int64 max: none), computed once here.
    """

    max_batch_tokens: int
    max_batch_size: int
    cost: CostModel = field(default_factory=CostModel.quadratic)
    max_step_cost: float | None = None
    pack: bool = False
    max_length: int | None = None
    long_samples: str = DEFAULT_POLICY
    max_steps: int | None = None
    step_slack: int | None = STEP_SLACK_DIV
    step_share: float = STEP_SHARE
    limit: Any = None  # LimitCurve | None (core/limits.py)
    max_cost: int = field(init=False, default=INT64_MAX)

    def __post_init__(self) -> None:
        # raises, naming the value, when no batch can fit under the cap
        object.__setattr__(self, "max_cost", self.cost.cost_cap(self.max_step_cost))

    @property
    def leaves_out(self) -> bool:
        """Whether the long-sample policy may leave samples out (``max_length`` set, or ``"drop"``)."""
        return self.max_length is not None or self.long_samples == "drop"

    def kept(self, lengths: np.ndarray) -> np.ndarray:
        """The (k,) int64 ``lengths`` the long-sample policy keeps (``lengths`` itself when it leaves none out)."""
        return lengths[~self.too_long(lengths)] if self.leaves_out else lengths

    def too_long(self, lengths: np.ndarray) -> np.ndarray:
        """(n,) bool: the samples the long-sample policy leaves out: longer than ``max_length`` and, with
        ``long_samples="drop"``, than the budget alone."""
        out = np.zeros(lengths.shape[0], dtype=bool) if self.max_length is None else lengths > self.max_length
        if self.long_samples == "drop":
            out |= lengths > self.max_batch_tokens
        return out

    def bind(self, lengths: np.ndarray, world_size: int, step_cap: int | None = None,
             carry: bool = False) -> BatchConstraint:
        """The constraint of one plan of ``lengths`` ((N,) int64 >= 0, checked)
        at ``world_size``: the budget clamped and range-checked once (a
        ValueError when step costs could overflow int64). step_cap: this
        plan's share of a larger plan's step limit (a streamed window's share
        of its epoch's, ``epoch/step_budget.py``), in place of the limits'.
        carry: the plan's leftover is carried into a later plan (a streamed
        window before the epoch's last; ``BatchConstraint.carry``)."""
        n = int(lengths.shape[0])
        max_len = int(lengths.max(initial=0))
        size = min(self.max_batch_size, max(n, 1))  # a cap above N never binds
        tokens = clamp_budget(self.max_batch_tokens, size, max_len)
        self.cost.check_range(max_len, tokens, size, world_size)
        table = NO_TABLE if self.limit is None else self.limit.size_table(max_len, size)
        if self.limit is not None and max_len > self.limit.max_length:
            over_curve_warning(self.limit)
        return BatchConstraint(self, world_size, max_len, tokens, size, step_cap, table, carry)

    def fewest_steps(self, lengths: np.ndarray, world_size: int, drop_last: bool) -> int:
        """The fewest steps of ``lengths`` ((n,) int64 >= 0) under the rule as
        set (the budget and cap unclamped: an epoch's accounting over windows,
        ``epoch/step_budget.py``; the plan of one window asks its constraint's
        ``step_bound``)."""
        table = None
        if self.limit is not None and lengths.shape[0]:
            table = self.limit.size_table(int(lengths.max()), self.max_batch_size)
        b = fewest_batches(lengths, self.max_batch_tokens, self.max_batch_size, self.pack, self.cost, self.max_cost,
                           table)
        return fewest_steps(b, world_size, drop_last)

    def limit_of(self, fewest: int) -> int | None:
        """The most steps a plan whose fewest possible is ``fewest`` may take
        by the planner's bound (``step_limit``; None: unbounded)."""
        return None if self.step_slack is None else step_limit(fewest, self.step_slack)


def over_curve_warning(limit: Any) -> None:
    """Warn (once per curve, Python's warning registry) that samples are longer than the limit curve reaches."""
    warnings.warn(f"samples are longer than the limit curve ({limit.source}) reaches ({limit.max_length} length "
                  f"units): each is planned as a batch of its own, which the curve says does not fit. Is the curve "
                  f"in the lengths' units (a bucket profile in seconds: LimitCurve.from_profile(path, "
                  f"frames_per_second=...))? Leave such samples out with max_length={limit.max_length}, or "
                  f"calibrate up to the longest length", UserWarning, stacklevel=3)


NO_TABLE = np.zeros(0, dtype=np.int64)  # no curve: what kernels take for ``size_table`` (their branch to skip it)


@dataclass(frozen=True)
class BatchConstraint:
    """``BatchLimits`` bound to one plan: what its planner and kernels take.

    max_len: the plan's longest sample (0 without samples).
    max_tokens: the budget kernels work with: ``max_batch_tokens`` clamped to
        what a batch can hold (``clamp_budget``), range-checked.
    max_size: the size cap kernels work with, at most N (and >= 1).
    step_cap: this plan's share of a larger plan's step limit (``bind``'s),
        or None: the limits' own (``max_steps``, else the planner's bound).
    size_table: (max_len + 1,) int64 the largest batch at each padded length
        (the curve, within [1, max_size], non-increasing), or (0,): no curve.
    carry: with ``drop_last``, what the plan leaves out is carried into a
        later plan (a streamed window before the epoch's last), so a planner
        may leave out all that cannot complete a step; False (an epoch's own
        ``drop_last``): what it leaves out is not trained this epoch, so it
        leaves out as little as it can, rotating it over epochs
        (``planners/tail.py``; the plans ``epoch_drop_last`` weighs are made
        with ``carry``: the planner's own rule).
    """

    limits: BatchLimits
    world_size: int
    max_len: int
    max_tokens: int
    max_size: int
    step_cap: int | None = None
    size_table: np.ndarray = field(default_factory=lambda: NO_TABLE, compare=False, repr=False)

    @property
    def curved(self) -> bool:
        """Whether a limit curve binds this plan (``size_table`` non-empty)."""
        return self.size_table.shape[0] > 0

    @property
    def token_table(self) -> np.ndarray:
        """(max_len + 1,) int64 the most tokens a packed batch whose longest is L
        may hold: ``min(max_tokens, size_table[L] * L)``, or (0,)."""
        if not self.curved:
            return NO_TABLE
        got = self.__dict__.get("_token_table")
        if got is None:
            L = np.arange(self.size_table.shape[0], dtype=np.int64)
            got = np.minimum(self.max_tokens, self.size_table * L)
            object.__setattr__(self, "_token_table", got)
        return got
    carry: bool = False

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
        sum of lengths when packed), the cost cap and the limit curve (module
        docstring); a lone sample always fits."""
        n = int(lengths.shape[0])
        if n <= 1:
            return n == 1
        if n > self.max_size:
            return False
        longest = int(lengths.max())
        if self.pack:
            cost = int(self.cost.packed_scaled(lengths).sum())
            tokens = int(lengths.sum())
            if self.curved and tokens > int(self.token_table[longest]):
                return False
            return tokens <= self.max_tokens and cost <= self.max_cost
        if self.curved and n > int(self.size_table[longest]):
            return False
        return n * longest <= self.max_tokens and int(self.cost.scaled(n, longest)) <= self.max_cost

    def step_bound(self, lengths: np.ndarray, drop_last: bool,
                   histogram: tuple[np.ndarray, np.ndarray] | None = None) -> StepBound:
        """The fewest steps a valid plan of these lengths ((N,) int64, the ones
        bound) can take under this rule (``core/bounds.py``: exact for padded
        batches, a lower bound for packed ones). histogram:
        ``length_histogram(lengths)`` if the caller has it."""
        return step_bound(lengths, self.max_tokens, self.max_size, self.world_size, drop_last, self.pack, self.cost,
                          self.max_cost, histogram, self.size_table if self.curved else None)

    def step_limit(self, fewest: int) -> int | None:
        """The most steps this plan may take when the fewest possible is
        ``fewest``: the step cap it was bound with (raised to ``fewest`` if
        below: the plan cannot do better, and the larger plan's limit rests on
        the slack of its other parts), else ``max_steps`` when set (a
        ValueError naming it when below ``fewest``), else the planner's bound
        (None: unbounded)."""
        if self.step_cap is not None:
            return max(self.step_cap, fewest)
        max_steps = self.limits.max_steps
        if max_steps is None:
            return self.limits.limit_of(fewest)
        if max_steps < fewest:
            what = "a lower bound of the steps these lengths can take packed" if self.pack else \
                "the fewest steps these lengths can take"
            slack = self.limits.step_slack
            bound = "no limit" if slack is None else f"{1 + 1 / slack:.2f} x fewest + 1"
            raise ValueError(f"max_steps={max_steps} is below {what} with this budget, size cap and world size "
                             f"({fewest}); raise it, or leave it None (the planner's bound: {bound})")
        return max_steps

    def default_step_cost(self, lengths: np.ndarray) -> float:
        """The default per-step term (cost units): ``step_share`` of the cost
        of a full batch of median-length samples. lengths: (N,) int64, N >= 1."""
        med = max(1, int(np.partition(lengths, lengths.shape[0] // 2)[lengths.shape[0] // 2]))
        full = max(1, min(self.max_size, self.max_tokens // med))
        if self.curved:
            full = min(full, int(self.size_table[min(med, self.max_len)]))
        return self.limits.step_share * float(self.cost.batch_cost(full, med))
