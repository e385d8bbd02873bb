"""The options more than one built-in planner declares, defined once.

``cost``, ``max_step_cost``, ``pack``, ``max_steps`` and ``limit`` make up the batch
rule (``planners.base.CONSTRAINT_OPTIONS``: ``Planner.limits`` turns them into
a ``BatchLimits``); ``bucket_width`` sets the bucketed planner's length buckets
(and, in the shard-affine planner, those of the outliers it pools). A planner
declares them by listing these ``Option`` records.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..core.cost import CostModel, resolve_cost
from ..core.limits import resolve_limit
from ..core.validation import check_flag
from .base import Option

DEFAULT_BUCKET_WIDTH = 0.02
MIN_BUCKET_WIDTH = 0.001  # keeps the bucket count (~ ln(max_len) / width) in the tens of thousands


def check_bucket_width(width: Any) -> float:
    if isinstance(width, bool) or not isinstance(width, numbers.Real):
        raise TypeError(
            f"bucket_width must be a number in [{MIN_BUCKET_WIDTH}, 1], got {width!r} ({type(width).__name__})"
        )
    width = float(width)
    if not MIN_BUCKET_WIDTH <= width <= 1.0:
        raise ValueError(
            f"bucket_width must be in [{MIN_BUCKET_WIDTH}, 1] (relative width of a length bucket), got {width}; "
            f"the default {DEFAULT_BUCKET_WIDTH} keeps padding low while shuffling within buckets"
        )
    return width


def check_max_step_cost(max_step_cost: Any) -> float | None:
    if max_step_cost is None:
        return None
    if isinstance(max_step_cost, bool) or not isinstance(max_step_cost, numbers.Real):
        raise TypeError(
            f"max_step_cost must be a number > 0 (in cost units) or None, got {max_step_cost!r} "
            f"({type(max_step_cost).__name__})"
        )
    try:
        value = float(max_step_cost)
    except OverflowError:
        value = float("inf")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(
            f"max_step_cost must be a finite number > 0 (in cost units) or None for no cap, got {max_step_cost}"
        )
    return value


def check_pack(pack: Any) -> bool:
    return check_flag("pack", pack)


def check_max_steps(max_steps: Any) -> int | None:
    if max_steps is None:
        return None
    if isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 0:
        raise ValueError(f"max_steps must be an integer >= 0 or None (the default: the planner's bound, 1.05 x the "
                         f"fewest steps + 1), got {max_steps!r}")
    return int(max_steps)


BUCKET_WIDTH = Option("bucket_width", DEFAULT_BUCKET_WIDTH, check_bucket_width,
                      "relative width of a length bucket, in [0.001, 1]: wider shuffles more and pads more")
COST = Option("cost", CostModel.quadratic(), resolve_cost, "the CostModel ranks are balanced under")
MAX_STEP_COST = Option("max_step_cost", None, check_max_step_cost, "cap on every batch's cost (cost units), or None")
PACK = Option("pack", False, check_pack, "packed, padding-free batches: sum(L) <= max_batch_tokens, varlen cost")
MAX_STEPS = Option("max_steps", None, check_max_steps,
                   "the most steps a plan may take (None: the planner's bound, 1.05 x the fewest possible + 1)")
LIMIT = Option("limit", None, resolve_limit,
               "the largest batch per padded length, a hard limit beside the budget: a LimitCurve, a MemoryModel "
               "with its curve, a limit/memory/bucket-profile file, or a per-length table (None: no curve)")
# the cost kinds a planner with the ``cost`` option balances under
COST_KINDS = ("quadratic", "linear", "quadratic_duration", "step")
