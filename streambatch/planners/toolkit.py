"""The kernel toolkit every planner shares: the helper decorators, array
allocation, the one integer batch cost, counter-based draws, sorting,
shuffles and the seed words their keys derive from. Every
planner imports from here; no planner imports a sibling
(``tests/test_import_graph.py``).

Batch costs are integers (see ``core/cost.py``), ``count * L * (ca * L + cb)``
with the model's coefficients ``(ca, cb) = CostModel.coefficients``, the one
encoding of the cost formula kernels take:

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
  packed kernel's few-line helpers (bucket lookup, union-find, heap sift),
  called once or twice each, where a call cost more than their compile.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit  # noqa: F401 (numba's, cache saves guarded; re-exported for the kernel modules)

_U32 = np.uint64(32)
_I64_MAX = np.int64(np.iinfo(np.int64).max)  # a typed global: np.iinfo compiles code in every kernel using it

# Helpers only other kernels call: no CPython or C wrapper to generate and
# compile for them, and no cache entry of their own (a cached kernel holds
# its helpers' code, linked in; saving theirs cost ~0.15 s of a cold call).
_helper = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, error_model="numpy")
# Inlined into the caller's Numba IR (typed and compiled with it): see above.
_inline = njit(inline="always", no_cpython_wrapper=True, no_cfunc_wrapper=True, error_model="numpy")


@_inline
def _over(tab, count, length):
    """Whether ``count`` samples padded to ``length`` exceed a limit curve: tab
    is ``BatchConstraint.size_table`` ((> length,) int64, the largest batch per
    padded length), or (0,) for no curve (never over). Inlined: it sits in the
    fill loops, where a call would cost more than the check."""
    return tab.shape[0] > 0 and count > tab[length]


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


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def batch_cost(ca, cb, count, max_len):
    """``_cost`` callable from Python (tests: ``CostModel.scaled`` is its numpy twin)."""
    return _cost(np.int64(ca), np.int64(cb), np.int64(count), np.int64(max_len))


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


# ------------------------------------------------------------------ sorting

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
    """``_radix_argsort`` callable from Python (tests): kernels call the
    helper, which has no CPython wrapper to compile on the first plan."""
    _radix_argsort(keys, out, tmp)


# ------------------------------------------------------------------ shuffles


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def step_permutation(n_steps, key):
    """(n_steps,) int64 Fisher-Yates permutation drawn from ``key``."""
    perm = _new(n_steps)
    for i in range(n_steps):
        perm[i] = i
    for i in range(n_steps - 1, 0, -1):
        j = _below(key, i, i + 1)
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t
    return perm


# ------------------------------------------------------------------ keys (plain Python)

_MASK32 = 0xFFFFFFFF


def seed_key(seed: int) -> np.ndarray:
    """The ``init_by_array`` key CPython derives from an integer seed.

    CPython seeds with ``abs(seed)`` split into 32-bit little-endian words
    (``[0]`` for zero). Done in Python because seeds are arbitrary-size ints.

    Returns: (n_words,) uint32.
    """
    n = abs(int(seed))
    words = []
    while n:
        words.append(n & _MASK32)
        n >>= 32
    return np.array(words or [0], dtype=np.uint32)
