"""The seed's greedy global-step planner as a Numba kernel.

Samples are taken in planning order. Each goes to the rank of the current
global step whose key is lexicographically smallest, with the seed's key:

    (cost spread, max cost, total cost, token spread, projected cost,
     projected tokens, new count, (rank - step) mod W, rank)

where the spreads, max and total are over the step's W batch costs (B * L**2)
and tokens (B * L) after a hypothetical placement. A rank is closed to a
sample once its batch is non-empty and the sample would break the size cap or
the token budget; a step ends when every rank is closed.

The seed rebuilds all W costs per candidate: O(W**2) per sample. Two facts make
it cheap here. (1) The max and min "over the other ranks" follow from the
step's max/min, their multiplicities and runners-up, so a candidate is O(1).
(2) Ranks whose batches have the same (count, max length) have equal keys up to
the rotation, and a step has few distinct states (about 3 among 64 ranks and 4-6
among 512 on audio-like lengths). So ranks are kept in groups by state and a
sample costs O(#groups) to choose the group. (3) Within a group the rotation
picks the member with the smallest (rank - step) mod W, and that member is the
one that leaves the group. So each group keeps its members in a min-heap keyed
by that rotation (a pairing heap whose nodes are the rotations, so the key is
the node itself): the member is the root, O(1), and moving it costs amortised
O(log W). A scan of the ranks instead cost ~W/2 per sample and made W = 512
several times slower than W = 64.
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _I64_MAX as _BIG
from ..toolkit import _grow, _helper, _new

# Compile time follows the rules in ``planners/toolkit.py``. In particular a
# variable passed to a helper starts as np.int64(...), never a literal: Numba
# types a loop's first pass with the literal and compiles the helper for it too.
_BLOCK = 4096  # lengths are gathered a block at a time so cache misses overlap


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def greedy_steps(order, lengths, world_size, max_tokens, max_size, out):
    """Plan global steps greedily over ``order``.

    order: (n,) int sample indices in planning order. lengths: (N,) int64.
    max_tokens, max_size: budget and cap (>= 1); costs must fit in int64
    (checked by the caller; ``max_size <= n``). out: (>= n,) int, receives the
    samples grouped by step then rank, in placement order within a batch.

    Returns (counts, n_steps): counts[:n_steps * W] are the batch sizes,
    step-major. Every step is full (all ranks non-empty) except possibly the
    last.
    """
    n = order.shape[0]
    w = world_size
    groups = _Groups(w)
    block = _new(np.int64(_BLOCK))  # np.int64: a literal argument is one more specialisation
    per_step = w * max_size if w * max_size < n else n
    step_samples = _new(per_step if per_step > 1 else 1)
    step_ranks = _new(step_samples.shape[0])
    rank_pos = _new(w)
    # Only steps that end before the data does are full; grow as needed.
    counts = _new((n // 16 if n // 16 > 4 else 4) + w)  # flat (step, rank)
    pos = np.int64(0)
    n_out = np.int64(0)
    step = np.int64(0)
    block_start = np.int64(-_BLOCK)
    while pos < n:
        _reset(groups, w)
        rot0 = step % w  # once per step: a division per sample is measurable
        m = np.int64(0)  # samples placed in this step
        while pos < n:
            if pos >= block_start + _BLOCK:
                block_start = pos
                for i in range(_BLOCK if n - pos > _BLOCK else n - pos):
                    block[i] = lengths[order[pos + i]]
            ln = block[pos - block_start]
            chosen = _choose_and_place(groups, ln, w, rot0, max_tokens, max_size)
            if chosen < 0:
                break  # every rank is closed: the step is complete
            step_samples[m] = order[pos]
            step_ranks[m] = chosen
            m += 1
            if m == step_samples.shape[0]:
                step_samples = _grow(step_samples, m, 2 * m)
                step_ranks = _grow(step_ranks, m, 2 * m)
            pos += 1
        if (step + 1) * w > counts.shape[0]:
            counts = _grow(counts, step * w, 2 * counts.shape[0])
        # Stable counting sort of the step's samples by rank.
        acc = n_out
        for r in range(w):
            c = groups[_CNT, groups[_RANK_GROUP, r]]
            rank_pos[r] = acc
            acc += c
            counts[step * w + r] = c
        for i in range(m):
            r = step_ranks[i]
            out[rank_pos[r]] = step_samples[i]
            rank_pos[r] += 1
        n_out += m
        step += 1
    return counts, step


# Rows of the group state: one (12, W) int64 array, so kernels pass one array
# (a tuple of arrays costs a reference-count round trip per array per call).
# Rows up to _SIZE and _ROOT are per group id; _RANK_GROUP per rank; _CHILD and
# _SIB per rotation d = (rank - step) mod W, the members' heap nodes.
_CNT, _MX, _COST, _TOK, _SIZE, _ROOT, _RANK_GROUP, _ACTIVE, _FREE, _META, _CHILD, _SIB = range(12)


@_helper
def _Groups(w):
    """Ranks grouped by batch state. Per group id (capacity W): count, max
    length, cost, tokens, size, the root of its members' heap (the smallest
    rotation); rank -> group id; the active ids; a stack of free ids; per
    rotation, its first child and next sibling in its group's heap (-1: none).
    Row _META holds (#active, #free)."""
    k = w if w > 2 else 2
    # np.empty and loops: compiles faster than np.zeros or _zeros(...).reshape.
    groups = np.empty((12, k), dtype=np.int64)
    for i in range(12):
        for j in range(k):
            groups[i, j] = 0
    return groups


@_helper
def _reset(groups, w):
    """One group holding every rank with an empty batch."""
    groups[_CNT, 0] = 0
    groups[_MX, 0] = 0
    groups[_COST, 0] = 0
    groups[_TOK, 0] = 0
    groups[_SIZE, 0] = w
    # Its heap is the path 0 -> 1 -> ... -> W-1: each pop is O(1), and the
    # empty ranks leave in exactly this order.
    groups[_ROOT, 0] = 0
    for d in range(w):
        groups[_RANK_GROUP, d] = 0  # d runs over every rank too
        groups[_CHILD, d] = d + 1 if d + 1 < w else -1
        groups[_SIB, d] = -1
    groups[_ACTIVE, 0] = 0
    groups[_META, 0] = 1
    for k in range(w - 1):
        groups[_FREE, k] = w - 1 - k
    groups[_META, 1] = w - 1


@_helper
def _cmp(a, b):
    return (a > b) - (a < b)


@_helper
def _meld(groups, a, b):
    """Meld two pairing heaps by their roots a, b (distinct nodes, or -1 for
    an empty heap); returns the new root. Roots have no sibling."""
    if a < 0:
        return b
    if b < 0:
        return a
    if b < a:
        a, b = b, a
    groups[_SIB, b] = groups[_CHILD, a]
    groups[_CHILD, a] = b
    return a


@_helper
def _pop_root(groups, g):
    """Remove the root (smallest node) of group g's heap: the two-pass
    pairing of its children becomes the new root (-1 when it was alone)."""
    x = groups[_ROOT, g]
    a = groups[_CHILD, x]
    # Pass 1, left to right: meld pairs; the results form a list through
    # _SIB in reverse order.
    acc = np.int64(-1)
    while a >= 0:
        b = groups[_SIB, a]
        if b < 0:
            groups[_SIB, a] = acc
            acc = a
            break
        nxt = groups[_SIB, b]
        groups[_SIB, a] = -1
        groups[_SIB, b] = -1
        m = _meld(groups, a, b)
        groups[_SIB, m] = acc
        acc = m
        a = nxt
    # Pass 2, right to left: meld the pairs into one heap.
    root = acc
    if root >= 0:
        a = groups[_SIB, root]
        groups[_SIB, root] = -1
        while a >= 0:
            nxt = groups[_SIB, a]
            groups[_SIB, a] = -1
            root = _meld(groups, root, a)
            a = nxt
    groups[_ROOT, g] = root


@_helper
def _choose_and_place(groups, ln, w, rot0, max_tokens, max_size):
    """Place a sample of length ``ln`` on the rank with the smallest seed key.

    Returns that rank, or -1 (nothing placed) when every rank is closed.
    """
    ng = groups[_META, 0]
    # Max/min of costs and tokens over ranks, multiplicities and runners-up
    # (the largest value below the max, the smallest above the min), in one
    # pass: costs and tokens are >= 0, so -1 and _BIG mean "none yet".
    hi = hi2 = thi = thi2 = np.int64(-1)
    lo = lo2 = tlo = tlo2 = _BIG
    nhi = nlo = nthi = ntlo = np.int64(0)
    for i in range(ng):
        g = groups[_ACTIVE, i]
        k = groups[_SIZE, g]
        v = groups[_COST, g]
        if v > hi:
            hi2, hi, nhi = hi, v, k
        elif v == hi:
            nhi += k
        elif v > hi2:
            hi2 = v
        if v < lo:
            lo2, lo, nlo = lo, v, k
        elif v == lo:
            nlo += k
        elif v < lo2:
            lo2 = v
        v = groups[_TOK, g]
        if v > thi:
            thi2, thi, nthi = thi, v, k
        elif v == thi:
            nthi += k
        elif v > thi2:
            thi2 = v
        if v < tlo:
            tlo2, tlo, ntlo = tlo, v, k
        elif v == tlo:
            ntlo += k
        elif v < tlo2:
            tlo2 = v
    # Keys per group; members differ only in the rotation.
    best = best_i = np.int64(-1)
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = np.int64(0)
    for i in range(ng):
        g = groups[_ACTIVE, i]
        c = groups[_CNT, g]
        mx = groups[_MX, g]
        nm = ln if ln > mx else mx
        nc = c + 1
        pt = nc * nm
        if c > 0 and (nc > max_size or pt > max_tokens):
            continue
        pc = pt * nm
        cr = groups[_COST, g]
        other_hi = hi2 if (cr == hi and nhi == 1) else hi
        other_lo = lo2 if (cr == lo and nlo == 1) else lo
        k1 = pc if pc > other_hi else other_hi
        k0 = k1 - (pc if pc < other_lo else other_lo)
        if best >= 0 and k0 > b0:
            continue
        k2 = pc - cr  # total cost differs across candidates by this increase only
        tr = groups[_TOK, g]
        tother_hi = thi2 if (tr == thi and nthi == 1) else thi
        tother_lo = tlo2 if (tr == tlo and ntlo == 1) else tlo
        k3 = (pt if pt > tother_hi else tother_hi) - (pt if pt < tother_lo else tother_lo)
        if best >= 0:
            # Lexicographic comparison with the best key so far, written out:
            # Numba compiles 7-tuple comparisons slowly.
            cmp = _cmp(k0, b0)
            if cmp == 0:
                cmp = _cmp(k1, b1)
            if cmp == 0:
                cmp = _cmp(k2, b2)
            if cmp == 0:
                cmp = _cmp(k3, b3)
            if cmp == 0:
                cmp = _cmp(pc, b4)
            if cmp == 0:
                cmp = _cmp(pt, b5)
            if cmp == 0:
                cmp = _cmp(nc, b6)
            if cmp > 0:
                continue
            # Only the rotation could separate equal-keyed groups (their
            # first members are the roots of their heaps). Distinct groups
            # never tie, in fact: equal new count, projected cost and cost
            # increase mean equal (count, max length). Kept so that the
            # choice stays the seed's should the key change.
            if cmp == 0 and groups[_ROOT, g] > groups[_ROOT, best]:
                continue
        best, best_i = g, i
        b0, b1, b2, b3, b4, b5, b6 = k0, k1, k2, k3, pc, pt, nc
    if best < 0:
        return -1
    # Move the group's first member to the group of its new state.
    d = groups[_ROOT, best]
    r = d + rot0
    r = r - w if r >= w else r
    _pop_root(groups, best)
    c = groups[_CNT, best] + 1
    mx = groups[_MX, best]
    nm = ln if ln > mx else mx
    groups[_SIZE, best] -= 1
    if groups[_SIZE, best] == 0:
        groups[_ACTIVE, best_i] = groups[_ACTIVE, ng - 1]
        ng -= 1
        groups[_FREE, groups[_META, 1]] = best
        groups[_META, 1] += 1
    target = np.int64(-1)
    for i in range(ng):
        g = groups[_ACTIVE, i]
        if groups[_CNT, g] == c and groups[_MX, g] == nm:
            target = g
            break
    if target < 0:
        groups[_META, 1] -= 1
        target = groups[_FREE, groups[_META, 1]]
        groups[_ACTIVE, ng] = target
        ng += 1
        groups[_CNT, target] = c
        groups[_MX, target] = nm
        groups[_COST, target] = c * nm * nm
        groups[_TOK, target] = c * nm
        groups[_SIZE, target] = 0
        groups[_ROOT, target] = -1
    groups[_SIZE, target] += 1
    groups[_CHILD, d] = -1
    groups[_SIB, d] = -1
    groups[_ROOT, target] = _meld(groups, groups[_ROOT, target], d)
    groups[_RANK_GROUP, r] = target
    groups[_META, 0] = ng
    return r
