"""The fill plan (plan layer): the bucketed planner's candidate of the
fewest steps when its layouts take more steps than its limit
(``step_limit.py``).

1. Fill: the samples, longest first, are cut into batches of consecutive
   ones, each filled until the next sample would break the budget, the size
   cap or the cost cap (``steps.fill_sizes``). On the exact order that is
   the fill of ``core/bounds.py``: the fewest batches any valid plan can
   have. The order used is the planner's own length buckets, longest first,
   shuffled inside each bucket (so batch-mates change from epoch to epoch);
   only if its fill takes more steps than the limit is the exact order (ties
   shuffled) used instead.
2. Spare batches (the limit's W x steps above the fill's count) go to the
   costliest batches: each above a common level is cut into near-equal runs
   (``_split_costliest``). A synchronous step lasts as long as its costliest
   batch, so this shortens the costliest steps; a run of a valid batch is
   valid.
3. The batches are dealt W to a step, costliest first, so a step's batches
   cost about the same. A final step of fewer than W batches has its batches
   split until every rank has one (if it holds W samples; else the
   contract's padding); with ``drop_last`` its batches are returned as
   leftover instead. Step order and the rank of each batch are shuffled.
4. With shuffling, batch-mates are shuffled inside each step
   (``steps.mix_batches``: every batch keeps its longest sample and its
   size, so it stays valid and costs the same): runs of the length order
   alone would keep most batch-mates from epoch to epoch.
"""

from __future__ import annotations

import numpy as np

from ...core.plan import Plan, assemble, finish_last_step
from .packed import rotate_ranks


def _rng(key: np.uint64) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(int(key)))


def _steps(batches: int, w: int, drop_last: bool) -> int:
    return batches // w if drop_last else -(-batches // w)


def _split_to(sizes: np.ndarray, w: int) -> np.ndarray:
    """Split the largest of ``sizes`` (the final step's batches, (r,) int64,
    in order) in halves until there are ``min(w, sum)`` of them; each half
    stays in place, so batches stay runs of the sorted order."""
    out = sizes.tolist()
    while len(out) < w and max(out) > 1:
        i = max(range(len(out)), key=lambda j: (out[j], -j))
        out[i : i + 1] = [out[i] - out[i] // 2, out[i] // 2]
    return np.array(out, dtype=np.int64)


def _runs(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(sum(sizes),) int64 positions of the runs ``starts[i]:starts[i] + sizes[i]``, run after run."""
    total = int(sizes.sum())
    first = np.cumsum(sizes) - sizes
    return np.repeat(starts - first, sizes) + np.arange(total, dtype=np.int64)


def _split_costliest(starts: np.ndarray, sizes: np.ndarray, slen: np.ndarray, coefficients: tuple[int, int],
                     room: int) -> tuple[np.ndarray, np.ndarray]:
    """Spend spare batches (up to ``room`` in all) on the costliest batches:
    every batch costing more than a level T is cut into m near-equal runs,
    m the fewest making each at most T by its longest (``m = ceil(cost /
    T)``, at most its size), with T the lowest level whose cuts fit in
    ``room``. A synchronous step lasts as long as its costliest batch, so
    this lowers the costliest steps first; runs of a sorted batch stay within
    every limit. starts, sizes: (B,) int64 runs of slen (the order's lengths)."""
    nb = sizes.shape[0]
    if nb == 0 or room <= nb:
        return starts, sizes
    ca, cb = coefficients
    longest = np.maximum.reduceat(slen, starts).astype(np.float64)
    cost = sizes * longest * (ca * longest + cb)

    def pieces(level: float) -> np.ndarray:
        return np.minimum(np.maximum(np.ceil(cost / level), 1), sizes).astype(np.int64)

    lo, hi = 0.0, float(cost.max())  # pieces(hi) fits (no cut); find the lowest level that does
    if lo == hi:
        return starts, sizes
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if int(pieces(mid).sum()) <= room:
            hi = mid
        else:
            lo = mid
    m = pieces(hi)
    if (m == 1).all():
        return starts, sizes
    # batch i becomes m[i] runs of sizes[i] // m[i] or one more (the longer runs first)
    rep = np.repeat(np.arange(nb), m)
    j = np.arange(rep.shape[0]) - np.repeat(np.cumsum(m) - m, m)
    base, extra = sizes[rep] // m[rep], sizes[rep] % m[rep]
    new_sizes = base + (j < extra)
    offset = j * base + np.minimum(j, extra)
    return (starts[rep] + offset).astype(np.int64), new_sizes.astype(np.int64)


def fill_plan(lengths: np.ndarray, order: np.ndarray, tokens: int, cap: int, w: int, coefficients: tuple[int, int],
              max_cost: int, shuffle: bool, drop_last: bool, key: np.uint64, limit: int,
              table: np.ndarray | None = None) -> Plan:
    """Plan the fewest steps (see the module docstring).

    lengths: (N,) int64 >= 0, N >= 1; order: (N,) the samples longest first
    by length bucket (shuffled inside each: the bucketed planner's order);
    tokens, cap: the clamped budget and size cap; coefficients, max_cost: the
    cost model's and its cap (scaled); limit: use ``order`` only if its
    fill takes at most this many steps, else the exact order. The fill's
    batches are then cut where that lowers the costliest
    (``_split_costliest``) as long as the plan stays within ``limit`` steps,
    and dealt to steps costliest first. Returns a Plan of at most ``limit``
    steps when the exact order's fill allows it (with ``drop_last`` the
    ``B mod W`` cheapest batches' samples are returned as leftover). table:
    the limit curve's sizes per length (``BatchConstraint.size_table``; (0,)
    or None: none): the fill honours it, and cutting batches only shrinks them.
    """
    from .steps import fill_sizes, mix_batches  # lazy for start-up: no numba before the first plan

    n = lengths.shape[0]
    dtype = order.dtype
    ca, cb = coefficients
    tab = np.zeros(0, dtype=np.int64) if table is None else table
    sizes = fill_sizes(np.ascontiguousarray(lengths[order]), tokens, cap, tab, ca, cb, max_cost)
    rng = _rng(key)
    if _steps(sizes.shape[0], w, drop_last) > limit:
        # exact: longest first, equal lengths in random order (index order without shuffling)
        tie = rng.random(n) if shuffle else np.arange(n)
        order = np.lexsort((tie, -lengths)).astype(dtype)
        sizes = fill_sizes(np.ascontiguousarray(lengths[order]), tokens, cap, tab, ca, cb, max_cost)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    slen = lengths[order]
    room = limit * w if drop_last else max(limit * w, sizes.shape[0])
    starts, sizes = _split_costliest(starts, sizes, slen, coefficients, room)
    # costliest first, W to a step: a step's batches cost about the same
    longest = np.maximum.reduceat(slen, starts) if starts.shape[0] else starts
    cost = sizes * longest * (ca * longest + cb)
    by_cost = np.lexsort((starts, -cost))
    starts, sizes = starts[by_cost], sizes[by_cost]
    nb = sizes.shape[0]
    full, r = divmod(nb, w)
    if drop_last:  # the r < W cheapest batches cannot fill a step: returned, for a stream to carry
        starts, sizes, gone = starts[: full * w], sizes[: full * w], (starts[full * w :], sizes[full * w :])
        leftover = order[_runs(*gone)].astype(dtype)
        r = 0
    else:
        leftover = order[:0].astype(dtype)
    samples = np.empty(n + w, dtype=dtype)
    used = int(sizes.sum())
    samples[:used] = order[_runs(starts, sizes)]
    counts = np.zeros((full + (r > 0), w), dtype=np.int64)
    counts[:full] = sizes[: full * w].reshape(full, w)
    padded = 0
    if r:  # a final step of fewer than W batches: split until every rank has one, if there are W samples
        tail = _split_to(sizes[full * w :], w)
        counts[full, : tail.shape[0]] = tail
        samples, counts, padded, _ = finish_last_step(samples, counts, used, False)
    steps = counts.shape[0]
    if shuffle:  # batch-mates shuffled inside every full step (not a padded one: it holds repeats)
        whole = (steps - (padded > 0)) * w
        flat = counts.ravel()[:whole]
        mixed = int(flat.sum())
        pos = mix_batches(lengths[samples[:mixed]], np.cumsum(flat) - flat, flat, w, key)
        samples[:mixed] = samples[pos]
    if shuffle and steps:
        rot = rng.integers(0, w, size=steps)
        samples, counts = rotate_ranks(samples[: int(counts.sum())], counts, rot)
        step_order = rng.permutation(steps).astype(np.int64)
    else:
        step_order = np.arange(steps, dtype=np.int64)
    return assemble(samples, counts, step_order, w, padded, leftover)

