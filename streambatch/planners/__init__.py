"""Planner registry and the one validated entry point, ``make_plan``.

Adding a planner: write one module (plan function + kernels beside it) that
declares a ``Planner`` (``base.py``), add one line to ``_BUILTIN`` below (or
call ``register_planner`` from your own code), and run
``tests/test_planner_contract.py``, which checks the contract for every
registered planner.
"""

from __future__ import annotations

from typing import Any

from ..core.plan import Plan
from ..core.validation import check_budget, check_flag, check_int, check_seed, coerce_lengths
from .base import Option, Planner, PlanFunction, UnknownOptionError
from .bucketed.plan import PLANNER as BUCKETED
from .greedy.plan import PLANNER as GREEDY

__all__ = ["PLANNERS", "RECOMMENDED", "SEED_EXACT", "Option", "Planner", "PlanFunction", "UnknownOptionError", "check_planner", "get_planner",
           "make_plan", "register_planner"]

_BUILTIN = (GREEDY, BUCKETED)
# The map-style sampler's default reproduces the seed; everything without a seed to match uses the best planner.
SEED_EXACT = GREEDY.name
RECOMMENDED = BUCKETED.name

# name -> Planner
PLANNERS: dict[str, Planner] = {p.name: p for p in _BUILTIN}


def register_planner(planner: Planner | str, fn: PlanFunction | None = None) -> Planner:
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


def check_planner(name: Any) -> str:
    """``name`` if it is a registered planner, else a ValueError listing them."""
    if not isinstance(name, str) or name not in PLANNERS:
        raise ValueError(f"planner must be one of {sorted(PLANNERS)}, got {name!r}")
    return name


def get_planner(name: Any) -> Planner:
    return PLANNERS[check_planner(name)]


def make_plan(lengths: Any, max_batch_tokens: Any, max_batch_size: Any = 64, world_size: Any = 1,
              shuffle: bool = True, drop_last: bool = False, seed: Any = 42, epoch: Any = 0,
              planner: str = "greedy", **options: Any) -> Plan:
    """Validate everything, then plan one epoch.

    lengths: (N,) integer lengths (list, numpy array or torch tensor).
    options: the chosen planner's options (``PLANNERS[planner].options``).
    Returns a Plan of global steps with one non-empty batch per rank.
    """
    arr = coerce_lengths(lengths)
    tokens = check_budget(max_batch_tokens)
    size = check_int("max_batch_size", max_batch_size, 1)
    world = check_int("world_size", world_size, 1)
    seed = check_seed(seed)
    epoch = check_int("epoch", epoch, 0)
    p = get_planner(planner)
    shuffle = check_flag("shuffle", shuffle)
    drop_last = check_flag("drop_last", drop_last)
    resolved = p.resolve(options)
    if arr.size:
        # One overflow guard, owned by the cost model the plan balances under.
        lmax = int(arr.max())
        cap = min(size, arr.size)  # a cap above N never binds
        p.cost_model(resolved).check_range(lmax, min(tokens, cap * max(lmax, 1) + 1), cap, world)
    return p.plan(arr, tokens, size, world, shuffle, drop_last, seed, epoch, **resolved)
