"""Planner registry and the one validated entry point, ``make_plan``.

Every planner lives in its own folder here (``greedy/``, ``bucketed/``,
``shard_affine/``), declares a ``Planner`` (``base.py``) and takes its shared
kernel code from ``toolkit.py``; no planner imports a sibling. Adding a planner:
write one module (plan function + kernels beside it) that declares a
``Planner``, add one line to ``_BUILTIN`` below (or call ``register_planner``
from your own code), and run ``tests/planners/test_planner_contract.py``, which
checks the contract for every registered planner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.config import PlanConfig, check_epoch
from ..core.keywords import REQUIRED
from ..core.long_samples import DEFAULT_POLICY, too_long, warn_over_budget
from ..core.plan import Plan, index_dtype
from ..core.registry import PLANNERS, check_planner, get_planner
from ..core.types import FlagLike, IntLike, LengthsLike, NumberLike
from ..core.validation import coerce_lengths
from .base import ConstrainedPlanFunction, Option, PlanFunction, Planner, UnknownOptionError
from .bucketed.planner import PLANNER as BUCKETED
from .compile_notice import notice_if_cold
from .greedy.planner import PLANNER as GREEDY
from .shard_affine.planner import PLANNER as SHARD_AFFINE

__all__ = ["PLANNERS", "RECOMMENDED", "SEED_EXACT", "ConstrainedPlanFunction", "Option", "Planner", "PlanFunction",
           "UnknownOptionError", "check_planner", "get_planner", "make_plan", "plan_epoch", "register_planner"]

_BUILTIN = (GREEDY, BUCKETED, SHARD_AFFINE)
# The map-style sampler's default reproduces the seed; everything without a seed to match uses the best planner.
SEED_EXACT = GREEDY.name
RECOMMENDED = BUCKETED.name

# name -> Planner: the registry dict lives in core/registry.py (PlanConfig.build checks names against it)
PLANNERS.update({p.name: p for p in _BUILTIN})


def register_planner(planner: Planner | str, fn: PlanFunction | Callable[..., Plan] | None = None) -> Planner:
    """Register a ``Planner`` (or, for quick experiments, a bare plan function
    under a name: its options then pass through unchecked)."""
    if isinstance(planner, str):
        if fn is None:
            raise TypeError("register_planner(name, fn) needs the plan function, or pass a Planner")
        planner = Planner(planner, fn, options=None)
    if not isinstance(planner, Planner):
        raise TypeError(f"register_planner takes a Planner or (name, function), got {planner!r}")
    PLANNERS[planner.name] = planner
    return planner


def make_plan(lengths: LengthsLike, max_batch_tokens: NumberLike | PlanConfig = REQUIRED, max_batch_size: IntLike = 64,
              world_size: IntLike = 1, shuffle: FlagLike = True, drop_last: FlagLike = False, seed: IntLike = 42,
              epoch: IntLike = 0, planner: str = "greedy", long_samples: str = DEFAULT_POLICY,
              **options: Any) -> Plan:
    """Validate everything, then plan one epoch.

    lengths: (N,) integer lengths (list, numpy array or torch tensor).
    long_samples: samples longer than the budget alone (``core/long_samples.py``):
        ``"warn"`` (default: each planned alone, over the budget, and one
        ``LongSampleWarning`` per plan gives their count, the longest and the
        fix), ``"drop"`` (left out of the plan: ``Plan.too_long``, warned) or
        ``"raise"`` (a ValueError).
    options: the chosen planner's options (``PLANNERS[planner].options``).
    ``make_plan(lengths, config, epoch=e)`` with a ``PlanConfig`` (already
    validated) is the same call. Returns a Plan of global steps with one
    non-empty batch per rank.
    """
    if isinstance(max_batch_tokens, PlanConfig):
        if options or long_samples != DEFAULT_POLICY:
            given = sorted(options) + (["long_samples"] if long_samples != DEFAULT_POLICY else [])
            raise TypeError(f"make_plan(lengths, config) takes the planner options from the config (and "
                            f"long_samples from the config too), got {given} too; use "
                            f"config.replace(planner_options=..., long_samples=...)")
        config = max_batch_tokens
    else:
        config = PlanConfig.build(max_batch_tokens, max_batch_size, world_size, shuffle, drop_last, seed,
                                  planner, options, long_samples=long_samples)
    return plan_lengths(coerce_lengths(lengths), config, check_epoch(epoch), "make_plan: ")


def plan_lengths(lengths: np.ndarray, config: PlanConfig, epoch: int, who: str = "", stacklevel: int = 4) -> Plan:
    """``plan_epoch`` under the configuration's long-sample policy (``config.limits.long_samples``):
    samples longer than the budget are planned alone with one ``LongSampleWarning`` (``"warn"``), left
    out of the plan (``"drop"``: ``Plan.too_long``, warned) or refused (``"raise"``). lengths: (N,) int64,
    checked. who: the warning's prefix (the entry point)."""
    rule = config.limits
    budget = rule.max_batch_tokens
    out = too_long(lengths, None, rule.long_samples, budget=budget)  # raises under "raise"
    if out.size == 0:
        warn_over_budget(lengths, budget, rule.long_samples, who, stacklevel, max_length=False)
        return plan_epoch(lengths, config, epoch)
    warn_over_budget(lengths[out], budget, rule.long_samples, who, stacklevel, max_length=False)
    kept = np.delete(np.arange(lengths.shape[0], dtype=np.int64), out)
    plan = plan_epoch(lengths[kept], config, epoch)
    dtype = index_dtype(lengths.shape[0])
    leftover = None if plan.leftover is None else kept[plan.leftover].astype(dtype)
    return dataclasses.replace(plan, samples=kept[plan.samples].astype(dtype), leftover=leftover, too_long=out)


def plan_epoch(lengths: np.ndarray, config: PlanConfig, epoch: int, *, world_size: int | None = None,
               seed: int | None = None, drop_last: bool | None = None, step_cap: int | None = None,
               carry: bool = False) -> Plan:
    """Plan one epoch from checked input: lengths (N,) int64 >= 0 (as
    ``coerce_lengths`` returns them), a built ``PlanConfig`` (its options
    resolved once), an int epoch. ``world_size``, ``seed`` and ``drop_last``
    override the config's (a streaming window, an elastic segment: checked
    values); ``step_cap``, the plan's share of a larger plan's step limit (a
    streamed window's share of its epoch's: ``epoch/step_budget.py``); ``carry``, the plan's leftover is
    carried into the next window (``BatchConstraint.carry``). The batch rule is bound to
    these lengths once, here (``BatchLimits.bind``: the one budget clamp and
    overflow guard). The plan reports the fewest steps its settings allow
    (``Plan.fewest_steps``)."""
    c = config
    p = PLANNERS[c.options_planner]
    w = c.world_size if world_size is None else world_size
    constraint = c.limits.bind(lengths, w, step_cap, carry)
    # one log line before a first compile, which takes a minute on a small machine
    notice_if_cold(p.kernels)
    return p.run(lengths, constraint, w, c.shuffle, c.drop_last if drop_last is None else drop_last,
                 c.seed if seed is None else seed, epoch, c.resolved_options)
