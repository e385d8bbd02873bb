"""The bucketed planner (plan layer): ``make_plan(..., planner="bucketed")``.

Named for its first move: samples are counting-sorted into narrow length
buckets (geometric, ``bucket_width`` apart) and shuffled inside each bucket,
so a batch holds near-equal lengths (little padding) while its members change
from epoch to epoch; the bucket grid itself shifts by a random fraction of a
bucket each epoch. Steps of W batches are then laid out along that order, one
at a time, from both ends towards the densest bucket (``steps.plan_steps``
tries a few layouts per step and keeps the one wasting the least padding,
straggler time and budget), and the leftovers of both sides are finished
together where lengths are densest. Step order and the rank each batch of a
step goes to are shuffled.

All of it is O(N) after an O(N) counting sort, and the plan is a pure function
of (lengths, budget, cap, world size, shuffle, drop_last, seed, epoch,
options): no clock, pid or global RNG.

Options (keywords of ``make_plan``):

- ``bucket_width`` (default 0.02): relative width of a length bucket, in
  [0.001, 1]. Wider buckets shuffle more (a sample keeps fewer batch-mates across
  epochs) and pad more: at 0.02 padding efficiency stays near 0.98.
- ``cost``: a ``CostModel`` or the name of one (default: the seed's B * L**2);
  what balance across ranks is measured in.
- ``max_step_cost``: optional cap, in cost units, on every batch's cost. A
  synchronous step lasts as long as its costliest batch, so this caps the
  cost of a step: steps of long utterances get fewer samples instead of
  taking longer. A lone sample above it still forms a batch of one, as with
  the token budget.

- ``pack`` (default False): plan packed, padding-free batches instead
  (``bucketed/packed.py``): ``sum(L) <= max_batch_tokens`` per batch,
  balanced under the packed cost ``sum(c1 * L + c2 * L**2)``, for models
  whose attention is restricted to each sample of a concatenated sequence.
  ``bucket_width`` then sets the width of the length buckets samples are
  counting-sorted into.
- ``max_steps`` (default None): the most steps a plan may take; None: 1.05 x
  the fewest any valid plan can have + 1 (``core/bounds.py``). A layout
  over it is replaced by the best candidate within it (``step_limit.py``:
  the head of long samples cut back, or the fill of ``fill.py``); with a
  fitted step model (``c0 > 0``) a plan over it is kept only when the model
  predicts it faster, and ``Plan.fewest_steps`` shows by how much.
- ``limit`` (default None): the largest batch per padded length, a hard
  limit beside the budget (``core/limits.py``: a ``LimitCurve``, a fitted
  ``MemoryModel``'s curve, a bucket profile or a per-length table). Every
  fill loop asks its lookup table (``BatchConstraint.size_table``); packed,
  a batch's tokens stay within that many samples of its longest length.

``drop_last=True`` leaves out (and returns as ``Plan.leftover``) only the
samples that cannot give every rank a non-empty batch, and rotates them from
epoch to epoch (``planners/tail.py``); a streamed window before the epoch's
last leaves out all that cannot complete a step, carried into the next
window. Without it they are dealt evenly into the final one or two steps,
and a final step of fewer than W samples is padded as the foundation's rule
says.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...core import compile_once as once  # called as once.compile_once: tests swap it
from ...core.constraint import NO_TABLE, BatchConstraint
from ...core.cost import INT64_MAX
from ...core.plan import Plan, assemble, finish_last_step, index_dtype
from ..base import Planner
from ..options import BUCKET_WIDTH, COST, COST_KINDS, DEFAULT_BUCKET_WIDTH, LIMIT, MAX_STEP_COST, MAX_STEPS, PACK
from ..tail import epoch_drop_last
from .fill import fill_plan
from .packed import plan_packed
from .step_limit import NO_HEAD, within_limit

_SALT = 0x6275636B65746564  # "bucketed"
_M64 = (1 << 64) - 1


def _mix(h: int, v: int, signed: bool = False) -> int:
    """``core.hashing._mix`` in Python ints (h, v, result in [0, 2**64)), so
    keys cost no compiled code. ``signed``: the shifts of Numba's int64
    typing, which ``hash_array`` uses (tests check both against Numba)."""
    def shr(z: int, k: int) -> int:
        return ((z - (1 << 64) if signed and z >> 63 else z) >> k) & _M64

    z = ((h ^ v) + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ shr(z, 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ shr(z, 27)) * 0x94D049BB133111EB) & _M64
    return z ^ shr(z, 31)


def _hash_words(words: np.ndarray, h: int) -> int:
    """``core.hashing.hash_array(words.astype(np.int64), h)``, bit for bit."""
    h = _mix(h, words.size, True)
    for v in words.tolist():
        h = _mix(h, int(v) & _M64, True)
    return h


def plan_key(seed: int, epoch: int) -> np.uint64:
    """The 64-bit key all of an epoch's randomness is drawn from."""
    # np.uint64, not a Python int (which Numba types as int64 or uint64 by
    # value): one compiled signature per kernel.
    from ..toolkit import seed_key  # lazy for start-up: no numba before the first plan

    h = _mix(_hash_words(seed_key(seed), _SALT), int(seed < 0))
    return np.uint64(_hash_words(seed_key(epoch), h))


def subkey(key: np.uint64, i: int) -> np.uint64:
    """The i-th independent 64-bit key drawn from ``key``."""
    return np.uint64(_mix(int(key), i))


def bucket_edges(max_len: int, width: float, phase: float) -> np.ndarray:
    """(k,) int64 strictly increasing bucket edges >= 1, the last > max_len.

    Lengths below 1 / width get a bucket each (edges 1, 2, ...); above, edges
    grow geometrically by 1 + width, from (1 / width) * (1 + width * phase)
    on. Built by repeated float multiplication, which is exactly rounded, so
    every machine computes the same edges.
    """
    start = int(min(np.ceil(1.0 / width), max_len + 1))
    edges = list(range(1, start + 1))
    e = start * (1.0 + width * phase)
    while edges[-1] <= max_len:
        v = int(np.ceil(e))
        if v > edges[-1]:
            edges.append(v)
        e *= 1.0 + width
    return np.array(edges, dtype=np.int64)


def plan_bucketed(lengths: np.ndarray, constraint: BatchConstraint, world_size: int, shuffle: bool,
                  drop_last: bool, seed: int, epoch: int, bucket_width: float = DEFAULT_BUCKET_WIDTH) -> Plan:
    """Plan an epoch with the bucketed planner. Inputs must already be
    validated (``make_plan`` does it).

    lengths: (N,) int64 >= 0; constraint: the batch rule bound to them (its
    ``pack`` plans packed batches: ``packed.py``; its ``step_limit``, the
    most steps the plan may take: ``step_limit.py``). Returns a Plan whose
    steps all have W non-empty batches, reporting the fewest steps
    (``Plan.fewest_steps``); with ``drop_last`` what is left out is returned
    as ``leftover``: the tail that cannot complete a step where the
    constraint is ``carry`` (a streamed window's, carried on), else only
    what cannot give every rank a batch, rotated (``tail.epoch_drop_last``).
    """
    if drop_last and not constraint.carry and lengths.shape[0]:
        # an epoch's own drop_last (not a streamed window's, carried on): as little left out as the step
        # limit allows, rotated over epochs by a permutation of the samples fixed by the seed alone (tail.py);
        # the plans it weighs are this planner's own rule (carry: what cannot complete a step is left out)
        rotation = (int(subkey(plan_key(seed, 0), 7)), epoch) if shuffle else None
        return epoch_drop_last(lengths, constraint, lambda drop, cap: plan_bucketed(
            lengths, dataclasses.replace(constraint, carry=True, step_cap=cap), world_size, shuffle, drop, seed, epoch,
            bucket_width), rotation)
    if constraint.pack:
        key = plan_key(seed, epoch)
        phase = float(subkey(key, 1) >> np.uint64(11)) / 2.0**53 if shuffle else 0.0
        return plan_packed(lengths, constraint, world_size, shuffle, drop_last, subkey(key, 6),
                           lambda lmax: bucket_edges(lmax, bucket_width, phase))

    n = lengths.shape[0]
    w = world_size
    dtype = index_dtype(n)
    if n == 0:
        empty = np.zeros(0, dtype=dtype)
        return assemble(empty, np.zeros((0, w), dtype=np.int64), np.zeros(0, dtype=np.int64), w, fewest_steps=0)
    lmax = constraint.max_len
    cost = constraint.cost
    tokens, cap, max_cost = constraint.max_tokens, constraint.max_size, constraint.max_cost
    bound = constraint.step_bound(lengths, drop_last)
    limit = constraint.step_limit(bound.steps)
    # Sorted lengths in the narrowest dtype that holds them: the step kernel
    # streams through them several times.
    len_dtype = np.int16 if lmax < 2**15 else np.int32 if lmax < 2**31 else np.int64
    # The kernels this plan calls, compiled once per node (or loaded) on a tiny
    # input with the same argument types: see ``core/compile_once.py``.
    once.compile_once("bucketed", (np.dtype(dtype).name, np.dtype(len_dtype).name, shuffle),
                      lambda: _warm(dtype, len_dtype, shuffle))
    key = plan_key(seed, epoch)

    def lay_out(head_min: int) -> Plan:
        return _lay_out(lengths, lmax, tokens, cap, w, constraint.coefficients, np.int64(head_min), max_cost, shuffle,
                        drop_last, key, bucket_width, dtype, len_dtype, constraint.size_table)

    # The head of long samples (``head.py``) after an outlier: under B*L^2 alone its steps, each batch held
    # to one long sample's cost, cost no more than fuller ones, but they take more steps. A per-step cost (a
    # measured step model's c0) says they are slower: none then. Otherwise as far as the step limit allows.
    plan = lay_out(0 if cost.per_step <= 0 else NO_HEAD)
    if limit is not None and plan.num_steps > limit:
        def fill(level: int | None = None) -> Plan:
            # the same buckets, longest first (the ascending part reversed); level: a lower cost cap
            order, _, m = bucket_order(lengths, lmax, tokens, cap, shuffle, key, bucket_width, dtype, len_dtype)
            order = np.concatenate([order[m:], order[:m][::-1]])
            return fill_plan(lengths, order, tokens, cap, w, constraint.coefficients,
                             max_cost if level is None else min(max_cost, level), shuffle, drop_last,
                             subkey(key, 5), limit, constraint.size_table)

        plan = within_limit(plan, lengths, constraint, limit, lay_out, fill)
    return dataclasses.replace(plan, fewest_steps=bound.steps)


def _warm(dtype: type, len_dtype: type, shuffle: bool) -> None:
    """The bucketed kernels on a tiny input of these argument types (and the fill's)."""
    from .steps import fill_sizes, mix_batches  # lazy for start-up: no numba before the first plan

    _lay_out(np.arange(1, 41, dtype=np.int64), 40, 400, 8, 2, (1, 0), np.int64(0), INT64_MAX, shuffle, False,
             plan_key(0, 0), DEFAULT_BUCKET_WIDTH, dtype, len_dtype)
    tiny = np.arange(40, 0, -1, dtype=np.int64)
    fill_sizes(tiny, 400, 8, NO_TABLE, 1, 0, INT64_MAX)
    mix_batches(tiny, np.arange(0, 40, 10, dtype=np.int64), np.full(4, 10, dtype=np.int64), 2, plan_key(0, 0))


def bucket_order(lengths: np.ndarray, lmax: int, tokens: int, cap: int, shuffle: bool, key: np.uint64, width: float,
                 dtype: type, len_dtype: type, scratch_idx: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """(order, slen, m): the samples counting-sorted into the epoch's length
    buckets (``sort.bucket_sort``: buckets 0..d ascending in order[:m],
    the rest descending after them, shuffled inside each bucket), their
    lengths, and m. scratch_idx: (N,) of ``dtype`` to reuse, or None."""
    from .sort import bucket_sort, table_size  # lazy for start-up: no numba before the first plan

    n = lengths.shape[0]
    phase = float(subkey(key, 1) >> np.uint64(11)) / 2.0**53 if shuffle else 0.0
    edges = bucket_edges(lmax, width, phase)
    order = np.empty(n, dtype=dtype)
    slen = np.empty(n, dtype=len_dtype)
    scratch_idx = np.empty(n, dtype=dtype) if scratch_idx is None else scratch_idx
    scratch = np.empty(n, dtype=len_dtype)
    table = np.empty(table_size(lmax, n), dtype=np.int32)
    m = bucket_sort(lengths, edges, table, subkey(key, 2), shuffle, tokens, cap, order, slen, scratch_idx, scratch)
    return order, slen, int(m)


def _lay_out(lengths: np.ndarray, lmax: int, tokens: int, cap: int, w: int, coefficients: tuple[int, int],
             head_min: np.int64, max_cost: int, shuffle: bool, drop_last: bool, key: np.uint64, width: float,
             dtype: type, len_dtype: type, table: np.ndarray = NO_TABLE) -> Plan:
    """The kernel calls of ``plan_bucketed``: sort into buckets, lay steps out
    from both ends, finish the rest, shuffle the step order. table: the limit
    curve's sizes per length (``BatchConstraint.size_table``; (0,): none)."""
    # lazy for start-up: no numba before the first plan
    from ..toolkit import step_permutation
    from .steps import plan_steps

    n = lengths.shape[0]
    out = np.empty(n + w, dtype=dtype)
    order, slen, m = bucket_order(lengths, lmax, tokens, cap, shuffle, key, width, dtype, len_dtype, out[:n])
    # Lay steps out from the short end up and from the long end down; the
    # tails of both (under two steps each) meet where lengths are densest
    # and are finished there together, so no runt step lands in a sparse tail.
    args = (w, tokens, cap, table, *coefficients, max_cost, head_min)
    step_key = subkey(key, 3)
    low, k, n_low, stop_low = plan_steps(order[:m], slen[:m], *args, False, False, False, shuffle, step_key, 0, out)
    low = low[: k * w].reshape(k, w)
    high, k, n_high, stop_high = plan_steps(order[m:], slen[m:], *args, True, False, False, shuffle, step_key,
                                            low.shape[0], out[n_low:])
    high = high[: k * w].reshape(k, w)
    rest_order = np.concatenate([order[stop_low:m], order[m + stop_high :][::-1]])
    rest_len = np.concatenate([slen[stop_low:m], slen[m + stop_high :][::-1]])
    del order, slen
    end, k, n_end, stop = plan_steps(rest_order, rest_len, *args, False, True, drop_last, shuffle, step_key,
                                     low.shape[0] + high.shape[0], out[n_low + n_high :])
    end = end[: k * w].reshape(k, w)
    leftover = rest_order[stop:].copy()
    counts = np.concatenate([low, high, end])
    n_out = n_low + n_high + n_end
    out, counts, padded, _ = finish_last_step(out, counts, n_out, False)
    if shuffle:
        step_order = step_permutation(counts.shape[0], subkey(key, 4))
    else:
        step_order = np.arange(counts.shape[0], dtype=np.int64)
    return assemble(out, counts, step_order, w, padded, leftover)


PLANNER = Planner(
    "bucketed", plan_bucketed, options=(BUCKET_WIDTH, COST, MAX_STEP_COST, PACK, MAX_STEPS, LIMIT),
    costs=COST_KINDS,
    summary="length buckets, each step's W batches laid out to cost the same (recommended for new runs)",
    takes_constraint=True, kernels="streambatch.planners.bucketed.steps",
)
