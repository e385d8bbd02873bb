"""A fast, platform-independent 64-bit fingerprint of integer arrays."""

from __future__ import annotations

from .jit import njit  # numba's, with a cache that may fail to save (core/jit.py)

# Kernel helpers only other kernels call: no CPython or C wrapper to compile,
# and no cache entry of their own (see ``planners/toolkit.py``).
_helper = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True)


@_helper
def _splitmix(h, v):
    # splitmix64 finaliser over (h + v); uint64 arithmetic wraps as intended.
    z = (h ^ v) + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@njit(cache=True, no_cfunc_wrapper=True)
def _mix(h, v):
    """``_splitmix`` callable from Python (tests: the bucket sort's twin)."""
    return _splitmix(h, v)


@njit(cache=True, no_cfunc_wrapper=True)
def hash_array(values, h):
    """Fold (n,) integer ``values`` into the uint64 running hash ``h``."""
    h = _splitmix(h, values.shape[0])
    for i in range(values.shape[0]):
        h = _splitmix(h, values[i])
    return h
