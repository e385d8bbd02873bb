"""Packed plans where the size cap binds: a fixed number of batches, filled
evenly (the fallback of ``packed.plan_packed``).

When the mean length left is below ``budget / cap``, the fewest batches is
about ``ceil(N / cap)`` and nearly every batch must hold ``cap`` samples: the
step-by-step best fit of ``packed_steps.pack_plan`` fills its first batches
with long samples up to the budget a few samples short of the cap, and those
slots are lost (Common Voice Pashto at twice its longest clip: 906 batches
where 860 are possible). Here the number of batches is fixed first, m = W x
S, and the samples, longest first, each go to the batch with the fewest
tokens that still has a free slot (longest processing time first, with the
size cap): every batch ends with about the mean tokens and ``cap`` samples.
The smallest S from the fewest steps up to the step limit for which every
sample fits is kept; batches are then dealt to steps by cost, so a step's
W batches cost alike.

The kernel (``even_pack``) is arrays in, arrays out; ``plan_even`` is the
plan layer's part (pure numpy).
"""

from __future__ import annotations

import numpy as np

from ...core.jit import njit  # numba's, with a cache that may fail to save (core/jit.py)
from ..toolkit import _new


@njit(cache=True, no_cfunc_wrapper=True, error_model="numpy")
def even_pack(slen, m, max_tokens, max_size, ca, cb, bin_of, tok, cnt, cost):
    """Deal samples, longest first, into m batches: each to the open batch
    with the fewest tokens (ties: the lower index), a batch closing at
    ``max_size`` samples.

    slen: (n,) int64 lengths, longest first, each <= max_tokens; m >= 1;
    max_tokens, max_size >= 1; (ca, cb): the cost coefficients. Fills
    bin_of (n,) int64 (the batch of each sample), tok, cnt, cost (m,) int64
    (each batch's tokens, samples and packed cost). Returns True when every
    sample fit (within the budget, a free slot left), else False (the
    arrays then hold a partial deal).
    """
    n = slen.shape[0]
    heap = _new(m)  # open batches, a binary min-heap on (tokens, index)
    for b in range(m):
        heap[b] = b
        tok[b] = 0
        cnt[b] = 0
        cost[b] = 0
    hs = m
    for i in range(n):
        if hs == 0:
            return False
        b = heap[0]
        ln = slen[i]
        if tok[b] + ln > max_tokens:
            return False
        bin_of[i] = b
        tok[b] += ln
        cnt[b] += 1
        cost[b] += ln * (ca * ln + cb)
        if cnt[b] == max_size:  # full: the last open batch takes the root
            hs -= 1
            heap[0] = heap[hs]
        x = heap[0]
        j = 0
        while True:  # sift the root down
            c = 2 * j + 1
            if c >= hs:
                break
            if c + 1 < hs and (tok[heap[c + 1]] < tok[heap[c]] or
                               (tok[heap[c + 1]] == tok[heap[c]] and heap[c + 1] < heap[c])):
                c += 1
            y = heap[c]
            if tok[y] > tok[x] or (tok[y] == tok[x] and y > x):
                break
            heap[j] = y
            j = c
        heap[j] = x
    return True


def plan_even(lengths: np.ndarray, w: int, lo: int, hi: int, max_tokens: int, max_size: int, ca: int, cb: int,
              key: np.uint64) -> tuple[np.ndarray, np.ndarray] | None:
    """The fewest steps S in [lo, hi] whose W x S batches ``even_pack`` fills,
    as (samples (N,) int64 grouped by step and rank, counts (S, W) int64), or
    None when none does. lengths: (N,) int64, each <= max_tokens, N >= W x lo;
    key: the epoch's draws (ties among equal lengths are broken in a random
    order drawn from it, so near-equal samples trade batches across epochs).
    Success is not strictly monotone in S: the smallest S found by bisection
    between a failing lo - 1 and a succeeding hi is kept."""
    from ..toolkit import step_permutation  # lazy for start-up: no numba before the first plan

    n = lengths.shape[0]
    perm = step_permutation(n, key)
    order = perm[np.argsort(-lengths[perm], kind="stable")]
    slen = np.ascontiguousarray(lengths[order], dtype=np.int64)
    bin_of = np.empty(n, dtype=np.int64)

    def deal(s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        m = w * s
        if m > n or m < 1:
            return None
        tok, cnt, cost = (np.empty(m, dtype=np.int64) for _ in range(3))
        ok = even_pack(slen, np.int64(m), np.int64(max_tokens), np.int64(max_size), np.int64(ca), np.int64(cb),
                       bin_of, tok, cnt, cost)
        return (bin_of.copy(), cnt, cost) if ok else None

    best = deal(hi)
    if best is None:
        return None
    found = hi
    a, b = lo - 1, hi  # deal(b) succeeds; search (a, b]
    while b - a > 1:
        mid = (a + b) // 2
        got = deal(mid)
        if got is None:
            a = mid
        else:
            b, best, found = mid, got, mid
    bins, cnt, cost = best
    # Batches by cost, costliest first, W to a step: a step's batches cost alike.
    by_cost = np.argsort(-cost, kind="stable")
    slot = np.empty(by_cost.size, dtype=np.int64)
    slot[by_cost] = np.arange(by_cost.size, dtype=np.int64)
    grouped = order[np.argsort(slot[bins], kind="stable")]
    return grouped.astype(np.int64), cnt[by_cost].reshape(found, w)
