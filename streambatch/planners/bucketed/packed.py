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

How (``packed_steps.pack_steps``): samples are ordered by a jittered length (the
length times a random factor in [1, 1 + bucket_width), drawn from (seed,
epoch)), so that near-equal lengths trade places from epoch to epoch; every
step then fills its W bins best-fit decreasing, serving the least costly bin
first. A step thus holds the longest samples left (lengths alike across
ranks, so their costs can match), its bins' costs stay within about one
short sample's cost of each other, and the rooms left are filled with ever
shorter samples, so bins close nearly full. Step order and the rank each bin
goes to are shuffled. O(N log N) for the sort, then O(N * W).

``drop_last=True`` leaves out (and returns as ``Plan.leftover``) the final
step when the data ran out before its bins were full; without it a final
step of fewer than W samples is padded as the contract says.
"""

from __future__ import annotations

import numpy as np

from ...core import compile_once as once  # called as once.compile_once: tests swap it
from ...core.constraint import BatchConstraint
from ...core.cost import INT64_MAX
from ...core.plan import Plan, assemble, finish_last_step, index_dtype

_U64 = 1 << 64
_TAG = 0x7061636B  # "pack": keeps these draws apart from the other planners' and windows' seeds


def _rng(seed: int, epoch: int) -> np.random.Generator:
    """Every draw of an epoch's packed plan comes from (seed, epoch) alone."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % _U64, epoch, _TAG])))


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
                seed: int, epoch: int, width: float) -> Plan:
    """Plan an epoch of packed batches (inputs validated: ``make_plan`` and the
    bucketed planner's option checks).

    lengths: (N,) int64 >= 0; constraint: the batch rule bound to them (its
    budget counts ``sum(L)``, its cost cap a batch's packed cost); width: the
    jitter of the length order (the bucketed planner's ``bucket_width``).
    Returns a Plan whose steps all have W non-empty batches, each within
    ``sum(L) <= max_batch_tokens`` and the size cap except a lone sample over
    the budget.
    """
    from .packed_steps import pack_steps  # lazy for start-up: no numba before the first plan

    n = lengths.shape[0]
    w = world_size
    dtype = index_dtype(n)
    if n == 0:
        empty = np.zeros(0, dtype=dtype)
        return assemble(empty, np.zeros((0, w), dtype=np.int64), np.zeros(0, dtype=np.int64), w)
    tokens, cap, max_cost = constraint.max_tokens, constraint.max_size, constraint.max_cost
    rng = _rng(seed, epoch) if shuffle else None
    keys = lengths.astype(np.float64)
    if rng is not None:
        keys *= 1.0 + width * rng.random(n)
    order = np.argsort(keys, kind="stable")
    ca, cb = constraint.coefficients
    # compiled once per node (or loaded) on a tiny input of the same argument types: core/compile_once.py
    once.compile_once("packed", (), lambda: pack_steps(np.arange(1, 9, dtype=np.int64), np.arange(1.0, 9.0), 2, 16,
                                                        4, 1, 0, INT64_MAX, np.empty(8, dtype=np.int64)))
    pos = np.empty(n, dtype=np.int64)
    counts, k, complete = pack_steps(np.ascontiguousarray(lengths[order]), np.ascontiguousarray(keys[order]), w,
                                     tokens, cap, ca, cb, max_cost, pos)
    counts = counts[: k * w].reshape(k, w)
    out = np.empty(n + w, dtype=dtype)
    out[:n] = order[pos]
    leftover = None
    padded = 0
    if not complete and drop_last:
        last = int(counts[-1].sum())
        leftover = out[n - last : n].copy()
        counts = counts[:-1]
    else:
        # a final step of fewer than W samples: its empty bins are padded with repeats
        out, counts, padded, _ = finish_last_step(out, counts, n, False)
    samples = out[: int(counts.sum())]
    steps = counts.shape[0]
    if rng is not None and steps:
        samples, counts = rotate_ranks(samples, counts, rng.integers(0, w, size=steps))
        step_order = rng.permutation(steps).astype(np.int64)
    else:
        step_order = np.arange(steps, dtype=np.int64)
    return assemble(samples, counts, step_order, w, padded, leftover)
