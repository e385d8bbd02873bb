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
the rotation, and a step has few distinct states (about 7 among 64 ranks on
audio-like lengths). So ranks are kept in groups by state, a sample costs
O(#groups), and the rotation picks the member only among tied groups.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..bucketed.common import _I64_MAX as _BIG
from ..bucketed.common import _grow, _helper, _new

# Compile time follows the rules in ``bucketed/common.py``. In particular a
# variable passed to a helper starts as np.int64(...), never a literal: Numba
# types a loop's first pass with the literal and compiles the helper for it too.
_BLOCK = 4096  # lengths are gathered a block at a time so cache misses overlap


@njit(cache=True, error_model="numpy")
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


# Rows of the group state: one (10, W) int64 array, so kernels pass one array
# (a tuple of arrays costs a reference-count round trip per array per call).
_CNT, _MX, _COST, _TOK, _SIZE, _XOR, _RANK_GROUP, _ACTIVE, _FREE, _META = range(10)


@_helper
def _Groups(w):
    """Ranks grouped by batch state. Per group id (capacity W): count, max
    length, cost, tokens, size, xor of member ranks (the member itself for a
    singleton); rank -> group id; the active ids; a stack of free ids. Row
    _META holds (#active, #free)."""
    k = w if w > 2 else 2
    # np.empty and loops: compiles faster than np.zeros or _zeros(...).reshape.
    groups = np.empty((10, k), dtype=np.int64)
    for i in range(10):
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
    x = 0
    for r in range(w):
        x ^= r
        groups[_RANK_GROUP, r] = 0
    groups[_XOR, 0] = x
    groups[_ACTIVE, 0] = 0
    groups[_META, 0] = 1
    for k in range(w - 1):
        groups[_FREE, k] = w - 1 - k
    groups[_META, 1] = w - 1


@_helper
def _cmp(a, b):
    return (a > b) - (a < b)


@_helper
def _first_member(groups, g, rot0, w):
    """(member of group g with the smallest (rank - rot0) mod W, that rotation)."""
    if groups[_SIZE, g] == 1:
        r = groups[_XOR, g]
        d = r - rot0  # (r - rot0) mod w without a division: 0 <= rot0 < w
        return r, d + w if d < 0 else d
    for d in range(w):
        r = rot0 + d
        if r >= w:
            r -= w
        if groups[_RANK_GROUP, r] == g:
            return r, d
    return -1, -1


@_helper
def _choose_and_place(groups, ln, w, rot0, max_tokens, max_size):
    """Place a sample of length ``ln`` on the rank with the smallest seed key.

    Returns that rank, or -1 (nothing placed) when every rank is closed.
    """
    ng = groups[_META, 0]
    # Max/min of costs and tokens over ranks, multiplicities and runners-up.
    g0 = groups[_ACTIVE, 0]
    hi = lo = groups[_COST, g0]
    thi = tlo = groups[_TOK, g0]
    for i in range(1, ng):
        g = groups[_ACTIVE, i]
        v = groups[_COST, g]
        hi = v if v > hi else hi
        lo = v if v < lo else lo
        v = groups[_TOK, g]
        thi = v if v > thi else thi
        tlo = v if v < tlo else tlo
    nhi = nlo = nthi = ntlo = np.int64(0)
    hi2 = thi2 = np.int64(-1)
    lo2 = tlo2 = _BIG
    for i in range(ng):
        g = groups[_ACTIVE, i]
        k = groups[_SIZE, g]
        v = groups[_COST, g]
        if v == hi:
            nhi += k
        elif v > hi2:
            hi2 = v
        if v == lo:
            nlo += k
        elif v < lo2:
            lo2 = v
        v = groups[_TOK, g]
        if v == thi:
            nthi += k
        elif v > thi2:
            thi2 = v
        if v == tlo:
            ntlo += k
        elif v < tlo2:
            tlo2 = v
    # Keys per group; members differ only in the rotation.
    best = best_i = best_rank = best_rot = np.int64(-1)
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
            if cmp == 0:
                # Only the rotation can separate equal-keyed groups.
                if best_rank < 0:
                    best_rank, best_rot = _first_member(groups, best, rot0, w)
                r, rot = _first_member(groups, g, rot0, w)
                if rot > best_rot:
                    continue
                best, best_i, best_rank, best_rot = g, i, r, rot
                continue
        best, best_i, best_rank, best_rot = g, i, -1, -1
        b0, b1, b2, b3, b4, b5, b6 = k0, k1, k2, k3, pc, pt, nc
    if best < 0:
        return -1
    if best_rank < 0:
        best_rank, best_rot = _first_member(groups, best, rot0, w)
    # Move the rank to the group of its new state.
    r = best_rank
    c = groups[_CNT, best] + 1
    mx = groups[_MX, best]
    nm = ln if ln > mx else mx
    groups[_SIZE, best] -= 1
    groups[_XOR, best] ^= r
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
        groups[_XOR, target] = 0
    groups[_SIZE, target] += 1
    groups[_XOR, target] ^= r
    groups[_RANK_GROUP, r] = target
    groups[_META, 0] = ng
    return r
