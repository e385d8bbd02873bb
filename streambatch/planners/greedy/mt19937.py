"""CPython's ``random.Random`` (MT19937) reproduced inside Numba.

The seed-exact planner must consume the very same random stream as
``random.Random(seed + epoch)``: ``getrandbits`` and ``shuffle``'s rejection
sampling (``_randbelow``) run here; the seeded state itself (``init_by_array``)
is CPython's own, read back with ``getstate()``.

State layout: one ``int64`` array of 625 entries; ``state[:624]`` are the 32-bit
words, ``state[624]`` is the read position. Words are kept in int64 so that the
32-bit arithmetic never overflows and is masked explicitly.
"""

from __future__ import annotations

import random

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _helper

_N = 624
_M = 397
_MASK32 = 0xFFFFFFFF
_UPPER = 0x80000000
_LOWER = 0x7FFFFFFF
_MATRIX_A = 0x9908B0DF


def mt_new(key: np.ndarray) -> np.ndarray:
    """MT19937 state seeded like ``random.Random(n)`` from ``seed_key(n)``.

    CPython's own ``init_by_array``, read back with ``getstate()`` (whose
    internal state is exactly this layout): no kernel to compile for it on
    the first plan.

    key: (k,) uint32. Returns: (625,) int64 state.
    """
    n = int.from_bytes(np.ascontiguousarray(key, dtype="<u4").tobytes(), "little")
    return np.array(random.Random(n).getstate()[1], dtype=np.int64)


@_helper
def _twist(mt):
    for kk in range(_N):
        y = (mt[kk] & _UPPER) | (mt[(kk + 1) % _N] & _LOWER)
        v = mt[(kk + _M) % _N] ^ (y >> 1)
        if y & 1:
            v ^= _MATRIX_A
        mt[kk] = v
    mt[_N] = 0


@_helper
def _genrand(mt):
    """Next tempered 32-bit word (as int64), advancing ``mt`` in place."""
    if mt[_N] >= _N:
        _twist(mt)
    y = mt[mt[_N]]
    mt[_N] += 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y & _MASK32


@_helper
def _getrandbits(mt, k):
    """``random.getrandbits(k)`` for 1 <= k <= 63 (int64), as int64."""
    if k <= 32:
        return _genrand(mt) >> (32 - k)
    lo = _genrand(mt)
    hi = _genrand(mt) >> (64 - k)
    return lo | (hi << 32)


@_helper
def _bit_length(n):
    k = 0
    while n:
        n >>= 1
        k += 1
    return k


@_helper
def _shuffle_slice(mt, x, lo, hi):
    """``random.shuffle(x[lo:hi])`` in place, consuming the same stream.

    Kernels call it with int64 lo and hi (``np.int64(0)``, not a literal 0:
    each distinct argument-type tuple is compiled again)."""
    m = hi - lo
    if m < 2:
        return
    k = _bit_length(m)
    for i in range(m - 1, 0, -1):
        # bit length of (i + 1) only shrinks as i falls
        while k > 1 and (i + 1) >> (k - 1) == 0:
            k -= 1
        r = _getrandbits(mt, k)
        while r > i:
            r = _getrandbits(mt, k)
        t = x[lo + i]
        x[lo + i] = x[lo + r]
        x[lo + r] = t


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def shuffle_slice(mt, x, lo, hi):
    """``_shuffle_slice`` callable from Python (the greedy planner's step
    order; kernels call the helper, which has no wrapper to compile)."""
    _shuffle_slice(mt, x, np.int64(lo), np.int64(hi))


# Python-callable wrappers of the helpers, for the tests (compiled only when
# called: kernels use the helpers, which have no CPython wrapper to compile).


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def genrand_uint32(mt):
    """``_genrand``."""
    return _genrand(mt)


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def getrandbits(mt, k):
    """``_getrandbits``."""
    return _getrandbits(mt, np.int64(k))


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def randbelow(mt, n):
    """``random.Random._randbelow(n)`` (rejection sampling), 1 <= n < 2**63."""
    k = _bit_length(np.int64(n))
    r = _getrandbits(mt, k)
    while r >= n:
        r = _getrandbits(mt, k)
    return r
