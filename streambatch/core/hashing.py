"""A fast, platform-independent 64-bit fingerprint of integer arrays."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def _mix(h, v):
    # splitmix64 finaliser over (h + v); uint64 arithmetic wraps as intended.
    z = (h ^ v) + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@njit(cache=True)
def hash_array(values, h):
    """Fold (n,) integer ``values`` into the uint64 running hash ``h``."""
    h = _mix(h, values.shape[0])
    for i in range(values.shape[0]):
        h = _mix(h, values[i])
    return h
