"""The plan: global steps of W per-rank batches, stored as a few flat arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Plan:
    """An epoch's global steps, each holding one non-empty batch per rank.

    samples: (n_out,) int32/int64 sample indices grouped by batch; batch ``b``
        is ``samples[offsets[b]:offsets[b + 1]]``.
    offsets: (n_steps * world_size + 1,) int64; batch ``b = s * W + r`` is
        rank ``r``'s batch of planned step ``s``.
    step_order: (n_steps,) int64; the ``i``-th step trained on is planned step
        ``step_order[i]``.
    num_padded: empty slots of the final step filled with a repeated sample (<= W - 1).
    num_dropped: samples left out (``drop_last=True``) in the final step.
    leftover: (num_dropped,) the dropped samples, for a streaming planner to
        carry into its next window.
    fewest_steps: the fewest steps any valid plan of the same samples and
        settings can have (``core/bounds.py``; None when not computed, e.g. a
        truncated plan); exact for padded batches, a lower bound for packed
        ones (``fewest_exact`` False).
    too_long: (k,) int64 samples the long-sample policy left out of the plan
        (``make_plan(..., long_samples="drop")``: longer than the budget
        alone), None when none were.
    """

    samples: np.ndarray
    offsets: np.ndarray
    step_order: np.ndarray
    world_size: int
    num_padded: int = 0
    num_dropped: int = 0
    leftover: np.ndarray | None = None
    fewest_steps: int | None = None
    fewest_exact: bool = True
    too_long: np.ndarray | None = None

    @property
    def num_too_long(self) -> int:
        """Samples the long-sample policy left out (``too_long``; ``make_plan(long_samples="drop")``)."""
        return 0 if self.too_long is None else int(self.too_long.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.step_order.shape[0])

    @property
    def steps_ratio(self) -> float | None:
        """``num_steps / fewest_steps`` (1.0 when both are 0), or None when the fewest is not known."""
        if self.fewest_steps is None:
            return None
        if self.fewest_steps == 0:
            return 1.0 if self.num_steps == 0 else float("inf")
        return self.num_steps / self.fewest_steps

    def batch(self, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s batch of the ``step``-th step in training order."""
        b = int(self.step_order[step]) * self.world_size + rank
        return self.samples[self.offsets[b] : self.offsets[b + 1]]

    def rank_batches(self, rank: int) -> RankBatches:
        return RankBatches(self, rank)

    def batch_sizes(self) -> np.ndarray:
        """(n_steps, W) int64 batch sizes in training order."""
        sizes = np.diff(self.offsets).reshape(-1, self.world_size)
        return sizes[self.step_order]

    def fingerprint(self) -> int:
        """A 63-bit hash of the whole plan (same on every rank that planned alike)."""
        from .hashing import hash_array  # lazy for start-up: no numba before the first plan

        # int64, the type of the running hash hash_array returns: one compiled
        # signature for every call (the value equals the uint64 seed's, which
        # the first mix turns signed anyway; bench/plan_hashes.py checks it).
        h = np.int64(self.world_size)
        h = hash_array(self.samples, h)
        h = hash_array(self.offsets, h)
        h = hash_array(self.step_order, h)
        return int(h) >> 1


class RankBatches(Sequence):
    """Lazy ``Sequence[list[int]]`` of one rank's batches, in training order."""

    def __init__(self, plan: Plan, rank: int):
        self._plan = plan
        self._rank = rank

    def __len__(self) -> int:
        return self._plan.num_steps

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"batch index {i} out of range for {n} batches")
        return self._plan.batch(i, self._rank).tolist()

    def __repr__(self) -> str:
        return f"RankBatches(rank={self._rank}, num_batches={len(self)})"


def index_dtype(n: int) -> type:
    """The dtype of a plan's sample indices over ``n`` samples: int32 while
    they fit (it halves the plan's memory), else int64."""
    return np.int32 if n < 2**31 - 1024 else np.int64


def assemble(samples: np.ndarray, counts: np.ndarray, step_order: np.ndarray, world_size: int,
             num_padded: int = 0, leftover: np.ndarray | None = None, fewest_steps: int | None = None,
             fewest_exact: bool = True) -> Plan:
    """Build a Plan from samples grouped by (step, rank) and (n_steps, W) batch sizes."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts.ravel(), out=offsets[1:])
    if leftover is None:
        leftover = samples[:0]
    return Plan(samples[: offsets[-1]], offsets, step_order.astype(np.int64, copy=False), world_size,
                num_padded, int(leftover.shape[0]), leftover, fewest_steps, fewest_exact)


def finish_last_step(samples: np.ndarray, counts: np.ndarray, n_used: int, drop_last: bool
                     ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Make the final step full: drop it (``drop_last``) or pad its empty slots.

    Padding rule: the k-th empty rank (in rank order) of the final step gets a
    one-sample batch holding the sample at position ``k mod m`` of that step's
    ``m`` samples (as stored, i.e. grouped by rank). So at most W - 1 slots
    are padded; when ``m`` is smaller than the number of empty slots a sample
    fills several (N = 1, W = 8: it is trained on 8 times). Every padded
    batch is within budget unless that
    sample alone exceeds it.

    samples: (>= n_used + W,) sample buffer; counts: (n_steps, W) int64.
    Returns (samples, counts, num_padded, leftover) where leftover holds the
    dropped samples.
    """
    none = samples[:0]
    if counts.shape[0] == 0:
        return samples, counts, 0, none
    last = counts[-1]
    empty = np.flatnonzero(last == 0)
    if empty.size == 0:
        return samples, counts, 0, none
    m = int(last.sum())
    start = n_used - m
    if drop_last:
        return samples, counts[:-1], 0, samples[start:n_used].copy()
    step_samples = samples[start:n_used].copy()
    batches = np.split(step_samples, np.cumsum(last)[:-1])  # one per rank, empty ones included
    for k, r in enumerate(empty):
        batches[r] = step_samples[k % m : k % m + 1]
    filled = np.concatenate(batches)
    samples[start : start + filled.size] = filled
    counts = counts.copy()
    counts[-1, empty] = 1
    return samples, counts, int(empty.size), none


def config_fingerprint(lengths: np.ndarray, *values: int | str) -> int:
    """A 63-bit hash of the lengths and configuration values (ints, strings)."""
    from .hashing import hash_array  # lazy for start-up: no numba before the first plan

    h = hash_array(lengths, np.int64(len(values)))  # int64: see Plan.fingerprint
    for v in values:
        if isinstance(v, str):
            arr = np.frombuffer(v.encode(), dtype=np.uint8).astype(np.int64)
        else:
            arr = np.array([int(v) & 0x7FFFFFFFFFFFFFFF, int(v) >> 63], dtype=np.int64)
        h = hash_array(arr, h)
    return int(h) >> 1
