"""The bucketed planner: its sort kernel against a naive twin, the plan's
invariants on many random configurations, determinism, randomness across
epochs, and option checking. Quality targets live in bench/quality.py."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.core.cost import CostModel
from streambatch.core.hashing import _mix, hash_array
from streambatch.planners import PLANNERS
from streambatch.planners.bucketed.planner import DEFAULT_BUCKET_WIDTH, _hash_words, bucket_edges, plan_key
from streambatch.planners.bucketed.planner import _mix as _py_mix
from streambatch.planners.bucketed.steps import _TAGS, bucket_sort, deal_rank
from streambatch.planners.toolkit import step_permutation
from tests.support.helpers import examples

COSTS = [None, CostModel.linear(), CostModel.quadratic(), CostModel.quadratic_duration(50)]


def plan(lengths, **kw):
    return make_plan(lengths, planner="bucketed", **kw)


def batches_of(p) -> list[list[np.ndarray]]:
    """[step][rank] -> samples, in training order."""
    return [[p.batch(s, r) for r in range(p.world_size)] for s in range(p.num_steps)]


def check_invariants(p, lengths, tokens, size, world, drop_last, cost=None, max_step_cost=None) -> None:
    n = len(lengths)
    lengths = np.asarray(lengths, dtype=np.int64)
    model = cost if isinstance(cost, CostModel) else CostModel(cost or "quadratic")
    sizes = p.batch_sizes()
    assert sizes.shape == (p.num_steps, world)
    assert (sizes > 0).all(), "every rank has a non-empty batch in every step"
    assert sorted(p.step_order.tolist()) == list(range(p.num_steps))
    assert p.offsets[0] == 0 and p.offsets[-1] == p.samples.size and (np.diff(p.offsets) > 0).all()
    counts = Counter(p.samples.tolist())
    assert sum(c - 1 for c in counts.values()) == p.num_padded
    assert p.num_dropped == p.leftover.size
    if drop_last:
        assert p.num_padded == 0
        assert not set(p.leftover.tolist()) & set(counts)
        assert sorted(p.leftover.tolist() + list(counts)) == list(range(n))
    else:
        assert p.num_dropped == 0 and set(counts) == set(range(n))
        if p.num_padded:  # only a final step of fewer than W samples is padded
            assert p.num_padded <= world - 1
            assert sorted(p.batch_sizes()[np.argsort(p.step_order)][-1].tolist()) == [1] * world
    for step in batches_of(p):
        for batch in step:
            if batch.size > 1:  # only a lone sample may exceed a limit
                longest = int(lengths[batch].max())
                assert batch.size <= size
                assert batch.size * longest <= tokens
                if max_step_cost is not None:
                    assert model.batch_cost(batch.size, longest) <= max_step_cost * (1 + 1e-12)


lengths_st = st.one_of(
    st.lists(st.integers(1, 60), max_size=300),  # many ties
    st.lists(st.integers(0, 5000), max_size=300),  # wide, with zeros
    st.lists(st.sampled_from([0, 3, 3, 4, 50, 51, 800]), max_size=200),  # gaps
    st.integers(0, 400).flatmap(lambda k: st.just(np.random.default_rng(k).lognormal(4, 1, k).astype(int) + 1)),
)


@settings(max_examples=examples(250), deadline=None)
@given(lengths=lengths_st, world=st.integers(1, 12), size=st.integers(1, 24), tokens=st.integers(1, 4000),
       drop_last=st.booleans(), shuffle=st.booleans(), seed=st.integers(-(2**70), 2**70), epoch=st.integers(0, 5),
       width=st.sampled_from([0.001, 0.01, DEFAULT_BUCKET_WIDTH, 0.2, 1.0]), cost=st.sampled_from(COSTS),
       step_cost=st.one_of(st.none(), st.integers(1, 10**7)))
def test_plan_invariants(lengths, world, size, tokens, drop_last, shuffle, seed, epoch, width, cost, step_cost):
    kw = dict(max_batch_tokens=tokens, max_batch_size=size, world_size=world, drop_last=drop_last, shuffle=shuffle,
              seed=seed, epoch=epoch, bucket_width=width, cost=cost, max_step_cost=step_cost)
    p = plan(lengths, **kw)
    check_invariants(p, list(lengths), tokens, size, world, drop_last, cost, step_cost)
    # a pure function of its arguments
    assert plan(lengths, **kw).fingerprint() == p.fingerprint()
    if drop_last:
        # what is left out cannot complete a step: fewer samples than the largest step planned
        biggest = int(p.batch_sizes().sum(axis=1).max(initial=max(world, 1) * size))
        assert p.num_dropped < max(biggest, world) + world * size


@settings(max_examples=examples(60), deadline=None)
@given(n=st.integers(200, 1500), world=st.sampled_from([1, 2, 8]), seed=st.integers(0, 2**32))
def test_determinism_and_epochs_differ(n, world, seed):
    lengths = np.random.default_rng(seed).lognormal(5, 0.8, n).astype(np.int64) + 1
    kw = dict(max_batch_tokens=4000, max_batch_size=16, world_size=world, seed=seed)
    first = plan(lengths, epoch=0, **kw)
    assert plan(lengths.tolist(), epoch=0, **kw).fingerprint() == first.fingerprint()
    assert plan(lengths, epoch=1, **kw).fingerprint() != first.fingerprint()
    assert plan(lengths, epoch=0, **{**kw, "seed": seed + 1}).fingerprint() != first.fingerprint()
    # without shuffling there is nothing random: seed and epoch do not matter
    fixed = plan(lengths, epoch=0, shuffle=False, **kw)
    assert plan(lengths, epoch=3, shuffle=False, **{**kw, "seed": seed + 9}).fingerprint() == fixed.fingerprint()


def mates_and_repeats(lengths, p0, p1) -> tuple[float, float]:
    b0 = [np.sort(b) for step in batches_of(p0) for b in step]
    b1 = [np.sort(b) for step in batches_of(p1) for b in step]
    seen = {b.tobytes() for b in b0}
    repeated = sum(b.tobytes() in seen for b in b1) / len(b1)
    home = np.empty(len(lengths), dtype=np.int64)
    for i, b in enumerate(b0):
        home[b] = i
    kept = [((home[b][:, None] == home[b][None, :]).sum(axis=1) - 1) / (b.size - 1) for b in b1 if b.size > 1]
    return repeated, float(np.concatenate(kept).mean())


@pytest.fixture(scope="module")
def speech():
    """4,000 log-normal utterance lengths in frames (0.5-30 s at 50 frames/s)."""
    secs = np.random.default_rng(7).lognormal(np.log(4.0), 0.8, 4000).clip(0.5, 30)
    return np.ceil(secs * 50).astype(np.int64)


def test_batches_and_batch_mates_change_between_epochs(speech):
    kw = dict(max_batch_tokens=16_000, max_batch_size=64, world_size=8, seed=3)
    plans = [plan(speech, epoch=e, **kw) for e in range(3)]
    kept_pairs = []
    for p0, p1 in zip(plans, plans[1:]):
        repeated, kept = mates_and_repeats(speech, p0, p1)
        assert repeated < 0.05
        kept_pairs.append(kept)
        assert not np.array_equal(p0.step_order, p1.step_order)
    # one pair of 13-step epochs scatters by +-0.1 around the mean (0.38 over seeds 0-7)
    assert np.mean(kept_pairs) < 0.5
    # wider buckets shuffle more
    kept = [mates_and_repeats(speech, *(plan(speech, epoch=e, bucket_width=w, **kw) for e in (0, 1)))[1]
            for w in (0.005, 0.1)]
    assert kept[1] < kept[0]


def test_step_order_is_shuffled(speech):
    p = plan(speech, max_batch_tokens=16_000, world_size=4, seed=1)
    longest = [max(int(speech[b].max()) for b in step) for step in batches_of(p)]
    # training order is not the planned (length-sorted) order
    assert not np.array_equal(p.step_order, np.arange(p.num_steps))
    assert abs(np.corrcoef(np.arange(len(longest)), longest)[0, 1]) < 0.5


def test_balanced_and_little_padding_on_speech(speech):
    # a behaviour check, not the benchmark: the planner sorts and balances
    p = plan(speech, max_batch_tokens=16_000, max_batch_size=64, world_size=4, seed=5)
    sizes = p.batch_sizes()
    longest = np.array([[speech[b].max() for b in step] for step in batches_of(p)])
    real = sum(int(speech[b].sum()) for step in batches_of(p) for b in step)
    assert real / (sizes * longest).sum() > 0.9
    cost = sizes * longest.astype(float) ** 2
    assert (cost.sum(axis=1) / (4 * cost.max(axis=1))).mean() > 0.9


def test_max_step_cost_evens_out_steps(speech):
    kw = dict(max_batch_tokens=16_000, max_batch_size=64, world_size=4, seed=2)
    free = plan(speech, **kw)

    def step_cost(p):  # a synchronous step lasts as long as its costliest batch
        return np.array([max(b.size * float(speech[b].max()) ** 2 for b in step) for step in batches_of(p)])

    cap = float(np.median(step_cost(free)))
    capped = plan(speech, max_step_cost=cap, **kw)
    check_invariants(capped, speech, 16_000, 64, 4, False, None, cap)
    assert step_cost(capped).max() < step_cost(free).max()
    assert capped.num_steps > free.num_steps


def test_edge_cases():
    assert plan([], max_batch_tokens=10, world_size=3).num_steps == 0
    # fewer samples than ranks: one step, padded
    p = plan([5, 7], max_batch_tokens=100, world_size=4)
    check_invariants(p, [5, 7], 100, 64, 4, False)
    assert p.num_steps == 1 and p.num_padded == 2
    p = plan([5, 7], max_batch_tokens=100, world_size=4, drop_last=True)
    assert p.num_steps == 0 and sorted(p.leftover.tolist()) == [0, 1]
    # zero lengths, and lone samples over the budget
    for lengths in ([0] * 50, [0, 0, 500, 3, 900, 0, 2000] * 5):
        for w in (1, 3):
            check_invariants(plan(lengths, max_batch_tokens=400, max_batch_size=8, world_size=w), lengths, 400, 8,
                             w, False)


@pytest.mark.slow
def test_wide_lengths_use_the_wide_paths():
    # lengths too large for the bucket table and for int32 (linear cost keeps int64 safe)
    lengths = np.random.default_rng(0).integers(1, 2**33, 500)
    p = PLANNERS["bucketed"](lengths, 2**36, 8, 2, True, False, 0, 0, cost="linear")
    check_invariants(p, lengths, 2**36, 8, 2, False, "linear")
    mid = np.random.default_rng(1).integers(1, 2**20, 500)
    check_invariants(plan(mid, max_batch_tokens=2**23, max_batch_size=8, world_size=2), mid, 2**23, 8, 2, False)


@settings(max_examples=examples(80), deadline=None)
@given(lengths=st.lists(st.integers(0, 3000), max_size=400), width=st.sampled_from([0.001, 0.02, 0.3]),
       shuffle=st.booleans(), key=st.integers(0, 2**64 - 1), tokens=st.integers(1, 20000), size=st.integers(1, 64),
       table=st.booleans())
def test_bucket_sort_matches_a_naive_twin(lengths, width, shuffle, key, tokens, size, table):
    lengths = np.array(lengths, dtype=np.int64)
    n = lengths.size
    lmax = int(lengths.max(initial=0))
    edges = bucket_edges(lmax, width, 0.37)
    order, slen = np.empty(n, np.int32), np.empty(n, np.int16)
    # with a lookup table of every length's bucket, or bisecting the edges
    m = bucket_sort(lengths, edges, np.empty(lmax + 1 if table else 0, np.int32), np.uint64(key), shuffle, tokens,
                    size, order, slen, np.empty(n, np.int32), np.empty(n, np.int16))
    # naive: densest bucket, then buckets up to it ascending, the rest descending
    bucket = np.searchsorted(edges, lengths, side="right")
    per_bucket = np.bincount(bucket, minlength=edges.size + 1)
    lows = np.concatenate([[0], edges])
    score = per_bucket / np.minimum(float(size), tokens / np.maximum(lows, 1))
    dense = int(np.argmax(score))
    rank = np.where(bucket <= dense, bucket, 2 * edges.size + 1 - bucket)
    tag = [int(_mix(np.uint64(key), np.uint64(i)) & np.uint64(_TAGS - 1)) if shuffle else 0 for i in range(n)]
    want = sorted(range(n), key=lambda i: (rank[i], tag[i], i))
    assert order.tolist() == want
    assert slen.tolist() == lengths[want].tolist()
    assert m == int((bucket <= dense).sum())


@settings(max_examples=examples(100), deadline=None)
@given(max_len=st.integers(0, 10**7), width=st.floats(0.001, 1.0), phase=st.floats(0, 0.999))
def test_bucket_edges(max_len, width, phase):
    edges = bucket_edges(max_len, width, phase)
    assert edges[0] == 1 and edges[-1] > max_len and (np.diff(edges) > 0).all()
    # buckets are at most about `width` wide, relative to their lower edge
    wide = edges[:-1] >= 2 / width
    assert (edges[1:][wide] <= np.ceil(edges[:-1][wide] * (1 + width) ** 2) + 1).all()


@settings(deadline=None)  # the first example compiles deal_rank
@given(m=st.integers(1, 500), w=st.integers(1, 70))
def test_deal_rank_spreads_evenly(m, w):
    slots = [deal_rank(t, m, w) for t in range(m)]
    count = np.bincount(slots, minlength=w)
    assert count.max() - count.min() <= (1 if m >= w else 1) and count.sum() == m
    assert all(0 <= s < w for s in slots)
    if m >= w:
        # the W longest go one to each slot; a final partial round goes to the last slots
        assert sorted(slots[:w]) == list(range(w))
        extra = m % w
        assert set(np.flatnonzero(count > m // w)) == set(range(w - extra, w))


@settings(max_examples=examples(100), deadline=None)
@given(words=st.lists(st.integers(0, 2**32 - 1), max_size=4), h=st.integers(0, 2**64 - 1), v=st.integers(0, 2**64 - 1))
def test_python_keys_match_the_numba_hash(words, h, v):
    # plan keys are computed in Python ints (no compiled code); they must be
    # the very bits core.hashing produces, or every plan would change.
    words = np.array(words, dtype=np.uint32)
    assert _hash_words(words, h) == int(hash_array(words.astype(np.int64), np.uint64(h))) % 2**64
    assert _py_mix(h, v) == int(_mix(np.uint64(h), np.uint64(v)))


def test_keys_and_step_permutation():
    keys = {int(plan_key(s, e)) for s in (-1, 0, 1, 2**64, -(2**64)) for e in (0, 1, 2**70)}
    assert len(keys) == 15
    for n in (0, 1, 7, 100):
        assert sorted(step_permutation(n, np.uint64(5)).tolist()) == list(range(n))


@pytest.mark.parametrize("options, exc, words", [
    ({"bucket_widht": 0.1}, TypeError, ["bucket_widht", "bucket_width", "max_step_cost"]),
    ({"bucket_width": 0}, ValueError, ["[0.001, 1]", "got 0.0"]),
    ({"bucket_width": 1.5}, ValueError, ["[0.001, 1]"]),
    ({"bucket_width": "wide"}, TypeError, ["number"]),
    ({"bucket_width": True}, TypeError, ["number"]),
    ({"cost": "cubic"}, ValueError, ["linear", "quadratic"]),
    ({"cost": 3}, TypeError, ["CostModel"]),
    ({"max_step_cost": 0}, ValueError, ["> 0", "None for no cap"]),
    ({"max_step_cost": float("nan")}, ValueError, ["finite"]),
    ({"max_step_cost": 10**400}, ValueError, ["finite"]),
    ({"max_step_cost": "big"}, TypeError, ["number"]),
    ({"max_step_cost": 0.5}, ValueError, ["below the cost of any batch"]),
])
def test_bad_options_are_refused_with_a_clear_message(options, exc, words):
    with pytest.raises(exc) as info:
        plan([10, 20, 30], max_batch_tokens=100, **options)
    for word in words:
        assert word in str(info.value)


def test_step_cost_overflow_is_refused():
    with pytest.raises(ValueError, match="coarser units"):
        plan([10**6] * 4, max_batch_tokens=10**7, cost=CostModel.quadratic_duration(2**61))
