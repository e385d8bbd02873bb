"""The options more than one built-in planner declares, defined once.

``cost``, ``max_step_cost`` and ``pack`` make up the batch rule
(``planners.base.CONSTRAINT_OPTIONS``: ``Planner.limits`` turns them into a
``BatchLimits``); ``bucket_width`` sets the bucketed planner's length buckets
(and, in the shard-affine planner, those of the outliers it pools). A planner
declares them by listing these ``Option`` records.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..core.cost import CostModel, resolve_cost
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


BUCKET_WIDTH = Option("bucket_width", DEFAULT_BUCKET_WIDTH, check_bucket_width,
                      "relative width of a length bucket, in [0.001, 1]: wider shuffles more and pads more")
COST = Option("cost", CostModel.quadratic(), resolve_cost, "the CostModel ranks are balanced under")
MAX_STEP_COST = Option("max_step_cost", None, check_max_step_cost, "cap on every batch's cost (cost units), or None")
PACK = Option("pack", False, check_pack, "packed, padding-free batches: sum(L) <= max_batch_tokens, varlen cost")
# the cost kinds a planner with the ``cost`` option balances under
COST_KINDS = ("quadratic", "linear", "quadratic_duration", "step")
