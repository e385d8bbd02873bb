"""The kernel that puts samples in the seed's planning order: sort by length
(the toolkit's stable radix argsort), then shuffle chunks ("sortish")."""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _radix_argsort
from .mt19937 import _shuffle_slice


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
