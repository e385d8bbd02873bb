"""The seed-exact greedy planner (plan layer).

Bit-exact with the VoxCPM ``DynamicBatchSampler`` wherever the seed gives every
rank the same number of batches; see ``finish_last_step`` for the one place it
differs (the final step's empty slots are padded instead of left empty).
"""

from __future__ import annotations

import numpy as np

from ...core import compile_once as once  # called as once.compile_once: tests swap it
from ...core.constraint import BatchConstraint, BatchLimits
from ...core.plan import Plan, assemble, finish_last_step, index_dtype
from ..base import Planner


def seed_chunk_size(world_size: int, max_batch_size: int) -> int:
    """The seed's sortish chunk: 8 steps' worth of samples, within [64, 512]."""
    return min(max(64, world_size * max(1, max_batch_size) * 8), 512)


def plan_greedy(lengths: np.ndarray, constraint: BatchConstraint, world_size: int, shuffle: bool, drop_last: bool,
                seed: int, epoch: int) -> Plan:
    """Plan an epoch like the seed. Inputs must already be validated.

    lengths: (N,) int64 >= 0; constraint: the budget and cap bound to them
    (the seed's B * L**2 cost, no cost cap). Returns a Plan whose steps all
    have W non-empty batches.
    """

    dtype = index_dtype(lengths.shape[0])
    # The kernels this plan calls, compiled once per node (or loaded) on a tiny
    # input with the same argument types: see ``core/compile_once.py``.
    once.compile_once("greedy", (np.dtype(dtype).name, shuffle),
                 lambda: _plan(np.arange(1, 41, dtype=np.int64), BatchLimits(400, 8).bind(np.arange(1, 41), 2), 2,
                               shuffle, False, 0, dtype))
    return _plan(lengths, constraint, world_size, shuffle, drop_last, seed + epoch, dtype)


def _plan(lengths: np.ndarray, constraint: BatchConstraint, w: int, shuffle: bool, drop_last: bool, seed: int,
          dtype: type) -> Plan:
  # lazy for start-up: no numba before the first plan
    from ..toolkit import seed_key
    from .mt19937 import mt_new, shuffle_slice
    from .order import sortish_order
    from .placement import greedy_steps

    n = lengths.shape[0]
    mt = mt_new(seed_key(seed))
    # Two index buffers serve the whole pipeline (sort, chunk shuffle, plan):
    # with int32 indices, planning costs ~8 bytes per sample beyond the lengths.
    buf_a = np.empty(n + w, dtype=dtype)
    buf_b = np.empty(n + w, dtype=dtype)
    if shuffle:
        chunk = seed_chunk_size(w, constraint.limits.max_batch_size)  # the seed's chunk follows the cap as set
        sortish_order(lengths, chunk, mt, buf_a, buf_b, np.empty(-(-n // chunk), dtype=dtype))
    else:
        buf_a[:n] = np.arange(n, dtype=dtype)
    # The constraint's cap is at most N (bounding kernel buffers) and its budget clamped and range-checked.
    flat, n_steps = greedy_steps(buf_a[:n], lengths, w, constraint.max_tokens, constraint.max_size, buf_b)
    counts = flat[: n_steps * w].reshape(n_steps, w)
    del buf_a
    samples, counts, padded, leftover = finish_last_step(buf_b, counts, n, drop_last)
    # In the index dtype: the one array type shuffle_slice is compiled for (sortish_order's).
    step_order = np.arange(counts.shape[0], dtype=dtype)
    if shuffle:
        shuffle_slice(mt, step_order, 0, step_order.shape[0])
    return assemble(samples, counts, step_order, w, padded, leftover)


PLANNER = Planner(
    "greedy", plan_greedy, options=(), costs=("quadratic",),
    summary="the seed's greedy global-step planner, batch for batch (the sampler's default)",
    takes_constraint=True, kernels="streambatch.planners.greedy.placement",
)
