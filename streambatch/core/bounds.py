"""The fewest batches and steps any valid plan can have for its settings.

A plan's steps hold one non-empty batch per rank, so an epoch cannot take
fewer steps than its samples need batches, divided by W. This module gives
that floor: exactly for padded batches, as a lower bound for packed ones.

**Padded batches** (``B * max L <= budget`` and ``B <= cap``, a lone sample
over the budget a batch of its own; with a cost cap also
``cost(B, max L) <= cap``, a lone sample above it alone). Sort the lengths
longest first, ``l_1 >= l_2 >= ... >= l_n``, and let ``g(i)`` be the most
samples a batch whose longest is ``l_i`` may hold: ``max(1, min(cap, budget
// l_i, the cost cap's count))`` (``cap`` when ``l_i = 0``). ``g`` does not
decrease with ``i``. *Fill*: each batch takes the next ``g(first)`` samples
of that order (fewer at the end). Claim: no valid partition has fewer batches.

1. *Some contiguous partition is as good as any.* Take a valid partition into
   m batches, ordered by their longest member's position ``a_1 < ... < a_m``
   (ties by position), so ``|B_j| <= g(a_j)``. Re-cut the sorted order into
   consecutive runs of the same sizes: run j starts at ``s_{j-1} + 1`` with
   ``s_j = |B_1| + ... + |B_j|``. Every sample before ``a_j`` lies in a batch
   whose longest comes no later than it, one of ``B_1..B_{j-1}``, so
   ``s_{j-1} >= a_j - 1``: run j starts at or after ``a_j``, its longest is no
   longer than ``l_{a_j}`` and ``g(s_{j-1} + 1) >= g(a_j) >= |B_j|``. The runs
   are valid, m of them.
2. *Fill stays ahead of any contiguous partition.* With ``t_j`` the samples
   covered by fill's first j batches, ``t_j = t_{j-1} + g(t_{j-1} + 1)``;
   ``x + g(x + 1)`` does not decrease in x, and a contiguous partition has
   ``s_j <= s_{j-1} + g(s_{j-1} + 1)``, so by induction ``t_j >= s_j``:
   fill has covered everything when the partition has.

So fill's count, ``fewest_batches``, is the minimum. It is computed from a
histogram of the lengths (``bounds_kernel.fill_count``, O(N + distinct
lengths)), never by sorting the samples.

**A limit curve** (``limits.LimitCurve``: at most ``table[L]`` samples in a
batch padded to ``L``) joins ``g``: ``g(i) = max(1, min(cap, budget // l_i,
the cost cap's count, table[l_i]))``. The proof above needs only that ``g``
does not decrease along the longest-first order, i.e. that each term does not
increase with length: the curve is made non-increasing when it is built (the
running minimum from short to long; a curve that allowed more samples at a
longer padding than at a shorter one would say a batch fits until a shorter
sample joins it, and the memory of a batch does not shrink when a sample is
swapped for a longer one). So fill, with the curve in ``g``, is still the
fewest padded batches.

**Steps.** Every step holds W non-empty batches, and every sample is in
exactly one batch (padding only repeats samples in the final step's empty
slots), so a plan has at least ``ceil(B / W)`` steps; fill, with its batches
dealt W to a step, has exactly that. With ``drop_last`` the samples left out
are those that cannot complete a step (they fill fewer than W batches), so
``S * W + (W - 1) >= B``: at least ``floor(B / W)`` steps, which fill reaches
by leaving out its last ``B mod W`` batches.

**Packed batches** (``sum(L) <= budget``, ``B <= cap``, a lone sample over
the budget alone): a bin-packing problem, NP-hard, so this is a *bound*, not
the exact minimum: the lone samples, plus for the rest the largest of
``ceil(sum L / budget)``, ``ceil(count / k)`` with k the most samples a
batch can hold (the size cap, or how many of the shortest fit the budget),
the dual-function bound (``_dual_bound``: at most k samples longer than
budget / (k + 1) share a batch), the host bound (``_host_bound``: samples
over half the budget never share a batch with each other, and each hosts
at most the shortest others that fit beside it), the paired bound
(``_paired_bound``: samples between a threshold and half the budget count
up to one half each, proved in its docstring) and, under a cost cap,
``ceil(sum cost / cap)``; a sample that fits beside no other one counts
as a batch of its own. Steps follow from it as above (still bounds). With a
limit curve a packed batch whose longest is ``M`` holds at most ``C(M) =
min(budget, table[M] * M)`` tokens (``core/constraint.py``), so a sample of
length ``l`` lies in a batch of at most ``C*(l) = max_{M >= l} C(M)``
tokens. ``C*`` does not increase with length, so the argument for padded
batches carries over to samples cut into divisible tokens: the longest-first
fill, each batch taking ``C*`` of its first sample's length in tokens, has
the fewest batches of that relaxation, a lower bound (``_curve_bound``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import compile_once as once  # called as once.compile_once: tests swap it
from .cost import INT64_MAX, CostModel

_NO_TABLE = np.zeros(0, dtype=np.int64)

__all__ = ["STEP_SLACK", "LengthCounts", "StepBound", "fewest_batches", "fewest_steps", "length_histogram",
           "step_bound", "step_limit"]

# Plans may take at most 1 + 1/STEP_SLACK_DIV of the fewest steps, plus one: ``step_limit``.
STEP_SLACK_DIV = 20
STEP_SLACK = 1 / STEP_SLACK_DIV


@dataclass(frozen=True)
class StepBound:
    """The floor of a plan's size for its settings.

    batches: fewest batches any valid plan can have (padded: exact; packed:
        a lower bound); steps: fewest steps (``ceil(batches / W)``, or
        ``floor`` with ``drop_last``); exact: False for packed batches
        (bin packing), where both are lower bounds.
    """

    batches: int
    steps: int
    exact: bool = True

    def ratio(self, steps: int) -> float:
        """``steps / self.steps`` (1.0 when both are 0; inf when only the bound is)."""
        if self.steps == 0:
            return 1.0 if steps == 0 else float("inf")
        return steps / self.steps


class LengthCounts:
    """A growing multiset of lengths (distinct values with counts), for the
    fewest batches of everything added so far: an epoch planned window by
    window. Memory follows the distinct lengths, not the samples."""

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)  # ascending
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, lengths: np.ndarray, times: np.ndarray | None = None) -> None:
        """Add (n,) int64 lengths >= 0, each ``times`` ((n,) int64) times (default once)."""
        if lengths.shape[0] == 0:
            return
        values, inverse = np.unique(np.concatenate([self.values, lengths]), return_inverse=True)
        each = np.ones(lengths.shape[0], dtype=np.int64) if times is None else times
        weights = np.concatenate([self.counts, each])
        self.values, self.counts = values, np.bincount(inverse, weights=weights).astype(np.int64)

    def remove(self, lengths: np.ndarray) -> None:
        """Take out (n,) int64 lengths, each added before (a multiset difference)."""
        if lengths.shape[0] == 0:
            return
        values, removed = np.unique(lengths, return_counts=True)
        at = np.searchsorted(self.values, values)
        inside = (at < self.values.shape[0]).all()
        if not inside or (self.values[at] != values).any() or (self.counts[at] < removed).any():
            raise ValueError("LengthCounts.remove: lengths that were not added; remove only what add took in")
        self.counts[at] -= removed
        keep = self.counts > 0
        self.values, self.counts = self.values[keep], self.counts[keep]

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def fewest_batches(self, max_batch_tokens: int, max_batch_size: int, pack: bool = False,
                       cost: CostModel | None = None, max_cost: int = INT64_MAX, more: np.ndarray | None = None,
                       limit: Any = None) -> int:
        """``fewest_batches`` of the lengths added so far, plus ``more`` ((m,) int64, not added);
        limit: a ``LimitCurve`` or None."""
        values, counts = self.values, self.counts
        if more is not None and more.shape[0]:
            values, inverse = np.unique(np.concatenate([values, more]), return_inverse=True)
            counts = np.bincount(inverse, weights=np.concatenate([counts, np.ones(more.shape[0], dtype=np.int64)]))
            counts = counts.astype(np.int64)
        if values.shape[0] == 0:
            return 0
        values, counts = values[::-1].copy(), counts[::-1].copy()  # descending, as the bounds take them
        table = None if limit is None else limit.size_table(int(values[0]), max_batch_size)
        if pack:
            return _packed_from_counts(values, counts, max_batch_tokens, max_batch_size, cost or CostModel.quadratic(),
                                       max_cost, table)
        return _fill_batches(values, counts, max_batch_tokens, max_batch_size, cost or CostModel.quadratic(), max_cost,
                             table)


def _fill_batches(values: np.ndarray, counts: np.ndarray, budget: int, cap: int, cost: CostModel,
                  max_cost: int, table: np.ndarray | None = None) -> int:
    """The fill's batch count of a histogram: values (k,) int64 descending, counts (k,) int64 >= 1;
    table: (>= values[0] + 1,) int64 the limit curve's sizes per length, or None."""
    from .bounds_kernel import fill_count  # lazy for start-up: no numba before the first plan

    # compiled once per node (or loaded) on a tiny input of the same argument types: core/compile_once.py
    one = np.ones(1, dtype=np.int64)
    once.compile_once("bounds", (), lambda: fill_count(one, one, one[0], one[0], one[0], one[0], one[0], _NO_TABLE))
    ca, cb = cost.coefficients
    return int(fill_count(values, counts, np.int64(budget), np.int64(cap), np.int64(ca), np.int64(cb),
                          np.int64(max_cost), _NO_TABLE if table is None else table))


def length_histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct lengths descending, their counts), both (k,) int64, of (N,) int64 lengths >= 0, N >= 1."""
    return _histogram(lengths)


def _histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct lengths descending, their counts), both (k,) int64."""
    lmax = int(lengths.max())
    if lmax <= 4 * lengths.shape[0] + 4096:  # a counting pass beats a sort
        hist = np.bincount(lengths)
        values = np.flatnonzero(hist)[::-1]
        return np.ascontiguousarray(values, dtype=np.int64), np.ascontiguousarray(hist[values], dtype=np.int64)
    values, counts = np.unique(lengths, return_counts=True)
    return np.ascontiguousarray(values[::-1], dtype=np.int64), np.ascontiguousarray(counts[::-1], dtype=np.int64)


def fewest_batches(lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, pack: bool = False,
                   cost: CostModel | None = None, max_cost: int = INT64_MAX, table: np.ndarray | None = None) -> int:
    """Fewest batches any valid plan of ``lengths`` can have (see the module
    docstring): exact for padded batches, a lower bound for packed ones.

    lengths: (N,) int64 >= 0, checked (``coerce_lengths``); max_batch_tokens,
    max_batch_size >= 1. cost, max_cost: a cost cap on every batch,
    ``cost.scaled(...) <= max_cost`` (``CostModel.cost_cap``; the default:
    none). table: (>= max length + 1,) int64 a limit curve's largest batch
    per padded length (``LimitCurve.size_table``), or None."""
    n = int(lengths.shape[0])
    if n == 0:
        return 0
    cost = cost or CostModel.quadratic()
    values, counts = _histogram(lengths)
    if pack:
        return _packed_from_counts(values, counts, max_batch_tokens, max_batch_size, cost, max_cost, table)
    return _fill_batches(values, counts, max_batch_tokens, max_batch_size, cost, max_cost, table)


def _packed_from_counts(values: np.ndarray, counts: np.ndarray, budget: int, cap: int, cost: CostModel,
                        max_cost: int, table: np.ndarray | None = None) -> int:
    """The packed lower bound of a histogram: values (k,) int64 distinct lengths, descending, counts (k,)
    int64 >= 1; table: the limit curve's sizes per length (or None)."""
    per = cost.packed_scaled(values)
    lone = (values > budget) | (per > max_cost)
    n_lone = int(counts[lone].sum())
    values, counts, per = values[~lone], counts[~lone], per[~lone]
    m = int(counts.sum())
    if m == 0:
        return n_lone
    # A sample that does not fit beside even the shortest other one is alone too (values descend).
    vmin = int(values[-1])
    alone = values + vmin > budget
    if counts[-1] == 1:  # the shortest sample's shortest other is the next value up
        alone[-1] = values.shape[0] == 1 or vmin + int(values[-2]) > budget
    if alone.any():
        n_lone += int(counts[alone].sum())
        values, counts, per = values[~alone], counts[~alone], per[~alone]
        m = int(counts.sum())
        if m == 0:
            return n_lone
    # At most k to a batch: the size cap, and how many of the shortest samples the budget holds.
    run = np.cumsum(np.repeat(values[::-1], np.minimum(counts[::-1], cap))[:cap])
    k = max(1, int(np.searchsorted(run, budget, side="right")))
    tokens = int((values * counts).sum())  # lengths <= budget, so no int64 overflow for any sane count
    bound = max(-(-tokens // budget), -(-m // min(cap, k)), _dual_bound(values, counts, budget),
                _host_bound(values, counts, budget, cap), _paired_bound(values, counts, budget))
    if max_cost < INT64_MAX:
        # float sum (scaled costs of many samples may pass int64), rounded down: a bound only needs to be one
        total = float((per.astype(np.float64) * counts).sum())
        bound = max(bound, int(np.ceil(total / max_cost * (1 - 1e-12) - 1e-9)))
    if table is not None and table.shape[0]:
        bound = max(bound, _curve_bound(values, counts, budget, table))
    return n_lone + bound


def _curve_bound(values: np.ndarray, counts: np.ndarray, budget: int, table: np.ndarray) -> int:
    """The fractional longest-first fill under ``C*`` (module docstring): values
    (k,) int64 in [0, budget], descending, with counts (k,); table: (>
    values.max(),) int64 sizes per length. ``C*`` does not increase with
    length, so (as for padded batches) the fill, here of divisible samples,
    has the fewest batches of the relaxation, and no plan of whole samples
    has fewer."""
    L = np.arange(table.shape[0], dtype=np.int64)
    room_of = np.minimum(budget, table * L).astype(np.float64)
    best = np.maximum.accumulate(room_of[::-1])[::-1]  # C*(l): the most any batch holding a sample of l may
    from .bounds_kernel import token_fill_count  # lazy for start-up: no numba before the first plan

    keep = values > 0  # zero-length samples take no room
    if not keep.any():
        return 0
    # compiled once per node (or loaded) on a tiny input of the same argument types: core/compile_once.py
    one = np.ones(1, dtype=np.int64)
    once.compile_once("bounds_curve", (), lambda: token_fill_count(one, one, np.ones(2)))
    return int(token_fill_count(np.ascontiguousarray(values[keep]), np.ascontiguousarray(counts[keep]),
                                np.maximum(best, 1.0)))


def _host_bound(values: np.ndarray, counts: np.ndarray, budget: int, cap: int) -> int:
    """Samples longer than half the budget take a batch each; such a batch
    hosts at most h(L) others, the most of the shortest rest that fit beside
    it (and the size cap); the rest fill batches of at most k (the shortest
    that fit one batch). So ``big + ceil((small - sum h) / k)`` batches at
    least. values: (k,) int64 distinct lengths, descending; counts: (k,)."""
    big = 2 * values > budget
    n_big = int(counts[big].sum())
    small_v, small_c = values[~big][::-1], counts[~big][::-1]  # ascending
    n_small = int(small_c.sum())
    if n_big == 0 or n_small == 0:
        return n_big + (1 if n_small else 0)
    run = np.cumsum(np.repeat(small_v, np.minimum(small_c, cap))[:cap])  # the cap shortest, summed
    hosted = np.minimum(np.searchsorted(run, budget - values[big], side="right"), cap - 1)
    k = max(1, min(cap, int(np.searchsorted(run, budget, side="right"))))
    rest = n_small - int((hosted * counts[big]).sum())
    return n_big + max(0, -(-rest // k))


PAIRED_TRIED = 2048  # the most thresholds ``_paired_bound`` tries
PAIRED_LENGTHS = 512  # the most lengths whose breakpoints it takes them from


def _paired_bound(values: np.ndarray, counts: np.ndarray, budget: int) -> int:
    """A bin-packing lower bound for samples that mostly go two to a batch.

    With C the budget and a threshold ``0 <= a < C / 3``, let D = C - 3a and

        f(x) = 0                                  x <= a
        f(x) = min(1 / 2, (x - a) / D)            a < x <= C / 2
        f(x) = 1 - f(C - x)                       x > C / 2

    Claim: any set of samples that fits one batch (sum <= C) has sum f <= 1,
    so every plan has at least ``ceil(sum f)`` batches. Proof. f does not
    decrease, and ``f(x) <= (x - a) / D`` for a < x <= C / 2.
    (i) No sample over C / 2: if at most two samples exceed a, each gives at
    most 1/2; if m >= 3 do, their f sum to at most ``(sum x - m a) / D <=
    (C - 3a) / D = 1``. (ii) One sample y > C / 2 (there is room for one
    only): the others fit r = C - y < C / 2. If at most one of them exceeds
    a, its f is at most f(r) (f does not decrease); if m >= 2 do, each is
    under r - a < C / 2 - a <= (C - a) / 2, where f is linear, so they give
    at most ``(r - 2a) / D``: that is at most f(r), which is ``(r - a) / D``
    for r <= (C - a) / 2 and else 1/2 >= ``(C / 2 - 2a) / (C - 3a)``. So the
    others give at most f(r), and f(y) = 1 - f(r): sum f <= 1.
    With a = 0 this is sum(L) / C; its use is a between: two samples of 0.37 C
    fill a batch (f = 1/2 each) though their tokens leave a quarter free,
    which only a sample over a could use (measured: 9,202 -> 9,493 batches,
    LibriSpeech at 1.6 x its longest clip, where the LP bound is about 9,500).

    Every threshold a in [0, C / 3) gives a bound; between the lengths that
    move a sample across a, (C - a) / 2, C - a or (C + a) / 2 the sum is
    linear in a and the bound a ratio of linear functions, largest at an end,
    so the candidates are those breakpoints (and their neighbours), each
    summed in O(log k) from prefix sums; with many distinct lengths, those of
    an even spread of them (any thresholds give a valid bound). values: (k,) int64 distinct lengths
    in [0, C], descending; counts: (k,) int64."""
    if float(budget) * float(counts.sum()) > 2.0**52 or budget < 3:  # float sums exact below 2**53
        return 0
    v = values[::-1].astype(np.int64)  # ascending
    c = counts[::-1].astype(np.float64)
    cs = np.concatenate([[0.0], np.cumsum(c)])
    cx = np.concatenate([[0.0], np.cumsum(c * v)])

    def total(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(count, sum of lengths) of the samples with lo <= length <= hi."""
        i = np.searchsorted(v, lo, "left")
        j = np.maximum(i, np.searchsorted(v, hi, "right"))
        return cs[j] - cs[i], cx[j] - cx[i]

    C = int(budget)
    third = (C - 1) // 3  # a < C / 3
    # any thresholds give a bound: the breakpoints of at most PAIRED_LENGTHS lengths, evenly spread, keep it cheap
    u = v if v.size <= PAIRED_LENGTHS else v[np.linspace(0, v.size - 1, PAIRED_LENGTHS).astype(np.int64)]
    bp = np.concatenate([u, C - 2 * u, C - u, 2 * u - C, [0]])
    a = np.unique(np.clip(np.concatenate([bp - 1, bp, bp + 1]), 0, third))
    if a.size > PAIRED_TRIED:  # at most this many, evenly spread
        a = a[np.linspace(0, a.size - 1, PAIRED_TRIED).astype(np.int64)]
    d = (C - 3 * a).astype(np.float64)
    half = C // 2  # x <= C / 2 <=> x <= C // 2
    # f scaled by 2D: 2 (x - a) up to (C - a) / 2, then D; over C / 2, 2D - (that of C - x)
    mid = np.minimum((C - a) // 2, half)
    n1, s1 = total(a + 1, mid)
    n2, _ = total(mid + 1, np.full_like(a, half))
    scaled = 2 * (s1 - a * n1) + d * n2
    nb, _ = total(np.full_like(a, half + 1), np.full_like(a, C))
    lo2 = np.maximum((C + a + 1) // 2, half + 1)  # C - x <= (C - a) / 2 <=> x >= (C + a) / 2
    n3, s3 = total(lo2, C - a - 1)  # a < C - x <= (C - a) / 2: 2 (C - x - a)
    n4, _ = total(np.full_like(a, half + 1), lo2 - 1)  # (C - a) / 2 < C - x < C / 2: D
    scaled = scaled + 2 * d * nb - 2 * ((C - a) * n3 - s3) - d * n4
    best = float(np.max(scaled / (2 * d)))
    # rounded down a little, so that float error cannot lift the bound above the truth
    return int(np.ceil(best * (1 - 1e-12) - 1e-9))


DUAL_K = 40  # the dual functions tried: items longer than budget / (k + 1) fit at most k to a batch


def _dual_bound(values: np.ndarray, counts: np.ndarray, budget: int) -> int:
    """A bin-packing lower bound from the dual feasible functions of Fekete
    and Schepers: with x = L / budget, ``u_k(x) = x`` if (k + 1) x is an
    integer, else ``floor((k + 1) x) / k``; any set of items fitting one batch
    has sum(u_k) <= 1, so ``ceil(sum u_k)`` batches at least (exact for equal
    lengths: k = budget // L gives ceil(N / k)). values: (k,) int64 distinct
    lengths in [0, budget], counts: (k,) int64 of each."""
    if budget > 2**56:  # (k + 1) * L must stay inside int64; such budgets get the other bounds only
        return 0
    keep = values > 0  # zero-length samples cost no room
    values, counts = values[keep], counts[keep]
    best = 0
    v = values.astype(np.float64)
    c = counts.astype(np.float64)
    for k in range(1, DUAL_K + 1):
        scaled = (k + 1) * values
        exact = scaled % budget == 0
        u = np.where(exact, v / budget, (scaled // budget) / k)
        # rounded down a little, so that float error cannot lift the bound above the truth
        best = max(best, int(np.ceil(float((u * c).sum()) * (1 - 1e-12) - 1e-9)))
    return best


def fewest_steps(batches: int, world_size: int, drop_last: bool = False) -> int:
    """Fewest steps of W batches each for ``batches`` batches: ``ceil(B / W)``,
    or ``floor(B / W)`` when ``drop_last`` leaves out what cannot fill a step."""
    return batches // world_size if drop_last else -(-batches // world_size)


def step_limit(fewest: int, slack_div: int = STEP_SLACK_DIV) -> int:
    """The most steps a plan may take when the fewest possible is ``fewest``:
    ``floor(fewest * (1 + 1 / slack_div)) + 1`` (1.05 x fewest + 1 by default),
    in integers so that no float decides a plan."""
    return fewest + fewest // slack_div + 1


def step_bound(lengths: np.ndarray, max_batch_tokens: int, max_batch_size: int, world_size: int,
               drop_last: bool = False, pack: bool = False, cost: CostModel | None = None,
               max_cost: int = INT64_MAX, histogram: tuple[np.ndarray, np.ndarray] | None = None,
               table: np.ndarray | None = None) -> StepBound:
    """The ``StepBound`` of these settings (arguments as ``fewest_batches``;
    ``histogram``: ``length_histogram(lengths)`` if the caller has it)."""
    if histogram is None or lengths.shape[0] == 0:
        b = fewest_batches(lengths, max_batch_tokens, max_batch_size, pack, cost, max_cost, table)
    elif pack:
        b = _packed_from_counts(*histogram, max_batch_tokens, max_batch_size, cost or CostModel.quadratic(), max_cost,
                                table)
    else:
        b = _fill_batches(*histogram, max_batch_tokens, max_batch_size, cost or CostModel.quadratic(), max_cost,
                          table)
    return StepBound(b, fewest_steps(b, world_size, drop_last), not pack)
