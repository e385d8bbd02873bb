"""The shard-affine planner's Numba walk against naive pure-Python twins (hypothesis), and its cost check against
``CostModel`` (the toolkit's one cost kernel, ``BatchConstraint.fits``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.core.constraint import NO_TABLE, BatchLimits
from streambatch.core.cost import CostModel
from streambatch.planners.shard_affine.walk import _fits, affine_steps, packed_affine_steps
from tests.support.helpers import examples

# ------------------------------------------------------------ the walk kernel


def curve_sizes(curve, cap):
    """The largest batch at padded length L under ``curve`` (a LimitCurve or None), within [1, cap]."""
    return lambda L: cap if curve is None else max(1, min(cap, int(curve.max_batch_size(L))))


def naive_walk(slen, starts, tokens, cap, target_rank=0, curve=None):
    """The walk of ``affine_steps`` (quadratic cost, no cost cap), written out;
    ``target_rank``: the target is that cheapest of the ranks' full batches;
    ``curve``: a LimitCurve the full batches stay within."""
    size_at = curve_sizes(curve, cap)
    w = len(starts) - 1
    pos = list(starts[:-1])
    steps = []
    while all(pos[r] < starts[r + 1] for r in range(w)):
        fulls = []
        for r in range(w):
            e = pos[r] + 1
            while (e < starts[r + 1] and e + 1 - pos[r] <= cap and (e + 1 - pos[r]) * slen[e] <= tokens
                   and e + 1 - pos[r] <= size_at(slen[e])):
                e += 1
            fulls.append(e)
        target = sorted((e - p) * slen[e - 1] ** 2 for p, e in zip(pos, fulls))[min(target_rank, w - 1)]
        row = []
        for r in range(w):
            costs = {e: (e - pos[r]) * slen[e - 1] ** 2 for e in range(pos[r] + 1, fulls[r] + 1)}
            below = [e for e, c in costs.items() if c <= target]
            e = max(below) if below else pos[r] + 1
            if e < fulls[r] and costs[e + 1] - target < target - costs[e]:
                e += 1
            row.append(e - pos[r])
            pos[r] = e
        steps.append(row)
    return steps, pos


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(0, 60), min_size=1, max_size=40), st.integers(50, 500),
       st.integers(1, 8), st.randoms(use_true_random=False), st.integers(0, 5))
def test_walk_matches_naive_twin(w, pool, tokens, cap, rnd, target_rank):
    sizes = [rnd.randint(0, len(pool)) for _ in range(w)]
    segs = [sorted(rnd.choice(pool) for _ in range(n)) for n in sizes]
    slen = np.array([x for s in segs for x in s], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    counts, k, pos = affine_steps(slen, starts, tokens, cap, 1, 0, np.iinfo(np.int64).max, target_rank, NO_TABLE)
    want, want_pos = naive_walk(slen.tolist(), starts.tolist(), tokens, cap, target_rank)
    assert counts[:k].tolist() == want
    assert pos.tolist() == want_pos


def naive_packed_walk(slen, starts, tokens, cap, max_cost, target_rank=0, curve=None):
    """The walk of ``packed_affine_steps`` (quadratic cost): prefixes whose
    tokens and costs are sums over their samples, written out; ``curve``: a
    LimitCurve: a prefix of more than one sample holding more tokens than
    ``min(tokens, size(L) * L)`` at its last (longest) L is cut back until
    it does not."""
    size_at = curve_sizes(curve, cap)

    def over(p, e):
        return curve is not None and e - p > 1 and sum(slen[p:e]) > min(tokens, size_at(slen[e - 1]) * slen[e - 1])

    w = len(starts) - 1
    pos = list(starts[:-1])
    steps = []

    def cost(p, e):
        return sum(x * x for x in slen[p:e])

    while all(pos[r] < starts[r + 1] for r in range(w)):
        fulls = []
        for r in range(w):
            e = pos[r] + 1
            while (e < starts[r + 1] and e + 1 - pos[r] <= cap and sum(slen[pos[r] : e + 1]) <= tokens
                   and cost(pos[r], e + 1) <= max_cost):
                e += 1
            while over(pos[r], e):
                e -= 1
            fulls.append(e)
        target = sorted(cost(p, e) for p, e in zip(pos, fulls))[min(target_rank, w - 1)]
        row = []
        for r in range(w):
            costs = {e: cost(pos[r], e) for e in range(pos[r] + 1, fulls[r] + 1)}
            below = [e for e, c in costs.items() if c <= target]
            e = max(below) if below else pos[r] + 1
            if e < fulls[r] and costs[e + 1] - target < target - costs[e]:
                e += 1
            while over(pos[r], e):
                e -= 1
            row.append(e - pos[r])
            pos[r] = e
        steps.append(row)
    return steps, pos


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(0, 60), min_size=1, max_size=40), st.integers(50, 500),
       st.integers(1, 8), st.one_of(st.just(np.iinfo(np.int64).max), st.integers(1, 20_000)),
       st.randoms(use_true_random=False), st.integers(0, 5))
def test_packed_walk_matches_naive_twin(w, pool, tokens, cap, max_cost, rnd, target_rank):
    sizes = [rnd.randint(0, len(pool)) for _ in range(w)]
    segs = [sorted(rnd.choice(pool) for _ in range(n)) for n in sizes]
    slen = np.array([x for s in segs for x in s], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    counts, k, pos = packed_affine_steps(slen, starts, tokens, cap, 1, 0, max_cost, target_rank, NO_TABLE)
    want, want_pos = naive_packed_walk(slen.tolist(), starts.tolist(), tokens, cap, max_cost, target_rank)
    assert counts[:k].tolist() == want
    assert pos.tolist() == want_pos


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(1, 60), min_size=1, max_size=40), st.integers(50, 2000),
       st.integers(1, 8), st.randoms(use_true_random=False), st.integers(0, 5), st.booleans(),
       st.lists(st.tuples(st.integers(1, 70), st.integers(0, 8)), min_size=1, max_size=4))
def test_walks_with_a_limit_curve_match_naive_twins(w, pool, tokens, cap, rnd, target_rank, packed, points):
    from streambatch.core.limits import LimitCurve

    upper = sorted({u for u, _ in points})
    curve = LimitCurve.from_table(upper, [b for _, b in points][: len(upper)])
    sizes = [rnd.randint(0, len(pool)) for _ in range(w)]
    segs = [sorted(rnd.choice(pool) for _ in range(n)) for n in sizes]
    slen = np.array([x for s in segs for x in s], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    lmax = max(int(slen.max(initial=0)), 1)
    tab = curve.size_table(lmax, cap)  # BatchConstraint.size_table, and its token_table for packed
    i64 = np.iinfo(np.int64).max
    if packed:
        ttab = np.minimum(tokens, tab * np.arange(lmax + 1))
        counts, k, pos = packed_affine_steps(slen, starts, tokens, cap, 1, 0, i64, target_rank, ttab)
        want, want_pos = naive_packed_walk(slen.tolist(), starts.tolist(), tokens, cap, i64, target_rank, curve)
    else:
        counts, k, pos = affine_steps(slen, starts, tokens, cap, 1, 0, i64, target_rank, tab)
        want, want_pos = naive_walk(slen.tolist(), starts.tolist(), tokens, cap, target_rank, curve)
    assert counts[:k].tolist() == want
    assert pos.tolist() == want_pos


# ------------------------------------------------------------ the walk's cost against CostModel

MODELS = [CostModel.linear(), CostModel.quadratic(), CostModel.quadratic_duration(7),
          CostModel.quadratic_duration(1500), CostModel.step(0.05, 2e-7, 1e-10), CostModel.step(0.0, 1e-6, 0.0)]


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(MODELS), st.integers(1, 64), st.integers(0, 5000), st.integers(1, 200_000),
       st.integers(1, 64), st.integers(1, 2**40))
def test_walk_cost_is_the_cost_model(model, count, longest, tokens, size, max_cost):
    """The walk decides "does this batch fit" with the toolkit's cost under ``CostModel.coefficients``: the same
    answer as ``CostModel.scaled`` and ``BatchConstraint.fits`` (the one rule every planner asks)."""
    ca, cb = model.coefficients
    want = count <= size and count * longest <= tokens and int(model.scaled(count, longest)) <= max_cost
    assert bool(_fits(count, longest, tokens, size, max_cost, ca, cb, NO_TABLE)) == want
    if count > 1:  # (a lone sample always fits the constraint: a batch of its own)
        limits = BatchLimits(tokens, size, model)
        constraint = limits.bind(np.full(count, longest, dtype=np.int64), 1)
        fits = constraint.fits(np.full(count, longest, dtype=np.int64))
        clamped = count * longest <= constraint.max_tokens and count <= constraint.max_size
        assert fits == (clamped and int(model.scaled(count, longest)) <= limits.max_cost)
