"""Seeded permutations for mixing cycles (Numba kernels + their numpy entry point).

An epoch takes a slice of a source's cycle order (a down-sampled source only
a part of it), and sources hold up to ~10**8 samples. Shuffling an array that
large is bound by memory latency (~100 ns per element here, numpy's
``Generator.shuffle`` alike), every epoch and on every rank. So a large
cycle's order is a keyed permutation computed element by element: a
six-round alternating Feistel network (FF1's shape: halves of
``floor(b/2)`` and ``ceil(b/2)`` bits, added modulo their size) on the
``b``-bit domain holding ``n``, with cycle-walking back into ``[0, n)`` (a
bijection of the domain, walked until it lands in range, is a bijection of
``[0, n)``; the domain is < 2n, so under two trips on average). Position
``i`` of the order is ``permute(i)``: any slice costs its own length and no
per-sample memory. Below ``SMALL`` samples, where so few bits leave a
Feistel network too few permutations to choose from, the order is a plain
Fisher-Yates shuffle. Draws are splitmix64 of (key, counter), so an order is
a pure function of (key, n), the same on every machine.
"""

from __future__ import annotations

import numpy as np

from .hashing import _helper, _splitmix
from .jit import njit  # numba's, with a cache that may fail to save (core/jit.py)

_U64 = 1 << 64
_ROUNDS = 6
SMALL = 1 << 16


@_helper
def _below(key, i, n):
    """A draw in [0, n) from (uint64 key, counter i); 1 <= n < 2**32 (multiply-shift)."""
    r = _splitmix(key, np.uint64(i))
    return np.int64(((r >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(cache=True, no_cfunc_wrapper=True)
def fisher_yates_range(n, key, lo, hi, out):
    """out[:] = positions lo..hi of a Fisher-Yates permutation of 0..n-1
    drawn from the uint64 ``key`` (forward; stops after step hi).

    Loops instead of np.arange, min() and a slice assignment: the slice's
    shape check alone compiled Numba's whole string formatting (~2.5 s of a
    cold first mix)."""
    a = np.empty(n, dtype=np.int64)
    for i in range(n):
        a[i] = i
    for i in range(hi if hi < n - 1 else n - 1):
        j = i + _below(key, i, n - i)
        t = a[i]
        a[i] = a[j]
        a[j] = t
    for i in range(lo, hi):
        out[i - lo] = a[i]


@njit(cache=True, no_cfunc_wrapper=True)
def feistel_range(n, key, lo, hi, out):
    """out[i - lo] = position ``i`` of the Feistel permutation of 0..n-1 drawn
    from the uint64 ``key``, for lo <= i < hi (n >= 2)."""
    bits = 1
    while (np.uint64(1) << np.uint64(bits)) < np.uint64(n):
        bits += 1
    u = bits // 2
    v = bits - u
    # independent round keys: (key ^ round) alone would let rounds share values
    round_keys = np.empty(_ROUNDS, dtype=np.uint64)
    for r in range(_ROUNDS):
        round_keys[r] = _splitmix(_splitmix(key, np.uint64(r)), np.uint64(0x726F756E64))
    mask_u = (np.uint64(1) << np.uint64(u)) - np.uint64(1)
    mask_v = (np.uint64(1) << np.uint64(v)) - np.uint64(1)
    nn = np.uint64(n)
    for i in range(lo, hi):
        y = np.uint64(i)
        while True:
            a = y >> np.uint64(v)  # u bits
            b = y & mask_v  # v bits
            for r in range(_ROUNDS):
                # a has u bits on even rounds, v on odd ones; the sizes swap back after an even count
                m = mask_u if r % 2 == 0 else mask_v
                c = (a + _splitmix(round_keys[r], b)) & m
                a = b
                b = c
            y = (a << np.uint64(v)) | b
            if y < nn:
                break
        out[i - lo] = np.int64(y)


def permutation_slice(n: int, key: int, lo: int, hi: int) -> np.ndarray:
    """(hi - lo,) int64 positions ``lo:hi`` (0 <= lo <= hi <= n) of the
    permutation of ``0..n-1`` drawn from ``key`` (any int)."""
    out = np.empty(hi - lo, dtype=np.int64)
    if n <= 1:
        out[:] = 0
        return out
    # The key must reach the kernel as uint64: a Python int below 2**63 would be
    # typed int64, and mixing int64 with uint64 constants makes Numba hash in floats.
    k = np.uint64(key % _U64)
    if n < SMALL:
        fisher_yates_range(n, k, lo, hi, out)
    else:
        feistel_range(n, k, lo, hi, out)
    return out
