"""Seconds to frames: the one rule every length source uses.

A duration of ``s`` seconds at ``fps`` frames per second plans as
``ceil(s * fps)`` frames, with a tolerance of 1e-6 frame so that float noise
does not add a frame (0.07 s at 100 frames/s is 7 frames, not 8).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

# Lengths feed int64 cost arithmetic (B * L**2 summed over a step): keep them far below 2**63.
MAX_LENGTH = 2**62
_TOLERANCE = 1e-6


def check_fps(frames_per_second: Any, name: str = "frames_per_second") -> float | None:
    """``frames_per_second`` as a float > 0, None kept; else a ValueError naming ``name``."""
    if frames_per_second is None:
        return None
    if isinstance(frames_per_second, bool) or not isinstance(frames_per_second, numbers.Real) \
            or not math.isfinite(frames_per_second) or not 0 < frames_per_second < 1e12:
        raise ValueError(f"{name} must be a finite number in (0, 1e12) (e.g. 50 or 100), "
                         f"got {frames_per_second!r}")
    return float(frames_per_second)


@overload
def seconds_to_frames(seconds: float, fps: float) -> int: ...
@overload
def seconds_to_frames(seconds: np.ndarray | Sequence[float], fps: float) -> np.ndarray: ...


def seconds_to_frames(seconds: float | np.ndarray | Sequence[float], fps: float) -> int | np.ndarray:
    """``ceil(seconds * fps)`` frames (int, or (N,) int64 for an array).

    seconds: finite values >= 0 (checked by the caller, which can name the
    sample). Raises ValueError when a result would reach ``MAX_LENGTH``.
    """
    frames = np.maximum(np.ceil(np.asarray(seconds, dtype=np.float64) * fps - _TOLERANCE), 0.0)
    if (frames >= MAX_LENGTH).any():
        big = float(np.max(seconds))
        raise ValueError(f"a duration of {big!r} s at {fps:g} frames/s is {big * fps:.3g} frames, beyond the "
                         f"limit of 2**62; check the units (seconds expected) and frames_per_second")
    if frames.ndim == 0:
        return int(frames)
    return frames.astype(np.int64)
