"""Planner registry and the one validated entry point, ``make_plan``."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .bucketed.plan import plan_bucketed
from .greedy.plan import plan_greedy
from ..core.config import PlanConfig, check_epoch
from ..core.plan import Plan
from ..core.validation import check_cost_range, coerce_lengths

# name -> function(lengths, max_batch_tokens, max_batch_size, world_size,
#                  shuffle, drop_last, seed, epoch, **options) -> Plan
PLANNERS: dict[str, Callable[..., Plan]] = {"greedy": plan_greedy, "bucketed": plan_bucketed}


def register_planner(name: str, fn: Callable[..., Plan]) -> None:
    PLANNERS[name] = fn


def check_planner(name: Any) -> str:
    if not isinstance(name, str) or name not in PLANNERS:
        raise ValueError(f"planner must be one of {sorted(PLANNERS)}, got {name!r}")
    return name


def make_plan(lengths: Any, max_batch_tokens: Any, max_batch_size: Any = 64, world_size: Any = 1,
              shuffle: bool = True, drop_last: bool = False, seed: Any = 42, epoch: Any = 0,
              planner: str = "greedy", **options: Any) -> Plan:
    """Validate everything, then plan one epoch.

    lengths: (N,) integer lengths (list, numpy array or torch tensor).
    ``make_plan(lengths, config, epoch=e)`` with a ``PlanConfig`` (already
    validated) is the same call. Returns a Plan of global steps with one
    non-empty batch per rank.
    """
    if isinstance(max_batch_tokens, PlanConfig):
        if options:
            raise TypeError(f"make_plan(lengths, config) takes the planner options from the config, got "
                            f"{sorted(options)} too; use config.replace(planner_options=...)")
        config = max_batch_tokens
    else:
        config = PlanConfig.build(max_batch_tokens, max_batch_size, world_size, shuffle, drop_last, seed,
                                  planner, options)
    return plan_epoch(coerce_lengths(lengths), config, check_epoch(epoch))


def plan_epoch(lengths: np.ndarray, config: PlanConfig, epoch: int) -> Plan:
    """Plan one epoch from checked input: lengths (N,) int64 >= 0 (as
    ``coerce_lengths`` returns them), a built ``PlanConfig``, an int epoch."""
    c = config
    check_cost_range(lengths, c.world_size, c.max_batch_tokens, c.max_batch_size)
    return PLANNERS[c.planner](lengths, c.max_batch_tokens, c.max_batch_size, c.world_size, c.shuffle,
                               c.drop_last, c.seed, epoch, **c.options)
