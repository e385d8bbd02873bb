"""What every bucketed kernel shares: the helper decorator, counter-based
draws, the integer batch cost and array allocation.

Batch costs are integers (see ``core/cost.py``), ``count * L * (ca * L + cb)``
with the model's coefficients (ca, cb):

    linear (0, 1): count * L      quadratic (1, 0): count * L**2
    quadratic_duration (1, q): count * L * (q + L)   (= q * count * (L + L**2 / q))

Randomness is counter-based (a splitmix64 finaliser of ``key ^ counter``), so
every draw is a pure function of the 64-bit key and its position.

Compile time (a cold first call compiles every kernel) shapes this code:

- helpers only other kernels call get no CPython or C wrapper (``_helper``);
- a helper is compiled once per distinct argument-type tuple, so callers pass
  int64 (``np.int64(x)``, never an int16 length or a literal int) and uint64
  keys: one specialisation each;
- Numba compiles an overload such as ``np.empty``, ``max`` or ``np.argmin``
  again in every function that uses it, so kernels allocate only through
  ``_new`` and compare with conditional expressions;
- ``error_model="numpy"``: no ZeroDivisionError branch after every ``/``,
  ``//`` and ``%`` (inputs are validated: no kernel divides by zero);
- no branch on a loop-invariant value inside a loop (a flag, the cost
  model): LLVM -O3 unswitches the loop, one copy of it per value. Kernels
  get the cost model as two coefficients from Python, opaque to LLVM (a
  cost-model code, even branch-free as 0/1 factors, was unswitched on:
  ~12 % more LLVM IR in plan_steps), and flags become 0/1 factors;
- no array slices in kernels: a view costs Numba typing and lowering
  work (shape, strides, NRT refcounts) at every use. Helpers take a whole
  scratch array and an offset (``sizes[off + r]``), and separate arrays
  replace views of one. Removing plan_steps' ~20 slices (with the next two
  rules) cut a cold call by ~8 % CPU: 5 of 5 pairs of concurrent cold runs,
  base vs this, 13.8 -> 12.8 s median under the contention; sequential
  runs on this shared machine are too noisy to show it (13 alternating
  pairs: medians 11.26 vs 11.28 s). The optimised LLVM IR is no smaller:
  the saving is in Numba's own passes;
- no two-round loop (``for rnd in range(2)``) around copy loops: LLVM
  unrolls it into two copies of each (``_take_head`` copies in one pass:
  its optimised IR 1626 -> 1433 lines);
- top-level kernels get no C callback wrapper (``no_cfunc_wrapper``):
  Python calls them through the CPython wrapper only (one wrapper function
  less to generate and optimise per kernel);
- no Numba-level inlining (``inline="always"``) of kernel helpers, though
  it saves their separate compiles: into bucket_sort it halved planning
  speed (4M samples: 0.09 -> 0.19 s), into plan_steps its type inference
  grew by more than the helpers' compiles saved. ``_inline`` is for the
  test wrappers' ``_coefficients`` only.
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # noqa: F401 (re-exported for the kernel modules)

_U32 = np.uint64(32)
_I64_MAX = np.int64(np.iinfo(np.int64).max)  # a typed global: np.iinfo compiles code in every kernel using it

# Helpers only other kernels call: no CPython or C wrapper to generate and
# compile for them, and no cache entry of their own (a cached kernel holds
# its helpers' code, linked in; saving theirs cost ~0.15 s of a cold call).
_helper = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, error_model="numpy")
# Inlined into the caller's Numba IR (typed and compiled with it): see above.
_inline = njit(inline="always", no_cpython_wrapper=True, no_cfunc_wrapper=True, error_model="numpy")


@_helper
def _mix(h, v):
    """splitmix64 finaliser of h ^ v (both uint64): ``core.hashing._mix``'s
    unsigned case, without the wrappers (tests check they agree)."""
    z = (h ^ v) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@_helper
def _below(key, counter, n):
    """A draw in [0, n) from (key uint64, counter int64); n >= 1 (int64)."""
    r = _mix(key, np.uint64(counter))
    if n < (1 << 32):
        return np.int64(((r >> _U32) * np.uint64(n)) >> _U32)
    return np.int64(r % np.uint64(n))


@_helper
def _cost(ca, cb, count, max_len):
    """Integer cost of ``count`` samples padded to ``max_len`` under the
    coefficients (ca, cb) above; all int64."""
    return count * max_len * (ca * max_len + cb)


@_inline
def _coefficients(code, q):
    """(ca, cb) of ``CostModel.code`` and ``q``, for the Python-callable
    wrappers (the plan layer passes ``CostModel.coefficients``)."""
    return np.int64(code != 0), np.int64(1 if code == 0 else q if code == 2 else 0)


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def batch_cost(code, q, count, max_len):
    """``_cost`` callable from Python (tests and callers outside kernels)."""
    ca, cb = _coefficients(code, q)
    return _cost(ca, cb, np.int64(count), np.int64(max_len))


@_helper
def _new(n):
    """(n,) int64, uninitialised: every kernel allocation goes through here."""
    return np.empty(n, dtype=np.int64)


@_helper
def _zeros(n):
    """(n,) int64 zeros."""
    a = _new(n)
    for i in range(n):
        a[i] = 0
    return a


@_helper
def _grow(a, used, size):
    """(size,) int64 holding a[:used] first (size >= used), the rest zero."""
    grown = _new(size)
    for i in range(used):  # explicit loops: Numba compiles slice assignment slowly
        grown[i] = a[i]
    for i in range(used, size):
        grown[i] = 0
    return grown
