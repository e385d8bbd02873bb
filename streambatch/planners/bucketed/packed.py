"""Packed (padding-free) planning, the plan layer: ``make_plan(...,
planner="bucketed", pack=True)``.

For models whose attention is restricted to each sample of a concatenated
sequence (flash-attn's varlen kernels, ``flex_attention`` with a document
mask, SDPA with a block-diagonal mask): a rank's micro-batch is a set of
samples concatenated along time, with no padding, so the budget rule is
``sum(L) <= max_batch_tokens`` (and at most ``max_batch_size`` samples; a lone
sample over the budget is a batch of its own, as in padded planning), and a
micro-batch costs ``sum(c1 * L + c2 * L**2)`` (``CostModel.packed_cost``),
not ``B * max(L)**2``.

How (``packed_steps.pack_plan``): samples are counting-sorted into the length
buckets of the bucketed planner (geometric, ``bucket_width`` apart, the grid
shifted each epoch), in random order inside each bucket, so that near-equal
lengths trade places from epoch to epoch; every step then fills its W bins
best-fit decreasing, serving the least costly bin first. A step thus holds
the longest samples left (lengths alike across ranks, so their costs can
match), its bins' costs stay within about one short sample's cost of each
other, and the rooms left are filled with ever shorter samples, so bins close
nearly full; where the size cap would close a bin before its tokens, its
long samples leave room for short ones. Step order and the rank each bin
goes to are shuffled. O(N log W) after an O(N) counting sort; about 14 bytes
per sample (the padded planner's arrays: index and length orders, scratch).

Steps: at most the batch rule's limit (``BatchConstraint.step_limit``:
1.05 x the fewest + 1, or ``max_steps``), the fewest here being a
bin-packing lower bound (``core/bounds.py``); a plan over it is planned again
the other way (the short samples shared out where they were not, or not where
they were: ``cap_binds``), and the one with fewer steps kept. Still over it
(no cost cap, no curve, no ``drop_last``, no sample over the budget), the
samples are dealt into a fixed number of batches (``packed_even.py``: where
the size cap binds, best fit step by step loses slots), the fewest steps
that fill kept when they are fewer.

``drop_last=True`` leaves out (and returns as ``Plan.leftover``) the final
step when the data ran out before its bins were full; without it a final
step of fewer than W samples is padded as the contract says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...core import compile_once as once  # called as once.compile_once: tests swap it
from ...core.bounds import length_histogram
from ...core.constraint import NO_TABLE, BatchConstraint
from ...core.cost import INT64_MAX
from ...core.plan import Plan, assemble, finish_last_step, index_dtype

_EVEN_SALT = 0x6576656E  # "even": the key of ``packed_even``'s tie order


def rotate_ranks(samples: np.ndarray, counts: np.ndarray, rot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bin j of step s goes to rank (j + rot[s]) % W.

    samples: grouped by (step, bin); counts: (k, W) int64; rot: (k,) int64.
    Returns (samples, counts) grouped by (step, rank)."""
    k, w = counts.shape
    if k == 0:
        return samples, counts
    ranks = np.arange(w, dtype=np.int64)
    src = (np.arange(k, dtype=np.int64)[:, None] * w + (ranks[None, :] - rot[:, None]) % w).ravel()
    flat = counts.ravel()
    starts = np.concatenate([[0], np.cumsum(flat)[:-1]])
    sizes = flat[src]
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    gather = np.repeat(starts[src] - first, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
    return samples[gather], sizes.reshape(k, w)


def plan_packed(lengths: np.ndarray, constraint: BatchConstraint, world_size: int, shuffle: bool, drop_last: bool,
                key: np.uint64, edges: Callable[[int], np.ndarray]) -> Plan:
    """Plan an epoch of packed batches (inputs validated: ``make_plan`` and the
    bucketed planner's option checks).

    lengths: (N,) int64 >= 0; constraint: the batch rule bound to them (its
    budget counts ``sum(L)``, its cost cap a batch's packed cost, its
    ``step_limit`` the most steps); key: the epoch's 64-bit key (from the
    bucketed planner's ``plan_key``); edges(max_len): the epoch's (k,) int64
    bucket edges. Returns a Plan whose steps all have W non-empty batches,
    each within ``sum(L) <= max_batch_tokens`` and the size cap except a lone
    sample over the budget, reporting its fewest steps (a lower bound).
    """
    # lazy for start-up: no numba before the first plan
    from ..toolkit import step_permutation
    from .packed_steps import pack_plan
    from .sort import table_size

    n = lengths.shape[0]
    w = world_size
    dtype = index_dtype(n)
    if n == 0:
        empty = np.zeros(0, dtype=dtype)
        return assemble(empty, np.zeros((0, w), dtype=np.int64), np.zeros(0, dtype=np.int64), w, fewest_steps=0,
                        fewest_exact=False)
    lmax = constraint.max_len
    tokens, cap, max_cost = constraint.max_tokens, constraint.max_size, constraint.max_cost
    histogram = length_histogram(lengths)
    bound = constraint.step_bound(lengths, drop_last, histogram)
    limit = constraint.step_limit(bound.steps)
    ca, cb = constraint.coefficients
    len_dtype = np.int16 if lmax < 2**15 else np.int32 if lmax < 2**31 else np.int64
    # compiled once per node (or loaded) on a tiny input of the same argument types: core/compile_once.py
    once.compile_once("packed", (np.dtype(dtype).name, np.dtype(len_dtype).name, shuffle),
                      lambda: (_pack(np.arange(1, 9, dtype=np.int64), np.arange(1, 10, dtype=np.int64), np.uint64(0),
                                     shuffle, 2, 16, 4, NO_TABLE, 1, 0, INT64_MAX, True, dtype, len_dtype, pack_plan,
                                     table_size),
                               shuffle and step_permutation(2, np.uint64(0))))
    # Best fit, or (where the size cap would close bins of the shortest samples long before their tokens) with
    # the short samples shared out; the other way too when the first takes more steps than the limit.
    spread = cap_binds(histogram, tokens, cap, w)
    e = edges(lmax)
    ttab = constraint.token_table
    out, counts, k, complete = _pack(lengths, e, key, shuffle, w, tokens, cap, ttab, ca, cb, max_cost, spread, dtype,
                                     len_dtype, pack_plan, table_size)
    # Under a limit curve the bins close by the curve (a count of samples at their longest length), where the size
    # cap's sharing out matters little, and the packed bound is looser (``core/bounds.py``): the other way is not
    # tried (measured, bench/planning.py --limit: 504 steps, the other way 505, at twice the planning time).
    if limit is not None and k > limit and not constraint.curved:
        other = _pack(lengths, e, key, shuffle, w, tokens, cap, ttab, ca, cb, max_cost, not spread, dtype, len_dtype,
                      pack_plan, table_size)
        if other[2] < k:
            out, counts, k, complete = other
    if (limit is not None and k > limit and not constraint.curved and max_cost == INT64_MAX and not drop_last
            and lmax <= tokens and n >= w * max(bound.steps, 1)):
        # Still over: where the size cap binds, best fit step by step loses slots (``packed_even.py``). A fixed
        # number of batches, each sample to the emptiest with a free slot, as few steps as fill.
        from .packed_even import plan_even  # lazy for start-up: no numba before the first plan

        even = plan_even(lengths, w, max(bound.steps, 1), limit, tokens, cap, ca, cb, np.uint64(int(key) ^ _EVEN_SALT))
        if even is not None and even[1].shape[0] < k:
            grouped, by_step = even
            out = np.empty(n + w, dtype=dtype)
            out[:n] = grouped
            k = by_step.shape[0]
            # rank r of step s takes the step's batch (r + s) % W: batch j goes to rank (j - s) % W
            out[:n], by_rank = rotate_ranks(out[:n], by_step, (-np.arange(k, dtype=np.int64)) % w)
            counts = by_rank.ravel()
            complete = True
    counts = counts[: k * w].reshape(k, w)
    leftover = None
    padded = 0
    if not complete and drop_last:
        last = int(counts[-1].sum())
        leftover = out[n - last : n].copy()
        counts = counts[:-1]
    else:
        # a final step of fewer than W samples: its empty bins are padded with repeats
        out, counts, padded, _ = finish_last_step(out, counts, n, False)
    steps = counts.shape[0]
    step_order = step_permutation(steps, key) if shuffle else np.arange(steps, dtype=np.int64)
    return assemble(out, counts, step_order, w, padded, leftover, bound.steps, False)


def cap_binds(histogram: tuple[np.ndarray, np.ndarray], tokens: int, cap: int, w: int) -> bool:
    """Would best fit leave the shortest samples to bins closed by the size
    cap far below the budget? True when the W x cap shortest samples (a step
    of such bins) hold under 90 % of W budgets. histogram:
    ``length_histogram`` (lengths descending, counts)."""
    values, counts = histogram
    need = w * cap
    run = np.cumsum(counts[::-1])  # samples from the shortest up
    k = int(np.searchsorted(run, need))  # the shortest need samples reach into value k from the short end
    if k >= values.shape[0]:
        return False  # fewer than a step of cap-full bins: nothing to share out
    short = values[::-1]
    below = int((short[:k] * counts[::-1][:k]).sum()) if k else 0
    taken = int(run[k - 1]) if k else 0
    return below + (need - taken) * int(short[k]) < 0.9 * w * tokens


def _pack(lengths: np.ndarray, edges: np.ndarray, key: np.uint64, shuffle: bool, w: int, tokens: int, cap: int,
          ttab: np.ndarray, ca: int, cb: int, max_cost: int, spread: bool, dtype: type, len_dtype: type,
          pack_plan: Callable[..., Any], table_size: Callable[[int, int], int]
          ) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """``kernels.pack_plan`` with its scratch arrays: (out (N + W,), counts, steps, complete)."""
    n = lengths.shape[0]
    table = np.empty(table_size(int(lengths.max()), n), dtype=np.int32)
    order = np.empty(n, dtype=dtype)
    slen = np.empty(n, dtype=len_dtype)
    scratch = np.empty(n, dtype=len_dtype)
    out = np.empty(n + w, dtype=dtype)
    counts, k, complete = pack_plan(lengths, edges, table, key, shuffle, w, tokens, cap, ttab, ca, cb, max_cost,
                                    spread, order, slen, out, scratch)
    return out, counts, int(k), bool(complete)
