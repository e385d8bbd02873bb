"""``max_length``: what happens to samples longer than a recipe allows.

Many recipes filter long clips (a 160 s clip in a corpus of 5 s prompts sets
the time of the step it lands in, see ``streambatch plan``'s outlier note).
The sampler, the streaming dataset and the command line share one policy:

- ``long_samples="drop"`` (default): samples longer than ``max_length`` are
  never planned; they are counted (``num_too_long``) and logged, never
  silently lost;
- ``long_samples="raise"``: any such sample is a ``ValueError`` naming it.

Lengths are in the planner's units (frames, tokens); ``seconds_to_frames``
converts a duration limit.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .units import MAX_LENGTH

POLICIES = ("drop", "raise")


def check_max_length(max_length: Any, long_samples: Any = "drop") -> tuple[int | None, str]:
    """Validated (max_length or None, policy)."""
    if long_samples not in POLICIES:
        raise ValueError(f"long_samples must be one of {POLICIES} (what to do with samples longer than "
                         f"max_length), got {long_samples!r}")
    if max_length is None:
        return None, long_samples
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Real) or max_length != int(max_length):
        raise TypeError(f"max_length must be a whole number of length units (frames, tokens) or None, got "
                        f"{max_length!r}; convert seconds with streambatch.seconds_to_frames(seconds, fps)")
    value = int(max_length)
    if not 1 <= value < MAX_LENGTH:
        raise ValueError(f"max_length must be in [1, 2**62) length units, got {value}; pass None for no limit")
    return value, long_samples


def too_long(lengths: np.ndarray, max_length: int | None, long_samples: str, where: str = "") -> np.ndarray:
    """(k,) int64 indices of the samples of ``lengths`` ((N,) int64) longer
    than ``max_length`` (empty when it is None). With ``long_samples="raise"``
    a non-empty result is a ValueError instead; ``where`` names the source."""
    if max_length is None:
        return np.zeros(0, dtype=np.int64)
    over = np.flatnonzero(lengths > max_length)
    if over.size and long_samples == "raise":
        first = int(over[0])
        raise ValueError(
            f"{over.size:,} sample(s){where} are longer than max_length={max_length:,} (the first is sample "
            f"{first}, length {int(lengths[first]):,}; the longest {int(lengths[over].max()):,}); raise "
            "max_length, or pass long_samples='drop' to leave them out (counted in num_too_long)")
    return over
