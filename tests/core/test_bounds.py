"""core/bounds.py against brute force: the fewest batches of every partition
of small inputs into valid batches (padded: exactly; packed: a lower bound)."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.core.bounds import LengthCounts, StepBound, fewest_batches, fewest_steps, step_bound
from streambatch.core.cost import CostModel
from tests.support.helpers import examples


def brute_fewest(lengths: list[int], budget: int, cap: int, pack: bool, cost=None, max_cost=None) -> int:
    """Fewest valid batches by dynamic programming over subsets (n <= 10)."""
    n = len(lengths)
    ca, cb = (cost or CostModel.quadratic()).coefficients

    def valid(mask: int) -> bool:
        members = [lengths[i] for i in range(n) if mask >> i & 1]
        if len(members) <= 1:
            return len(members) == 1
        if len(members) > cap:
            return False
        if pack:
            c = sum(x * (ca * x + cb) for x in members)
            return sum(members) <= budget and (max_cost is None or c <= max_cost)
        top = max(members)
        c = len(members) * top * (ca * top + cb)
        return len(members) * top <= budget and (max_cost is None or c <= max_cost)

    ok = [valid(m) for m in range(1 << n)]

    @cache
    def best(mask: int) -> int:
        if mask == 0:
            return 0
        low = mask & -mask  # the lowest remaining sample goes in some batch: try every batch holding it
        out = n
        sub = mask
        while sub:
            if sub & low and ok[sub]:
                out = min(out, 1 + best(mask & ~sub))
            sub = (sub - 1) & mask
        return out

    return best((1 << n) - 1)


small = st.lists(st.integers(0, 60), min_size=0, max_size=9)


@settings(max_examples=examples(300), deadline=None)
@given(lengths=small, budget=st.integers(1, 200), cap=st.integers(1, 6), world=st.integers(1, 5),
       drop_last=st.booleans())
def test_padded_fewest_is_exact(lengths, budget, cap, world, drop_last):
    arr = np.array(lengths, dtype=np.int64)
    want = brute_fewest(lengths, budget, cap, False)
    assert fewest_batches(arr, budget, cap) == want
    b = step_bound(arr, budget, cap, world, drop_last)
    assert b == StepBound(want, want // world if drop_last else -(-want // world), True)


@settings(max_examples=examples(200), deadline=None)
@given(lengths=small, budget=st.integers(1, 200), cap=st.integers(1, 6), cap_cost=st.integers(1, 40_000))
def test_padded_fewest_with_cost_cap(lengths, budget, cap, cap_cost):
    arr = np.array(lengths, dtype=np.int64)
    cost = CostModel.quadratic()
    assert fewest_batches(arr, budget, cap, cost=cost, max_cost=cap_cost) == \
        brute_fewest(lengths, budget, cap, False, cost, cap_cost)


@settings(max_examples=examples(300), deadline=None)
@given(lengths=small, budget=st.integers(1, 200), cap=st.integers(1, 6))
def test_packed_bound_is_a_lower_bound(lengths, budget, cap):
    arr = np.array(lengths, dtype=np.int64)
    bound = fewest_batches(arr, budget, cap, pack=True)
    assert bound <= brute_fewest(lengths, budget, cap, True)
    assert not step_bound(arr, budget, cap, 1, pack=True).exact


@pytest.mark.parametrize("length, budget", [(34, 100), (51, 100), (20, 100), (26, 100), (100, 100), (7, 9)])
def test_packed_bound_is_exact_for_equal_lengths(length, budget):
    # the dual functions' bound: ceil(N / (budget // L)), where sum(L) / budget alone says far less
    arr = np.full(300, length, dtype=np.int64)
    assert fewest_batches(arr, budget, 1000, pack=True) == -(-300 // (budget // length))


def test_lone_samples_and_zero_lengths():
    arr = np.array([500, 400, 10, 10, 0, 0, 0], dtype=np.int64)
    # 500 and 400 exceed the budget (alone each); 10, 10, 0, 0, 0 fit one batch of <= 5
    assert fewest_batches(arr, 100, 5) == 3
    assert fewest_batches(arr, 100, 2) == 2 + 3
    assert fewest_batches(arr, 100, 5, pack=True) == 3
    assert fewest_batches(np.zeros(0, dtype=np.int64), 10, 3) == 0
    assert fewest_batches(np.zeros(7, dtype=np.int64), 1, 3) == 3


def test_steps_and_ratio():
    assert fewest_steps(17, 4) == 5 and fewest_steps(17, 4, drop_last=True) == 4
    assert fewest_steps(0, 8) == 0 and fewest_steps(3, 8, True) == 0
    assert StepBound(10, 5).ratio(6) == 1.2
    assert StepBound(0, 0).ratio(0) == 1.0


def test_large_lengths_take_the_sorting_path():
    rng = np.random.default_rng(0)
    arr = rng.integers(10**9, 10**12, 1000)
    budget = 4 * 10**12
    # sorted longest first, batches of budget // first: the proof's fill, written out
    s = np.sort(arr)[::-1]
    i = batches = 0
    while i < s.size:
        i += max(1, min(64, budget // int(s[i])))
        batches += 1
    assert fewest_batches(arr, budget, 64) == batches


@settings(max_examples=examples(100), deadline=None)
@given(parts=st.lists(st.lists(st.integers(0, 300), max_size=40), max_size=5), budget=st.integers(1, 600),
       cap=st.integers(1, 9), pack=st.booleans())
def test_length_counts_add_up(parts, budget, cap, pack):
    # an epoch planned window by window: the counts of every window's lengths give the fewest of all of them
    counts = LengthCounts()
    for part in parts[:-1]:
        counts.add(np.array(part, dtype=np.int64))
    more = np.array(parts[-1] if parts else [], dtype=np.int64)
    every = np.array([x for part in parts for x in part], dtype=np.int64)
    assert counts.fewest_batches(budget, cap, pack, more=more) == fewest_batches(every, budget, cap, pack)
    assert counts.total == every.size - more.size


@settings(max_examples=examples(50), deadline=None)
@given(parts=st.lists(st.lists(st.integers(0, 400), max_size=30), min_size=1, max_size=6),
       budget=st.integers(1, 1500), cap=st.integers(1, 9))
def test_length_counts_remove_what_was_added(parts, budget, cap):
    # the step budget's lookahead: the epoch's lengths, each window's taken out as it comes
    counts = LengthCounts()
    counts.add(np.array([x for part in parts for x in part], dtype=np.int64))
    for i, part in enumerate(parts):
        counts.remove(np.array(part, dtype=np.int64))
        rest = np.array([x for p in parts[i + 1:] for x in p], dtype=np.int64)
        assert counts.total == rest.size and counts.fewest_batches(budget, cap) == fewest_batches(rest, budget, cap)
    assert counts.values.size == 0


def test_length_counts_refuse_to_remove_what_is_not_there():
    counts = LengthCounts()
    counts.add(np.array([5, 5, 9], dtype=np.int64))
    for bad in ([7], [5, 5, 5], [10]):
        with pytest.raises(ValueError, match="not added"):
            counts.remove(np.array(bad, dtype=np.int64))
    counts.remove(np.array([9, 5], dtype=np.int64))
    assert counts.values.tolist() == [5] and counts.counts.tolist() == [1]


# ------------------------------------------------------------ the paired bound (packed)

def paired_f(x: int, a: int, budget: int) -> Fraction:
    """``_paired_bound``'s f, in exact fractions, from its docstring."""
    d = budget - 3 * a
    if 2 * x > budget:
        return 1 - paired_f(budget - x, a, budget)
    return Fraction(0) if x <= a else min(Fraction(1, 2), Fraction(x - a, d))


@settings(max_examples=examples(300), deadline=None)
@given(budget=st.integers(3, 120), data=st.data())
def test_paired_function_sums_to_at_most_one_in_any_batch(budget, data):
    # the docstring's claim: every set of lengths that fits one batch has sum f <= 1, for every threshold
    a = data.draw(st.integers(0, (budget - 1) // 3))
    batch = data.draw(st.lists(st.integers(0, budget), min_size=1, max_size=8).filter(lambda b: sum(b) <= budget))
    assert sum(paired_f(x, a, budget) for x in batch) <= 1


@settings(max_examples=examples(300), deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=9), budget=st.integers(3, 130))
def test_paired_bound_is_a_lower_bound(lengths, budget):
    from streambatch.core.bounds import _paired_bound

    arr = np.array([x for x in lengths if x <= budget], dtype=np.int64)
    if arr.size == 0:
        return
    values, counts = np.unique(arr, return_counts=True)
    got = _paired_bound(values[::-1].copy(), counts[::-1].copy(), budget)
    assert got <= brute_fewest(arr.tolist(), budget, 1000, True)
    # and it is the best threshold's sum, rounded up (the breakpoints hold the best one)
    want = max(sum(paired_f(int(x), a, budget) for x in arr) for a in range(0, (budget - 1) // 3 + 1))
    assert got == math.ceil(want)


def test_paired_bound_counts_pairs_that_leave_room_unused():
    # Six samples between a third and a half of the budget go at most two to a batch, with room left over
    # that the 32, 22 and 20 cannot all use: 4 batches. Tokens say 3 (297 / 100), and so do the dual, host
    # and count bounds; the paired one (a = 20: 42, 38, 37, 37, 35 and 34 count a half each) says 4.
    from streambatch.core.bounds import _dual_bound, _host_bound, _paired_bound, length_histogram

    arr = np.array([42, 38, 37, 37, 35, 34, 32, 22, 20], dtype=np.int64)
    values, counts = length_histogram(arr)
    assert brute_fewest(arr.tolist(), 100, 1000, True) == 4
    assert max(_dual_bound(values, counts, 100), _host_bound(values, counts, 100, 1000), 3) == 3
    assert _paired_bound(values, counts, 100) == 4 == fewest_batches(arr, 100, 1000, pack=True)
