"""Matching a shard-affine window's cross-rank batches to the ranks holding
their samples (``planner.py``, steps 4 and 5): pooled outliers and the final
window's tail are planned across ranks by the bucketed planner, and every
sample a rank trains without holding it costs that rank one ranged read.
Three passes, each keeping the plan's steps and batch sizes: ``to_holders``
gives each batch of a step to a rank; ``swap_to_holders`` moves samples
between batches where no batch's longest length changes (costs, balance
and padding exactly kept); ``relax_to_holders`` swaps what is left where
no step's costliest batch grows and its balance drops little.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The most work ``relax_to_holders`` does in one call, in batch members handled (each candidate swap rebuilds and
# prices its two batches; RELAX_OVERHEAD more for the candidate itself). Its search is pure Python and quadratic in
# the pool (every misplaced sample against every batch of its holder): a pool of 27,000 samples over the budget at
# W = 8 took 75 s of an 80 s plan, batches of up to 1,000 at W = 13 over 60 s. Past this much (about 1-2 s) the rest
# is left where the plan put it: the swaps only spare ranged reads, never change steps, sizes or budgets. A count,
# not a clock, so plans stay deterministic.
RELAX_WORK = 2_000_000
RELAX_OVERHEAD = 10


def to_holders(samples: np.ndarray, counts: np.ndarray, holder: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Give each batch of a step to the rank holding most of its samples.

    samples: window indices grouped by (step, rank); counts: (k, W) batch
    sizes. The W batches of a step may go to any ranks (their costs do not
    change), so they are matched to ranks greedily, most held samples first,
    to spare ranged reads. Returns (samples, counts) regrouped likewise.
    """
    k, w = counts.shape
    offsets = np.concatenate([[0], np.cumsum(counts.ravel())])
    batches = [samples[offsets[b] : offsets[b + 1]] for b in range(k * w)]
    out_batches = []
    for s in range(k):
        step = batches[s * w : (s + 1) * w]
        pairs: dict[tuple[int, int], int] = {}
        for b, x in enumerate(step):
            for r in holder[x].tolist():
                pairs[(b, r)] = pairs.get((b, r), 0) + 1
        rank_of = [-1] * w
        taken = [False] * w
        for (b, r), _ in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])):
            if rank_of[b] < 0 and not taken[r]:
                rank_of[b], taken[r] = r, True
        free = iter(r for r in range(w) if not taken[r])
        placed: list[np.ndarray] = [samples[:0]] * w
        for b in range(w):
            placed[rank_of[b] if rank_of[b] >= 0 else next(free)] = step[b]
        out_batches.extend(placed)
    sizes = np.array([x.shape[0] for x in out_batches], dtype=np.int64).reshape(k, w)
    return (np.concatenate(out_batches) if out_batches else samples[:0]), sizes


def swap_to_holders(samples: np.ndarray, counts: np.ndarray, holder: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Move samples between batches (of any steps) so more of them sit with
    their holder, keeping every batch's size and longest length: its costs,
    padding and balance do not change.

    Each batch keeps one longest sample (its anchor); every other sample
    fills a slot that takes any sample no longer than its batch's anchor.
    Longest first, a sample takes the tightest free slot of its holder's
    batches when the samples still unplaced can all be placed (for every
    length t, as many free slots take t as samples are >= t); the rest fill
    the free slots longest to longest. samples, counts: as ``to_holders``
    returns them. Returns the samples regrouped, same counts."""
    k, w = counts.shape
    sizes = counts.ravel()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    out = samples.copy()
    lens = lengths[samples]
    batch = np.repeat(np.arange(sizes.shape[0]), sizes)
    longest = np.maximum.reduceat(lens, offsets[:-1]) if samples.size else lens
    # anchor: the batch's first longest sample; every other position is a free slot
    first = np.zeros(samples.shape[0], dtype=bool)
    is_max = lens == longest[batch] if samples.size else first
    cm = np.cumsum(is_max)
    first = is_max & (cm - np.concatenate([[0], cm])[offsets[:-1]][batch] == 1)
    slots = np.flatnonzero(~first)
    if slots.size == 0:
        return out
    bound = longest[batch[slots]]
    slot_rank = batch[slots] % w
    items = samples[slots]
    ilen = lens[slots]
    thresholds = np.unique(ilen)
    # slack[t] = free slots taking thresholds[t] - unplaced samples >= thresholds[t]
    slack = (len(slots) - np.searchsorted(np.sort(bound), thresholds, side="left")) - \
            (len(slots) - np.searchsorted(np.sort(ilen), thresholds, side="left"))
    free = np.ones(slots.shape[0], dtype=bool)
    placed = np.zeros(slots.shape[0], dtype=bool)
    by_len = np.argsort(-ilen, kind="stable")
    for i in by_len.tolist():
        h, li = int(holder[items[i]]), int(ilen[i])
        cand = np.flatnonzero(free & (slot_rank == h) & (bound >= li))
        if cand.size == 0:
            continue
        j = int(cand[np.argmin(bound[cand])])
        lo, hi = np.searchsorted(thresholds, [li, int(bound[j])], side="right")
        if hi > lo and slack[lo:hi].min() < 1:
            continue
        slack[lo:hi] -= 1
        free[j], placed[i] = False, True
        out[slots[j]] = items[i]
    rest_items = np.flatnonzero(~placed)
    rest_slots = np.flatnonzero(free)
    ri = rest_items[np.argsort(-ilen[rest_items], kind="stable")]
    rs = rest_slots[np.argsort(-bound[rest_slots], kind="stable")]
    out[slots[rs]] = items[ri]
    return out


def relax_to_holders(samples: np.ndarray, counts: np.ndarray, holder: np.ndarray, lengths: np.ndarray,
                     cost: Any, max_tokens: int, max_cost: int, tol: float, packed: bool = False,
                     table: np.ndarray | None = None, work: int = RELAX_WORK) -> np.ndarray:
    """Swap pairs of samples between batches (of any steps) where one more of
    them lands with its holder, if both batches stay within budget, no
    step's costliest batch gets costlier and no step's balance (sum of its
    batch costs / (W x the costliest)) falls more than ``tol`` below what it
    was. Sizes are kept, so steps and padding slots are too. For what
    ``swap_to_holders`` cannot move: a batch's longest sample, e.g. the
    lone sample of an outlier's batch. ``packed``: batches are packed (budget
    and cost count the sum over their samples, ``CostModel.packed_cost``).
    table: the limit curve, as the largest batch per padded length
    (``BatchConstraint.size_table``), or for packed batches the most tokens
    per longest length (``token_table``); None or (0,): none. ``work``: the
    most candidate swaps priced (``RELAX_WORK``); batches after it is spent
    are left as they are. Returns the samples regrouped."""
    curve = table is not None and table.shape[0] > 0
    k, w = counts.shape
    offsets = np.concatenate([[0], np.cumsum(counts.ravel())])
    batches = [samples[offsets[b] : offsets[b + 1]].tolist() for b in range(k * w)]
    hold = holder.tolist()
    size = counts.ravel().tolist()

    def price(b: int, members: list[int]) -> int:
        if packed:
            lens = lengths[members]
            tokens = int(lens.sum())
            over = tokens > max_tokens or (curve and tokens > int(table[int(lens.max())]))
            return -1 if size[b] > 1 and over else int(cost.packed_scaled(lens).sum())
        top = max(int(lengths[i]) for i in members)
        over = size[b] * top > max_tokens or (curve and size[b] > int(table[top]))
        return -1 if size[b] > 1 and over else int(cost.scaled(size[b], top))

    def balance(total_cost: int, costliest: int) -> float:
        # a step of zero-cost batches (every length 0) is balanced; a swap keeps its batches at cost 0
        return total_cost / (w * costliest) if costliest > 0 else 1.0

    bc = [price(b, x) for b, x in enumerate(batches)]
    total = [sum(bc[s * w : (s + 1) * w]) for s in range(k)]
    top = [max(bc[s * w : (s + 1) * w]) for s in range(k)]
    floor = [balance(total[s], top[s]) - tol for s in range(k)]
    for bx in range(k * w):
        if work <= 0:
            break
        rx, sx = bx % w, bx // w
        for a in list(batches[bx]):
            ha = hold[a]
            if ha == rx or work <= 0:
                continue
            best = None
            for sy in range(k):
                by = sy * w + ha
                for b in batches[by]:
                    if hold[b] == ha or by == bx or work <= 0:
                        continue
                    work -= RELAX_OVERHEAD + len(batches[bx]) + len(batches[by])
                    nx = [b if i == a else i for i in batches[bx]]
                    ny = [a if i == b else i for i in batches[by]]
                    cx, cy = price(bx, nx), price(by, ny)
                    if cx < 0 or cy < 0 or cx > max_cost or cy > max_cost or cx > top[sx] or cy > top[sy]:
                        continue
                    dx = cx - bc[bx] + (cy - bc[by] if sy == sx else 0)
                    if balance(total[sx] + dx, top[sx]) < floor[sx]:
                        continue
                    if sy != sx and balance(total[sy] + cy - bc[by], top[sy]) < floor[sy]:
                        continue
                    key = (hold[b] == rx, -abs(int(lengths[a]) - int(lengths[b])))
                    if best is None or key > best[0]:
                        best = (key, by, b, nx, ny, cx, cy)
            if best is None:
                continue
            _, by, b, nx, ny, cx, cy = best
            sy = by // w
            total[sx] += cx - bc[bx]
            total[sy] += cy - bc[by]
            batches[bx], batches[by], bc[bx], bc[by] = nx, ny, cx, cy
    return np.array([i for x in batches for i in x], dtype=samples.dtype)
