"""Planner registry and the one validated entry point, ``make_plan``."""

from __future__ import annotations

from typing import Any, Callable

from .bucketed.plan import plan_bucketed
from .greedy.plan import plan_greedy
from ..core.plan import Plan
from ..core.validation import check_budget, check_cost_range, check_flag, check_int, check_seed, coerce_lengths

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
    Returns a Plan of global steps with one non-empty batch per rank.
    """
    arr = coerce_lengths(lengths)
    tokens = check_budget(max_batch_tokens)
    size = check_int("max_batch_size", max_batch_size, 1)
    world = check_int("world_size", world_size, 1)
    seed = check_seed(seed)
    epoch = check_int("epoch", epoch, 0)
    fn = PLANNERS[check_planner(planner)]
    check_cost_range(arr, world, tokens, size)
    shuffle = check_flag("shuffle", shuffle)
    drop_last = check_flag("drop_last", drop_last)
    return fn(arr, tokens, size, world, shuffle, drop_last, seed, epoch, **options)
