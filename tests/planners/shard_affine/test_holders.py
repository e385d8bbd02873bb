"""Matching cross-rank batches to holders (affinity_holders): the swaps keep
the plan's sizes and costs and spare ranged reads the old batch-to-rank
matching alone paid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.core.constraint import BatchLimits
from streambatch.core.cost import CostModel
from streambatch.planners.shard_affine.holders import relax_to_holders, swap_to_holders, to_holders
from streambatch.planners.shard_affine.planner import foreign_samples, plan_affine_window
from tests.support.helpers import examples

NONE = np.zeros(0, dtype=np.int64)


def away(samples, counts, holder):
    rank = np.repeat(np.arange(counts.size) % counts.shape[1], counts.ravel())
    return int((holder[samples] != rank).sum())


def test_swap_moves_short_samples_home():
    # two ranks; each batch holds one long sample of the rank it goes to and a short one of the other:
    # batch-to-rank matching alone leaves 2 ranged reads, a swap of the short ones none
    lengths = np.array([10, 5, 10, 5])
    holder = np.array([0, 1, 1, 0])
    samples, counts = to_holders(np.array([0, 1, 2, 3]), np.array([[2, 2]]), holder)
    assert away(samples, counts, holder) == 2
    out = swap_to_holders(samples, counts, holder, lengths)
    assert away(out, counts, holder) == 0


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31))
def test_swaps_keep_sizes_and_costs(w, k, seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 5, (k, w))
    n = int(counts.sum())
    lengths = rng.integers(1, 40, n)
    holder = rng.integers(0, w, n)
    samples, counts = to_holders(rng.permutation(n), counts, holder)
    before = away(samples, counts, holder)
    offsets = np.concatenate([[0], np.cumsum(counts.ravel())])
    longest = np.maximum.reduceat(lengths[samples], offsets[:-1])
    out = swap_to_holders(samples, counts, holder, lengths)
    assert sorted(out.tolist()) == sorted(samples.tolist())
    assert np.array_equal(np.maximum.reduceat(lengths[out], offsets[:-1]), longest)  # costs, padding kept
    mid = away(out, counts, holder)
    assert mid <= before
    cost = CostModel.quadratic()
    tokens = int(counts.max() * 40)
    relaxed = relax_to_holders(out, counts, holder, lengths, cost, tokens, 1 << 62, 0.03)
    assert sorted(relaxed.tolist()) == sorted(samples.tolist())
    assert away(relaxed, counts, holder) <= mid
    step_cost = (counts.ravel() * longest.astype(np.int64) ** 2).reshape(k, w)
    new_longest = np.maximum.reduceat(lengths[relaxed], offsets[:-1])
    new_cost = (counts.ravel() * new_longest.astype(np.int64) ** 2).reshape(k, w)
    assert (new_cost.max(axis=1) <= step_cost.max(axis=1)).all()  # no step's costliest batch grows
    fits = (counts.ravel() == 1) | (counts.ravel() * new_longest <= tokens)
    assert fits.all()



def test_relax_work_is_bounded():
    """The relaxing search is quadratic in the pool (27,000 pooled samples at W = 8 took 75 s of an 80 s plan):
    its ``work`` bound stops it, and whatever it did by then keeps the plan valid. No work: nothing moves;
    a little work: fewer ranged reads than none, more than unbounded."""
    rng = np.random.default_rng(5)
    k, w = 40, 4
    counts = rng.integers(1, 6, (k, w))
    n = int(counts.sum())
    lengths = rng.integers(1, 40, n)
    holder = rng.integers(0, w, n)
    samples, counts = to_holders(rng.permutation(n), counts, holder)
    cost, tokens = CostModel.quadratic(), int(counts.max() * 40)
    args = (counts, holder, lengths, cost, tokens, 1 << 62, 0.03)
    assert np.array_equal(relax_to_holders(samples, *args, work=0), samples)
    full = relax_to_holders(samples, *args)
    some = relax_to_holders(samples, *args, work=2_000)
    assert sorted(some.tolist()) == sorted(samples.tolist())
    assert away(full, counts, holder) < away(some, counts, holder) < away(samples, counts, holder)

def test_final_window_costs_fewer_ranged_reads():
    # heavy-tailed final windows (pooled outliers and a walk tail planned across ranks): the
    # batch-to-rank matching alone with a single cut cost 196 one-sample reads over these 8 windows
    total = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        for w in (8, 16):
            lengths = np.minimum(np.ceil(rng.lognormal(5.5, 0.6, 400 * w)), 8000).astype(np.int64)
            lengths[rng.choice(lengths.size, 3 * w, replace=False)] = rng.integers(3300, 8000, 3 * w)
            aw = plan_affine_window(NONE, NONE, lengths, BatchLimits(16000, 64), w, True, True, False, seed)
            total += foreign_samples(aw.plan, aw.holder).shape[0]
            trained = np.sort(aw.plan.samples)
            assert np.array_equal(np.unique(trained), np.arange(lengths.size))  # exactly once (+ padding)
            assert trained.size - lengths.size == aw.plan.num_padded
    assert total <= 130  # 107 measured


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31))
def test_packed_relax_keeps_sums_within_budget_and_step_costs(w, k, seed):
    # packed batches: a swap changes a batch's sum of lengths and its packed cost, which relax must check
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 5, (k, w))
    n = int(counts.sum())
    lengths = rng.integers(1, 40, n)
    holder = rng.integers(0, w, n)
    samples, counts = to_holders(rng.permutation(n), counts, holder)
    offsets = np.concatenate([[0], np.cumsum(counts.ravel())])
    cost = CostModel.quadratic()
    sums = np.add.reduceat(lengths[samples], offsets[:-1])
    tokens = int(sums.max())
    before = cost.packed_cost(lengths[samples], offsets).reshape(k, w)
    relaxed = relax_to_holders(samples, counts, holder, lengths, cost, tokens, 1 << 62, 0.03, packed=True)
    assert sorted(relaxed.tolist()) == sorted(samples.tolist())
    assert away(relaxed, counts, holder) <= away(samples, counts, holder)
    after = cost.packed_cost(lengths[relaxed], offsets).reshape(k, w)
    assert (after.max(axis=1) <= before.max(axis=1)).all()  # no step's costliest batch grows
    new_sums = np.add.reduceat(lengths[relaxed], offsets[:-1])
    assert ((counts.ravel() == 1) | (new_sums <= tokens)).all()


def test_packed_relax_moves_samples_home():
    # two ranks, one step: each batch holds a sample of the other rank; swapping equal lengths costs nothing
    lengths = np.array([10, 6, 10, 6])
    holder = np.array([0, 1, 1, 0])
    samples, counts = np.array([0, 1, 2, 3]), np.array([[2, 2]])
    assert away(samples, counts, holder) == 2
    out = relax_to_holders(samples, counts, holder, lengths, CostModel.quadratic(), 16, 1 << 62, 0.03, packed=True)
    assert away(out, counts, holder) == 0
