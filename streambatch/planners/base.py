"""The planner contract: what every registered planner is and promises.

A planner is a ``Planner`` record: a name, a plan function, the options it
declares (name, default, check) and the cost models it can balance under.
``make_plan`` validates the common arguments once, checks the options against
the chosen planner's declarations and guards the cost range with the cost
model the plan will use; the plan function then receives only valid input.

The plan function's promises (``tests/planners/test_planner_contract.py`` checks all of
them for every registered planner):

- every planned step holds ``world_size`` non-empty batches;
- every sample appears exactly once, except that with ``drop_last=False`` the
  final step's empty slots are padded with repeats (``Plan.num_padded``), and
  with ``drop_last=True`` the samples it does not plan are returned in
  ``Plan.leftover`` (``num_dropped == len(leftover)``) — streaming carries
  them into the next window, so a planner that drops silently loses data;
- no batch holds more than ``max_batch_size`` samples or more than
  ``max_batch_tokens`` padded tokens (count x longest), except a lone sample
  longer than the budget; a planner that packs (``Planner.packs``: its
  ``pack`` option is True) counts real tokens instead (sum of lengths: the
  samples are concatenated, no padding);
- the plan is a pure function of its arguments: same input, same plan; other
  epochs (with shuffling) give other plans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..core.cost import ALL_KINDS, CostModel
from ..core.keywords import misspelled
from ..core.plan import Plan

PACK_OPTION = "pack"  # the option name that switches a planner to packed batches (``Planner.packs``)


class PlanFunction(Protocol):
    """``plan(lengths, max_batch_tokens, max_batch_size, world_size, shuffle,
    drop_last, seed, epoch, **options) -> Plan``.

    lengths: (N,) int64 >= 0, already validated; the scalars are validated
    Python ints/bools; options are the planner's declared options, checked.
    """

    def __call__(self, lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, world_size: int,
                 shuffle: bool, drop_last: bool, seed: int, epoch: int, **options: Any) -> Plan: ...


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
    """

    name: str
    # a PlanFunction; typed Callable[..., Plan] because each planner takes only its own declared options
    plan: Callable[..., Plan]
    options: tuple[Option, ...] | None = ()
    costs: tuple[str, ...] = ("quadratic",)
    summary: str = ""

    def __post_init__(self) -> None:
        bad = [c for c in self.costs if c not in ALL_KINDS]
        if not self.costs or bad:
            raise ValueError(f"planner {self.name!r}: costs must be a non-empty subset of {ALL_KINDS}, "
                             f"got {self.costs}")

    def __call__(self, lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, world_size: int,
                 shuffle: bool, drop_last: bool, seed: int, epoch: int, **options: Any) -> Plan:
        """The plan function itself (validated input only; ``make_plan`` validates)."""
        return self.plan(lengths, max_batch_tokens, max_batch_size, world_size, shuffle, drop_last, seed, epoch,
                         **options)

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
            hint += misspelled([u for u in unknown if u != PACK_OPTION], names)
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
