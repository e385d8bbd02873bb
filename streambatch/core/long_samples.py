"""Long samples: what happens to samples longer than a recipe allows (``max_length``) or than a batch holds.

Two kinds of long sample, one policy (``long_samples``) shared by ``make_plan``, ``DynamicBatchSampler``,
``StreamingBatches`` and the command line (``--long-samples``):

- over ``max_length`` (the recipe's limit, when set; many recipes filter long clips: a 160 s clip in a
  corpus of 5 s prompts sets the time of the step it lands in, see ``streambatch plan``'s outlier note);
- over the budget: a sample longer than ``max_batch_tokens`` alone, which no batch can hold within it. A
  planner gives it a batch of its own, over the budget: on a GPU the batch that runs out of memory hours in.

The policy:

- ``"warn"`` (default): samples over ``max_length`` are left out of every plan, counted
  (``num_too_long``) and logged; samples over the budget are planned alone, each in a batch of its own,
  and one ``LongSampleWarning`` per plan (the sampler and the streaming dataset: per dataset, at
  construction) gives their count, the longest and the fix;
- ``"drop"``: samples over ``max_length`` or over the budget are left out of every plan, counted
  (``num_too_long``) and warned about;
- ``"raise"``: any such sample is a ``ValueError`` naming the count, the longest and the fix.

``long_samples`` enters the configuration's fingerprint (``PlanConfig.key``) only as ``"drop"``, the one
value that changes plans beyond ``max_length`` (so states saved before it existed still load). Lengths
are in the planner's units (frames, tokens); ``seconds_to_frames`` converts a duration limit.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import numpy as np

from .units import MAX_LENGTH

POLICIES = ("warn", "drop", "raise")
DEFAULT_POLICY = "warn"


class LongSampleWarning(UserWarning):
    """Samples longer than the budget were planned alone, over it (``long_samples="warn"``), or left out
    (``"drop"``). ``warnings.simplefilter("error", LongSampleWarning)`` makes it an error; the policy
    ``long_samples="raise"`` does the same with a ValueError."""


def check_long_samples(long_samples: Any) -> str:
    """The policy, validated: a ValueError naming the allowed values otherwise."""
    if not isinstance(long_samples, str) or long_samples not in POLICIES:
        raise ValueError(f"long_samples must be one of {POLICIES} (what to do with samples longer than "
                         f"max_length or than the budget alone; default {DEFAULT_POLICY!r}), got {long_samples!r}")
    return long_samples


def check_max_length(max_length: Any, long_samples: Any = DEFAULT_POLICY) -> tuple[int | None, str]:
    """Validated (max_length or None, policy)."""
    long_samples = check_long_samples(long_samples)
    if max_length is None:
        return None, long_samples
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Real) or max_length != int(max_length):
        raise TypeError(f"max_length must be a whole number of length units (frames, tokens) or None, got "
                        f"{max_length!r}; convert seconds with streambatch.seconds_to_frames(seconds, fps)")
    value = int(max_length)
    if not 1 <= value < MAX_LENGTH:
        raise ValueError(f"max_length must be in [1, 2**62) length units, got {value}; pass None for no limit")
    return value, long_samples


def too_long(lengths: np.ndarray, max_length: int | None, long_samples: str, where: str = "",
             budget: int | None = None) -> np.ndarray:
    """(k,) int64 indices of the samples of ``lengths`` ((N,) int64) the policy leaves out: longer than
    ``max_length`` (none when it is None) and, with ``long_samples="drop"``, longer than ``budget`` (the
    token budget; None: not checked). With ``"raise"`` any sample over either is a ValueError instead;
    ``where`` names the source."""
    over = np.flatnonzero(lengths > max_length) if max_length is not None else np.zeros(0, dtype=np.int64)
    if long_samples == "raise" and over.size:
        first = int(over[0])
        raise ValueError(
            f"{over.size:,} sample(s){where} are longer than max_length={max_length:,} (the first is sample "
            f"{first}, length {int(lengths[first]):,}; the longest {int(lengths[over].max()):,}); raise "
            "max_length, or pass long_samples='drop' (or the default 'warn') to leave them out (counted in "
            "num_too_long)")
    if budget is None or long_samples == "warn":
        return over
    big = np.flatnonzero(lengths > budget)
    if long_samples == "raise" and big.size:
        raise ValueError(over_budget_text(big.size, int(lengths[big].max()), budget, "raise", where))
    return np.union1d(over, big) if big.size else over


def over_budget_text(count: int, longest: int, budget: int, long_samples: str, where: str = "",
                     max_length: bool = True) -> str:
    """The message of ``count`` samples longer than the budget ``budget`` (the longest ``longest``), under
    the policy ``long_samples``: what happens to them and the fix (``max_length``: the entry point takes
    a ``max_length`` to name)."""
    what = {"warn": "each is planned alone, in a batch over the budget (the batch most likely to run out of "
                    "memory)",
            "drop": "they are left out of every plan (counted in num_too_long)",
            "raise": "no batch can hold one within the budget"}[long_samples]
    fix = f"raise max_batch_tokens to at least {longest:,}"
    if max_length:
        fix += f", or set max_length={budget:,} to leave them out"
    other = {"warn": "long_samples='drop' leaves them out, 'raise' refuses them",
             "drop": "long_samples='warn' plans them alone, 'raise' refuses them",
             "raise": "long_samples='warn' plans them alone, 'drop' leaves them out"}[long_samples]
    return (f"{count:,} sample(s){where} are longer than max_batch_tokens={budget:,} (the longest "
            f"{longest:,}): {what}. Fix: {fix}; {other}")


def warn_over_budget(lengths: np.ndarray, budget: int, long_samples: str, who: str = "",
                     stacklevel: int = 3, max_length: bool = True) -> int:
    """One ``LongSampleWarning`` when samples of ``lengths`` ((N,) int64, those planned, or those left out
    with ``"drop"``) are longer than ``budget``; returns their count (0: no warning). who: the message's
    prefix (the entry point); max_length: whether the entry point takes one (the fix names it)."""
    if long_samples == "raise" or lengths.shape[0] == 0:
        return 0
    longest = int(lengths.max())
    if longest <= budget:
        return 0
    count = int(np.count_nonzero(lengths > budget))
    warnings.warn(f"{who}{over_budget_text(count, longest, budget, long_samples, max_length=max_length)}",
                  LongSampleWarning, stacklevel=stacklevel)
    return count
