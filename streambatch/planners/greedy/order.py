"""Kernels that put samples in planning order: a stable radix argsort by length
and the seed's sort-then-chunk-shuffle ("sortish") ordering."""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..bucketed.common import _helper, _zeros
from .mt19937 import _shuffle_slice

_DIGIT_BITS = 11  # 2,048 buckets: the histogram stays in L1 cache
_RADIX = 1 << _DIGIT_BITS


@_helper
def _radix_argsort(keys, out, tmp):
    """Stable argsort of non-negative int64 ``keys`` into ``out``.

    keys: (n,) int64 >= 0. out, tmp: (>= n,) integer scratch; the sorted
    indices land in ``out[:n]``. Returns nothing. O(n * passes) with one
    11-bit digit per pass; passes whose digit is constant are skipped.
    """
    n = keys.shape[0]
    for i in range(n):
        out[i] = i
    if n < 2:
        return
    kmax = 0
    for i in range(n):
        if keys[i] > kmax:
            kmax = keys[i]
    counts = _zeros(np.int64(_RADIX))  # np.int64: a literal argument is one more specialisation
    src = out
    dst = tmp
    in_tmp = False  # numba cannot compare arrays by identity, so track parity
    shift = 0
    while (kmax >> shift) > 0:
        for d in range(_RADIX):
            counts[d] = 0
        for i in range(n):
            counts[(keys[src[i]] >> shift) & (_RADIX - 1)] += 1
        nonzero = 0
        for d in range(_RADIX):
            if counts[d] > 0:
                nonzero += 1
        if nonzero > 1:
            total = 0
            for d in range(_RADIX):
                c = counts[d]
                counts[d] = total
                total += c
            for i in range(n):
                s = src[i]
                d = (keys[s] >> shift) & (_RADIX - 1)
                dst[counts[d]] = s
                counts[d] += 1
            src, dst = dst, src
            in_tmp = not in_tmp
        shift += _DIGIT_BITS
    if in_tmp:
        for i in range(n):
            out[i] = src[i]


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def radix_argsort(keys, out, tmp):
    """``_radix_argsort`` callable from Python (tests): sortish_order calls the
    helper, which has no CPython wrapper to compile on the first plan."""
    _radix_argsort(keys, out, tmp)


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def sortish_order(lengths, chunk_size, mt, out, tmp, perm):
    """The seed's shuffled order: sort by length (stable), shuffle each chunk of
    ``chunk_size`` in place, then shuffle the order of the chunks.

    lengths: (n,) int64. mt: MT19937 state, advanced. out, tmp: (>= n,)
    integer scratch. perm: (>= ceil(n / chunk_size),) scratch of the same
    dtype as tmp (from the caller: ``_shuffle_slice`` then compiles for one
    array type, not two). The order lands in ``out[:n]``; ``tmp`` is clobbered.
    """
    n = lengths.shape[0]
    _radix_argsort(lengths, tmp, out)
    n_chunks = (n + chunk_size - 1) // chunk_size
    for c in range(n_chunks):
        hi = (c + 1) * chunk_size
        _shuffle_slice(mt, tmp, c * chunk_size, hi if hi < n else n)
    for c in range(n_chunks):
        perm[c] = c
    _shuffle_slice(mt, perm, np.int64(0), n_chunks)
    pos = 0
    for c in range(n_chunks):
        lo = perm[c] * chunk_size
        hi = lo + chunk_size if lo + chunk_size < n else n
        for i in range(lo, hi):
            out[pos] = tmp[i]
            pos += 1
