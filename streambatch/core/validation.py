"""Input checks shared by every planner: user input is validated and coerced
here, so nothing malformed ever reaches a Numba kernel."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .keywords import REQUIRED

INT64_MAX = np.iinfo(np.int64).max


def coerce_lengths(lengths: Any) -> np.ndarray:
    """Validate per-sample lengths and return them as a (N,) int64 array.

    Accepts a sequence of ints, a numpy array of any integer or integral-float
    dtype, or a torch tensor (duck-typed, so this layer needs no torch).
    """
    if hasattr(lengths, "detach") and hasattr(lengths, "numpy"):
        lengths = lengths.detach().cpu().numpy()
    if lengths is None or isinstance(lengths, (str, bytes)):
        raise TypeError("lengths must be a 1-D sequence of non-negative integers, "
                        f"got {lengths!r} ({type(lengths).__name__})")
    try:
        arr = np.asarray(lengths)
    except (ValueError, TypeError) as exc:  # ragged nested lists and the like
        raise ValueError("lengths must be a 1-D sequence of non-negative integers; "
                         f"numpy could not read it: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(
            f"lengths must be 1-D (one length per sample), got shape {arr.shape}; "
            "pass one integer per sample, e.g. lengths.reshape(-1) if that is what you meant"
        )
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    kind = arr.dtype.kind
    if kind in "OUS":
        # numpy turns [3, "x"] into strings; look at the caller's own elements
        _name_non_numeric(lengths if isinstance(lengths, (list, tuple)) else arr.tolist())
    if kind == "b" or kind not in "iuf":
        raise TypeError(
            f"lengths must hold integers (or integral floats), got dtype {arr.dtype}; "
            "convert them, e.g. np.asarray(lengths, dtype=np.int64)"
        )
    if kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"lengths[{i}] = {arr[i]} is not finite; every length must be a finite integer >= 0")
        neg = arr < 0
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise ValueError(f"lengths[{i}] = {arr[i]} is negative; every length must be an integer >= 0")
        frac = arr != np.floor(arr)
        if frac.any():
            i = int(np.flatnonzero(frac)[0])
            raise ValueError(
                f"lengths[{i}] = {arr[i]} is fractional; lengths are token/frame counts, so round them "
                "(e.g. np.ceil(duration * frame_rate)) before planning"
            )
        if arr.max() >= 2.0**62:
            i = int(np.argmax(arr))
            raise ValueError(f"lengths[{i}] = {arr[i]} is too large (limit 2**62); use coarser units")
        return arr.astype(np.int64)
    if kind == "u":
        if arr.max() > INT64_MAX:
            i = int(np.argmax(arr))
            raise ValueError(f"lengths[{i}] = {arr[i]} does not fit in int64; use coarser units")
        return arr.astype(np.int64)
    if arr.min() < 0:
        i = int(np.argmin(arr))
        raise ValueError(f"lengths[{i}] = {arr[i]} is negative; every length must be an integer >= 0")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _name_non_numeric(values: Any) -> None:
    """Raise naming the first element that is not a usable length."""
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (numbers.Integral, numbers.Real)):
            raise TypeError(f"lengths[{i}] = {v!r} is not a number; every length must be an integer >= 0")
        if isinstance(v, numbers.Integral) and not 0 <= v <= INT64_MAX:
            raise ValueError(f"lengths[{i}] = {v} is outside [0, 2**63 - 1]; every length must be an integer >= 0 "
                             "that fits in int64 (use coarser units)")


def check_flag(name: str, value: Any) -> bool:
    """A boolean flag; strings like "false" are refused rather than read as True."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def check_int(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as a Python int in [minimum, maximum], or a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}")
    return value


def check_budget(value: Any) -> int:
    """``max_batch_tokens`` as an int >= 1.

    A fractional budget is floored: for integer token counts ``t > 16000.5``
    is the same test as ``t > 16000``, so the plan is unchanged.
    """
    if value is REQUIRED:
        raise TypeError("max_batch_tokens is required: the budget of one batch, in the units of the lengths "
                        "(e.g. max_batch_tokens=16_000, or as the second positional argument)")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"max_batch_tokens must be a number, got {value!r} ({type(value).__name__})")
    given = value
    if isinstance(value, numbers.Integral):
        value = int(value)
    else:
        value = float(value)
        if not np.isfinite(value):
            raise ValueError(f"max_batch_tokens must be finite and >= 1, got {value}")
        value = int(np.floor(value))
    if value < 1:
        raise ValueError(f"max_batch_tokens must be >= 1 (tokens per batch), got {given}")
    return value


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")
    return int(seed)


def check_world(rank: Any, world_size: Any) -> tuple[int, int]:
    world_size = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size) = [0, {world_size}), got {rank}")
    return rank, world_size
