"""``make_plan(planner="greedy")`` against the naive seed planner, plus invariants."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from streambatch import make_plan
from streambatch.planners.greedy import reference as naive
from tests.support.helpers import examples


def rank_batches(plan) -> list[list[list[int]]]:
    """Every rank's batches in training order, as plain lists."""
    return [[plan.batch(i, r).tolist() for i in range(plan.num_steps)] for r in range(plan.world_size)]


def check_invariants(plan, lengths, cfg) -> None:
    n, w = len(lengths), cfg["world_size"]
    t, b = cfg["max_batch_tokens"], cfg["max_batch_size"]
    batches = rank_batches(plan)
    sizes = plan.batch_sizes()
    assert sizes.shape == (plan.num_steps, w)
    # equal batch counts on every rank, and no empty batch anywhere
    assert all(len(rb) == plan.num_steps for rb in batches)
    assert (sizes > 0).all()
    assert sizes.tolist() == [[len(batches[r][i]) for r in range(w)] for i in range(plan.num_steps)]
    counts = Counter(s for rb in batches for batch in rb for s in batch)
    assert sum(c - 1 for c in counts.values()) == plan.num_padded
    assert 0 <= plan.num_padded <= w - 1
    leftover = plan.leftover.tolist()
    assert plan.num_dropped == len(leftover)
    if cfg["drop_last"]:
        assert plan.num_padded == 0
        assert not set(leftover) & set(counts)
        assert sorted(leftover) == sorted(set(range(n)) - set(counts))
        assert plan.num_dropped < n or n == 0 or plan.num_steps == 0
    else:
        assert plan.num_dropped == 0
        assert set(counts) == set(range(n))
    for rb in batches:
        for batch in rb:
            if len(batch) > 1:  # only a lone sample may exceed the budget
                assert len(batch) <= b
                assert len(batch) * max(lengths[s] for s in batch) <= t


def check_against_naive(lengths, cfg) -> None:
    plan = make_plan(lengths, **cfg)
    want = naive.padded_rank_batches(lengths, **cfg)
    assert rank_batches(plan) == want
    check_invariants(plan, [int(x) for x in lengths], cfg)
    seed = naive.seed_rank_batches(lengths, **cfg)
    if len({len(rb) for rb in seed}) == 1:
        # the seed already gives equal counts: streambatch is the seed, batch for batch
        assert plan.num_padded == 0
        assert rank_batches(plan) == seed
    else:
        assert plan.num_padded > 0 and not cfg["drop_last"]


@st.composite
def lengths_lists(draw, max_size=150):
    n = draw(st.one_of(st.integers(0, 10), st.integers(10, max_size)))
    kind = draw(st.sampled_from(["ties", "zeros", "spread", "equal", "outliers"]))
    if kind == "equal":
        return [draw(st.integers(0, 50))] * n
    elements = {
        "ties": st.integers(0, 6),
        "zeros": st.sampled_from([0, 0, 0, 1, 2]),
        "spread": st.integers(0, 400),
        # mostly short, some far over most budgets drawn below
        "outliers": st.one_of(st.integers(1, 30), st.integers(1, 30), st.integers(5_000, 10**6)),
    }[kind]
    return draw(st.lists(elements, min_size=n, max_size=n))


budgets = st.one_of(st.integers(1, 12), st.integers(1, 600), st.integers(600, 20_000), st.just(10**12))
batch_caps = st.one_of(st.integers(1, 4), st.integers(1, 80), st.sampled_from([1, 64, 100]))


@st.composite
def configs(draw):
    return dict(
        max_batch_tokens=draw(budgets),
        max_batch_size=draw(batch_caps),
        world_size=draw(st.one_of(st.integers(1, 4), st.integers(1, 16))),
        shuffle=draw(st.booleans()),
        drop_last=draw(st.booleans()),
        seed=draw(st.one_of(st.integers(-50, 50), st.integers(-(2**70), 2**70))),
        epoch=draw(st.integers(0, 5)),
    )


def cfg_of(t, b=64, w=1, shuffle=True, drop_last=False, seed=42, epoch=0):
    return dict(max_batch_tokens=t, max_batch_size=b, world_size=w, shuffle=shuffle, drop_last=drop_last,
                seed=seed, epoch=epoch)


@settings(max_examples=examples(600), deadline=None)
@given(lengths_lists(), configs())
@example([], cfg_of(100, w=4))
@example([], cfg_of(100, w=4, drop_last=True))
@example([5], cfg_of(100, w=8))  # W > N: seven padded slots
@example([3, 9], cfg_of(100, w=16, drop_last=True))  # W > N with drop_last: nothing left
@example([10**6], cfg_of(10, w=1))  # a lone sample over budget
@example([7] * 37, cfg_of(70, b=3, w=5, shuffle=False))  # ties decided by the rotated rank
@example([0] * 50, cfg_of(1, b=4, w=3))  # zero lengths never fill the budget
@example([4, 1, 3, 2] * 10, cfg_of(1, b=1, w=3))  # tiny budget and B=1
def test_matches_naive(lengths, cfg):
    check_against_naive(lengths, cfg)
    # coverage of the interesting cases (see --hypothesis-show-statistics)
    plan = make_plan(lengths, **cfg)
    event(f"steps: {min(plan.num_steps, 3)}{'+' if plan.num_steps >= 3 else ''}")
    event(f"padded: {plan.num_padded > 0}, dropped: {plan.num_dropped > 0}")
    event(f"W > N: {cfg['world_size'] > len(lengths)}")
    event(f"lone sample over budget: {any(x > cfg['max_batch_tokens'] for x in lengths)}")


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(0, 2**40), st.integers(1, 16), st.booleans())
def test_world_bigger_than_data(seed, world_size, drop_last):
    lengths = list(range(world_size - 1))  # N = W - 1 < W: one partial step
    cfg = cfg_of(10**6, w=world_size, drop_last=drop_last, seed=seed)
    check_against_naive(lengths, cfg)
    plan = make_plan(lengths, **cfg)
    if drop_last:
        assert plan.num_steps == 0 and plan.num_dropped == len(lengths)
    else:
        assert plan.num_steps == (1 if lengths else 0)
        assert plan.num_padded == (world_size - len(lengths) if lengths else 0)


@pytest.mark.parametrize("world_size", [1, 3, 16])
@pytest.mark.parametrize("shuffle", [True, False])
def test_over_budget_samples_get_their_own_batch(world_size, shuffle):
    lengths = [5, 500, 6, 700, 4, 800, 5, 900, 3] * 4
    cfg = cfg_of(100, b=8, w=world_size, shuffle=shuffle)
    check_against_naive(lengths, cfg)
    plan = make_plan(lengths, **cfg)
    for batches in rank_batches(plan):
        for batch in batches:
            if any(lengths[s] > 100 for s in batch):
                assert len(batch) == 1


@pytest.mark.parametrize("world_size", [1, 2, 7, 16])
@pytest.mark.parametrize("max_batch_size", [1, 5, 64])
def test_all_equal_lengths(world_size, max_batch_size):
    for epoch in range(3):
        check_against_naive([40] * 301, cfg_of(400, b=max_batch_size, w=world_size, epoch=epoch))
        check_against_naive([40] * 301, cfg_of(400, b=max_batch_size, w=world_size, shuffle=False, epoch=epoch))


@pytest.mark.parametrize("drop_last", [False, True])
def test_many_chunks_and_epochs(drop_last):
    # N > 512 spans several maximal sortish chunks and many rotations of the tie-break
    lengths = np.random.default_rng(3).integers(50, 1600, 3000).tolist()
    for epoch in range(3):
        check_against_naive(lengths, cfg_of(8000, b=64, w=4, drop_last=drop_last, seed=7, epoch=epoch))


def test_large_lengths_below_the_overflow_guard():
    # costs near 1e17: the kernel's int64 arithmetic must still agree with Python's big ints
    rng = np.random.default_rng(11)
    lengths = rng.integers(10**7, 10**8, 200).tolist()
    check_against_naive(lengths, cfg_of(10**9, b=16, w=3, seed=5))


@pytest.mark.parametrize("max_batch_size", [10**4, 2**40, 2**62, 2**63 - 1])
def test_unbounded_batch_size_cap(max_batch_size):
    # a cap far above N never binds: the plan must be the seed's, as with max_batch_size=N
    lengths = [3, 8, 1, 9, 4, 4, 2, 7, 6, 5] * 5
    check_against_naive(lengths, cfg_of(40, b=max_batch_size, w=2))


@pytest.mark.parametrize("max_batch_tokens", [2**62, 2**63 - 1, 2**70, 10**30, 1e300])
def test_unbounded_budget(max_batch_tokens):
    # a budget beyond int64 is clamped before the kernel, without changing the plan
    lengths = [3, 8, 1, 9, 4, 4, 2, 7, 6, 5] * 5
    check_against_naive(lengths, cfg_of(max_batch_tokens, b=6, w=3))


@settings(max_examples=examples(40), deadline=None)
@given(lengths_lists(), configs())
def test_deterministic(lengths, cfg):
    a, b = make_plan(lengths, **cfg), make_plan(list(lengths), **cfg)
    assert a.fingerprint() == b.fingerprint()
    assert rank_batches(a) == rank_batches(b)


def test_fingerprint_sees_a_changed_plan():
    lengths = list(range(100))
    a = make_plan(lengths, 300, seed=1)
    b = make_plan(lengths, 300, seed=2)
    assert rank_batches(a) != rank_batches(b)
    assert a.fingerprint() != b.fingerprint()


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=40, max_size=300), st.integers(0, 2**40), st.integers(1, 8))
def test_epochs_differ(lengths, seed, world_size):
    plans = [make_plan(lengths, 2000, 16, world_size, seed=seed, epoch=e) for e in range(4)]
    assert len({p.fingerprint() for p in plans}) == 4
    assert len({str(rank_batches(p)) for p in plans}) == 4


def test_epochs_differ_fixed():
    lengths = np.random.default_rng(0).integers(1, 2000, 5000)
    plans = [make_plan(lengths, 16_000, 64, 8, epoch=e) for e in range(5)]
    assert len({p.fingerprint() for p in plans}) == 5


def test_no_shuffle_ignores_seed_and_epoch():
    lengths = np.random.default_rng(1).integers(1, 500, 400)
    plans = [make_plan(lengths, 2000, 8, 3, shuffle=False, seed=s, epoch=e) for s in (0, 9) for e in (0, 4)]
    assert len({p.fingerprint() for p in plans}) == 1
    # without shuffle the steps stay in planning order: sample 0 trains in the first step
    assert any(0 in plans[0].batch(0, r).tolist() for r in range(3))


LENGTHS = np.random.default_rng(5).integers(0, 900, 700)


@pytest.mark.parametrize(
    "convert",
    [
        lambda a: a.tolist(),
        lambda a: tuple(a.tolist()),
        lambda a: a.astype(np.int64),
        lambda a: a.astype(np.int32),
        lambda a: a.astype(np.uint16),
        lambda a: a.astype(np.uint64),
        lambda a: a.astype(np.float64),
        lambda a: a.astype(np.float32),
        lambda a: np.asfortranarray(np.stack([a, a]))[0],  # non-contiguous view
        lambda a: torch.tensor(a, dtype=torch.int64),
        lambda a: torch.tensor(a, dtype=torch.int32),
        lambda a: torch.tensor(a, dtype=torch.float64),
    ],
    ids=["list", "tuple", "int64", "int32", "uint16", "uint64", "float64", "float32", "strided",
         "torch-int64", "torch-int32", "torch-float64"],
)
@pytest.mark.parametrize("world_size", [1, 4])
def test_input_types_plan_identically(convert, world_size):
    reference = make_plan(LENGTHS.tolist(), 3000, 32, world_size, seed=3, epoch=1)
    plan = make_plan(convert(LENGTHS), 3000, 32, world_size, seed=3, epoch=1)
    assert plan.fingerprint() == reference.fingerprint()
    assert rank_batches(plan) == rank_batches(reference)
    assert rank_batches(plan) == naive.padded_rank_batches(LENGTHS.tolist(), 3000, max_batch_size=32,
                                                           world_size=world_size, seed=3, epoch=1)


def test_numpy_integer_arguments():
    lengths = LENGTHS[:200]
    a = make_plan(lengths, 3000, 32, 4, seed=3, epoch=1)
    b = make_plan(lengths, np.int64(3000), np.int32(32), np.uint8(4), seed=np.int64(3), epoch=np.int16(1))
    assert a.fingerprint() == b.fingerprint()
