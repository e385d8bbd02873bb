"""What every bucketed kernel shares: the helper decorator, counter-based
draws and the integer batch cost.

Batch costs are integers (see ``core/cost.py``):

    code 0: count * L          code 1: count * L**2
    code 2: count * L * (q + L)     (= q * count * (L + L**2 / q))

Randomness is counter-based (a splitmix64 finaliser of ``key ^ counter``), so
every draw is a pure function of the 64-bit key and its position.
"""

from __future__ import annotations

import numpy as np
from numba import njit  # noqa: F401 (re-exported for the kernel modules)

from ...core.hashing import _mix

_U32 = np.uint64(32)

# Helpers only other kernels call: no CPython or C wrapper to generate and
# compile for them.
_helper = njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)


@_helper
def _below(key, counter, n):
    """A draw in [0, n) from (key, counter); n >= 1."""
    r = _mix(key, np.uint64(counter))
    if n < (1 << 32):
        return np.int64(((r >> _U32) * np.uint64(n)) >> _U32)
    return np.int64(r % np.uint64(n))


@njit(cache=True)
def batch_cost(code, q, count, max_len):
    """Integer cost of ``count`` samples padded to ``max_len`` (codes above)."""
    if code == 0:
        return count * max_len
    if code == 1:
        return count * max_len * max_len
    return count * max_len * (q + max_len)
