"""The planner contract: what every registered planner is and promises.

A planner is a ``Planner`` record: a name, a plan function, the options it
declares (name, default, check) and the cost models it can balance under.
``make_plan`` validates the common arguments once, checks the options against
the chosen planner's declarations (``PlanConfig``: resolved once), and binds
the batch rule to the plan's lengths once (``core/constraint.py``: the budget
clamped and its cost range guarded); the plan function then receives only
valid input.

Two forms of plan function: the plain ``PlanFunction`` (the budget and cap
as numbers, every option as a keyword: what a planner of your own writes) and,
with ``Planner(takes_constraint=True)`` (every built-in planner), the
``ConstrainedPlanFunction``, which takes the ``BatchConstraint`` in their place
and its own options only: the constraint carries ``cost``, ``max_step_cost``,
``pack``, ``max_steps`` and ``limit`` (``CONSTRAINT_OPTIONS``).

The plan function's promises (``tests/planners/test_planner_contract.py`` checks all of
them for every registered planner):

- every planned step holds ``world_size`` non-empty batches;
- every sample appears exactly once, except that with ``drop_last=False`` the
  final step's empty slots are padded with repeats (``Plan.num_padded``), and
  with ``drop_last=True`` the samples it does not plan are returned in
  ``Plan.leftover`` (``num_dropped == len(leftover)``) — streaming carries
  them into the next window, so a planner that drops silently loses data;
- with ``drop_last=True`` and shuffling, over 8 epochs every sample is
  trained at least once: what an epoch's own ``drop_last`` leaves out is
  only what cannot give every rank a non-empty batch, rotated from epoch to
  epoch (the bounded planners: ``tail.epoch_drop_last``, unless the
  constraint is ``carry``: a streamed window's leftover, carried on; the
  seed-exact greedy planner by its shuffled order);
- no batch holds more than ``max_batch_size`` samples or more than
  ``max_batch_tokens`` padded tokens (count x longest), except a lone sample
  longer than the budget; a planner that packs (``Planner.packs``: its
  ``pack`` option is True) counts real tokens instead (sum of lengths: the
  samples are concatenated, no padding); with the ``limit`` option (a
  limit curve, ``core/limits.py``) no batch holds more samples than the
  curve allows at its longest length (packed: no more tokens than that many
  samples of its longest length), except a lone sample; a planner that
  does not declare ``limit`` refuses it (``UnknownOptionError``);
- the plan is a pure function of its arguments: same input, same plan; other
  epochs (with shuffling) give other plans;
- unless the planner says otherwise (``Planner.step_slack`` None: the
  seed-exact greedy planner, which reproduces the seed sampler's batches),
  at most ``step_limit(fewest, step_slack)`` steps: 1.05 x the fewest any
  valid plan can have + 1 by default (``core/bounds.py``; packed: the fewest
  is a lower bound; the shard-affine planner declares 1.10 x), or the
  ``max_steps`` option where the planner declares it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..core.bounds import STEP_SLACK_DIV
from ..core.constraint import BatchConstraint, BatchLimits
from ..core.cost import ALL_KINDS, CostModel
from ..core.keywords import misspelled
from ..core.long_samples import DEFAULT_POLICY
from ..core.plan import Plan

PACK_OPTION = "pack"  # the option name that switches a planner to packed batches (``Planner.packs``)
MAX_STEPS_OPTION = "max_steps"  # the option name of a plan's step cap (``BatchLimits.max_steps``)
LIMIT_OPTION = "limit"  # the option name of a per-length batch limit (``BatchLimits.limit``, a LimitCurve)
# The options that make up the batch rule (``BatchLimits``) rather than a planner's own settings.
CONSTRAINT_OPTIONS = ("cost", "max_step_cost", PACK_OPTION, MAX_STEPS_OPTION, LIMIT_OPTION)


class PlanFunction(Protocol):
    """``plan(lengths, max_batch_tokens, max_batch_size, world_size, shuffle,
    drop_last, seed, epoch, **options) -> Plan``.

    lengths: (N,) int64 >= 0, already validated; the scalars are validated
    Python ints/bools; options are the planner's declared options, checked.
    """

    def __call__(self, lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, world_size: int,
                 shuffle: bool, drop_last: bool, seed: int, epoch: int, **options: Any) -> Plan: ...


class ConstrainedPlanFunction(Protocol):
    """``plan(lengths, constraint, world_size, shuffle, drop_last, seed,
    epoch, **own_options) -> Plan`` (``Planner(takes_constraint=True)``).

    lengths: (N,) int64 >= 0, already validated; constraint: the batch rule
    bound to these lengths (``BatchConstraint``); own_options: the declared
    options other than ``CONSTRAINT_OPTIONS``, checked, defaults filled in.
    """

    def __call__(self, lengths: np.ndarray, constraint: BatchConstraint, world_size: int, shuffle: bool,
                 drop_last: bool, seed: int, epoch: int, **options: Any) -> Plan: ...


class UnknownOptionError(ValueError, TypeError):
    """An option the chosen planner does not declare. Both a ValueError (a bad
    value for ``**options``) and a TypeError (what Python raises for an
    unexpected keyword), so either ``except`` catches it."""


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Option:
    """A planner option: ``check(value)`` returns the validated value or raises
    a ValueError/TypeError naming the value, the allowed range and the fix."""

    name: str
    default: Any = None
    check: Callable[[Any], Any] = _as_is
    help: str = ""


@dataclass(frozen=True)
class Planner:
    """A registered planner (see the module docstring for the contract).

    options: the declared options; ``None`` passes any keyword through
    unchecked (for quick experiments; declare them before relying on it).
    costs: the ``CostModel`` kinds the planner balances under; a planner
    without a ``cost`` option always uses the first (the seed's quadratic).
    takes_constraint: ``plan`` is a ``ConstrainedPlanFunction`` (else a
    ``PlanFunction``).
    kernels: the module holding the planner's cached Numba kernels, whose
    cache says whether a first plan compiles them (``compile_notice.py``).
    step_slack: the planner's step bound: at most ``fewest + fewest //
    step_slack + 1`` steps (``core/bounds.py``'s ``step_limit``; the default
    20: 1.05 x the fewest + 1; the contract tests check it); None exempts
    it (the seed-exact greedy planner: its batches are the seed's). It
    enters the batch rule (``BatchLimits.step_slack``) with the options.
    """

    name: str
    # a PlanFunction or ConstrainedPlanFunction; Callable[..., Plan]: each planner takes only its own options
    plan: Callable[..., Plan]
    options: tuple[Option, ...] | None = ()
    costs: tuple[str, ...] = ("quadratic",)
    summary: str = ""
    takes_constraint: bool = False
    kernels: str = ""
    step_slack: int | None = STEP_SLACK_DIV

    @property
    def bounded(self) -> bool:
        """Whether the planner promises a step bound (``step_slack``)."""
        return self.step_slack is not None

    def __post_init__(self) -> None:
        bad = [c for c in self.costs if c not in ALL_KINDS]
        if not self.costs or bad:
            raise ValueError(f"planner {self.name!r}: costs must be a non-empty subset of {ALL_KINDS}, "
                             f"got {self.costs}")

    def __call__(self, lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, world_size: int,
                 shuffle: bool, drop_last: bool, seed: int, epoch: int, **options: Any) -> Plan:
        """A plan from the plain arguments (validated lengths and numbers; the
        options are checked here): for callers outside the library's own
        path, which resolves options once per configuration (``PlanConfig``)."""
        resolved = self.resolve(options)
        constraint = self.limits(max_batch_tokens, max_batch_size, resolved).bind(lengths, world_size)
        return self.run(lengths, constraint, world_size, shuffle, drop_last, seed, epoch, resolved)

    def run(self, lengths: np.ndarray, constraint: BatchConstraint, world_size: int, shuffle: bool,
            drop_last: bool, seed: int, epoch: int, resolved: Mapping[str, Any]) -> Plan:
        """Call the plan function in its form: the constraint, or (a plain
        ``PlanFunction``) the budget and cap as set with every option. The
        plan reports the fewest steps (``Plan.fewest_steps``): the planner's
        own, or else the constraint's ``step_bound``.

        resolved: this planner's options, checked, defaults filled in."""
        if self.takes_constraint:
            own = {k: v for k, v in resolved.items() if k not in CONSTRAINT_OPTIONS}
            plan = self.plan(lengths, constraint, world_size, shuffle, drop_last, seed, epoch, **own)
        else:
            limits = constraint.limits
            plan = self.plan(lengths, limits.max_batch_tokens, limits.max_batch_size, world_size, shuffle, drop_last,
                             seed, epoch, **resolved)
        if plan.fewest_steps is None:  # a planner that does not report it: the fewest its settings allow
            bound = constraint.step_bound(lengths, drop_last)
            plan = dataclasses.replace(plan, fewest_steps=bound.steps, fewest_exact=bound.exact)
        return plan

    def option_names(self) -> list[str]:
        return [o.name for o in self.options or ()]

    def resolve(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The checked options, defaults filled in; an unknown name raises
        ``UnknownOptionError`` listing this planner's options."""
        if self.options is None:
            return dict(options)
        names = self.option_names()
        unknown = sorted(set(options) - set(names))
        if unknown:
            valid = f"its options are {names}" if names else "it takes no options"
            hint = "; packed batches are planner='bucketed', pack=True" if PACK_OPTION in unknown else ""
            # the entry points pass every keyword they do not take on as an option: name a misspelled one
            hint += misspelled([u for u in unknown if u not in (PACK_OPTION, LIMIT_OPTION)], names)
            if LIMIT_OPTION in unknown:
                hint += ("; limit curves are honoured by planner='bucketed' and planner='shard_affine' (the greedy "
                         "planner reproduces the seed's batches: give it a token budget within the curve, "
                         "LimitCurve.budget_within)")
            raise UnknownOptionError(f"planner {self.name!r} got unknown option(s) {unknown}; {valid}{hint}")
        out = {}
        for o in self.options:
            out[o.name] = o.check(options[o.name]) if o.name in options else o.default
        cost = out.get("cost")
        if isinstance(cost, CostModel) and cost.kind not in self.costs:
            raise ValueError(f"planner {self.name!r} balances under cost kinds {list(self.costs)}, not {cost.kind!r}")
        return out

    def packs(self, resolved: Mapping[str, Any]) -> bool:
        """Whether plans with these (resolved) options are packed: batches
        within ``sum(L) <= max_batch_tokens`` rather than count x longest.
        The option that says so is named ``pack`` in every planner."""
        return bool(resolved.get(PACK_OPTION, False)) and PACK_OPTION in self.option_names()

    def cost_model(self, resolved: Mapping[str, Any]) -> CostModel:
        """The cost model a plan with these (resolved) options balances under."""
        cost = resolved.get("cost")
        return cost if isinstance(cost, CostModel) else CostModel(self.costs[0])

    def limits(self, max_batch_tokens: int, max_batch_size: int, resolved: Mapping[str, Any],
               max_length: int | None = None, long_samples: str = DEFAULT_POLICY) -> BatchLimits:
        """The batch rule of plans with these (resolved) options (and the
        planner's step bound, ``step_slack``; the long-sample limit and policy)."""
        names = self.option_names()
        step_cap = resolved.get("max_step_cost") if "max_step_cost" in names else None
        max_steps = resolved.get(MAX_STEPS_OPTION) if MAX_STEPS_OPTION in names else None
        limit = resolved.get(LIMIT_OPTION) if LIMIT_OPTION in names else None
        return BatchLimits(max_batch_tokens, max_batch_size, self.cost_model(resolved), step_cap,
                           self.packs(resolved), max_length, long_samples, max_steps=max_steps,
                           step_slack=self.step_slack, limit=limit)
