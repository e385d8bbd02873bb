"""Elastic resume of the map-style sampler: an epoch cut at one world size and
finished at another trains every sample once (except the final step's
padding), with equal steps on every rank, deterministically."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler, make_plan
from streambatch.epoch.elastic import check_segments, plan_segments, resize, step_samples
from tests.support.helpers import Echo, examples, lognormal_lengths
from tests.support.roundtrip import check_state_roundtrip

LENGTHS = lognormal_lengths(2000, seed=11)


def fn(planner: str, drop_last: bool = False):
    return lambda lens, w, seed, epoch: make_plan(lens, 4000, 16, w, drop_last=drop_last, seed=seed, epoch=epoch,
                                                  planner=planner)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(0, 300), st.lists(st.tuples(st.integers(1, 9), st.floats(0, 1)), min_size=0, max_size=3),
       st.integers(1, 9), st.sampled_from(["greedy", "bucketed"]), st.booleans(), st.integers(0, 3))
def test_segments_train_every_sample_once(n, history, world, planner, drop_last, epoch):
    lengths = LENGTHS[:n]
    plan_fn = fn(planner, drop_last)
    segments, trained, ended = (), [], None
    for w, frac in history:  # run each world size for a fraction of what is left
        plan, base = plan_segments(lengths, plan_fn, w, segments, 5, epoch)
        k = int(frac * plan.num_steps)
        trained.append(step_samples(plan, k))
        assert (plan.batch_sizes() >= 1).all()  # equal steps: every rank has a batch in every step
        if k == plan.num_steps and ended is None:
            ended = plan.num_dropped  # this world finished the epoch: its drop stands, nothing is left
        segments += ((w, k),)
    plan, base = plan_segments(lengths, plan_fn, world, segments, 5, epoch)
    assert base == sum(k for _, k in segments)
    assert (plan.batch_sizes() >= 1).all()
    trained.append(step_samples(plan, plan.num_steps))
    counts = np.bincount(np.concatenate(trained).astype(np.int64), minlength=n)
    repeats = int((counts - 1).clip(0).sum())
    # repeats: the padding of a world's final planned step (steps are trained in shuffled order, so a
    # world that stopped early may have run its padded step already): at most W - 1 per world
    assert repeats <= sum(w - 1 for w, k in segments if k) + world - 1
    if not segments:
        assert repeats == plan.num_padded
    missing = int((counts == 0).sum())
    assert missing == (0 if not drop_last else plan.num_dropped if ended is None else ended)
    again, _ = plan_segments(lengths, plan_fn, world, segments, 5, epoch)
    assert (again.samples == plan.samples).all() and (again.step_order == plan.step_order).all()


def test_no_history_is_the_ordinary_plan():
    plan, base = plan_segments(LENGTHS, fn("greedy"), 4, (), 5, 2)
    ref = make_plan(LENGTHS, 4000, 16, 4, seed=5, epoch=2)
    assert base == 0 and (plan.samples == ref.samples).all() and (plan.step_order == ref.step_order).all()


def test_resize_and_segment_checks():
    assert resize((), 4, 10, 0, 4) == ()  # same world: exact resume
    assert resize((), 4, 10, 0, 3) == ((4, 10),)
    assert resize(((4, 10),), 3, 10, 10, 5) == ((4, 10),)  # the 3-rank run took no step
    assert check_segments([[4, 10], (3, 2)]) == ((4, 10), (3, 2))
    for bad in ("4,10", [[4]], [[0, 1]], [[2, -1]], [[2.0, 1]], [[True, 1]]):
        with pytest.raises(ValueError, match="segments"):
            check_segments(bad)
    with pytest.raises(ValueError, match="claims 999 steps"):
        plan_segments(LENGTHS, fn("greedy"), 3, ((4, 999),), 5, 0)


def run_world(world: int, state: dict | None, epoch: int = 1, steps: int | None = None, **kw):
    """Every rank of a world: resume from ``state`` (or start the epoch), run
    ``steps`` (default: to the end), return batches, lengths and rank 0's state."""
    samplers = [DynamicBatchSampler(LENGTHS, 4000, 16, rank=r, world_size=world, seed=3, **kw)
                for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
        if state is not None:
            s.load_state_dict(state)
    iters = [iter(s) for s in samplers]
    n = None if steps is None else steps
    batches = [[b for _, b in zip(range(n if n is not None else 10**9), it)] for it in iters]
    states = [s.state_dict() for s in samplers]
    assert all(st_ == states[0] for st_ in states)  # rank-independent: any rank's state resumes all
    return batches, [len(s) for s in samplers], states[0]


@pytest.mark.parametrize("planner", ["greedy", "bucketed"])
@pytest.mark.parametrize("w0, w1, frac", [(4, 3, 0.4), (2, 4, 0.5), (8, 5, 0.2), (4, 4, 0.3)])
def test_sampler_resumes_on_another_world_size(w0, w1, frac, planner):
    full, lens0, _ = run_world(w0, None, planner=planner)
    k = int(frac * lens0[0])
    head, _, state = run_world(w0, None, steps=k, planner=planner)
    assert state["step"] == k
    tail, lens1, end = run_world(w1, state, planner=planner)
    again, _, _ = run_world(w1, state, planner=planner)
    assert tail == again  # deterministic
    assert len({len(t) for t in tail}) == 1 and len(set(lens1)) == 1  # equal steps on every rank
    assert lens1[0] == k + len(tail[0])  # len(): the epoch's steps, both worlds
    counts = collections.Counter(i for rank in head + tail for b in rank for i in b)
    assert set(counts) == set(range(LENGTHS.shape[0]))
    repeats = sum(counts.values()) - LENGTHS.shape[0]
    assert repeats <= w1 - 1
    if w0 == w1:
        assert [h + t for h, t in zip(head, tail)] == full and "segments" not in end
    else:
        assert end["segments"] == [[w0, k]] and end["step"] == lens1[0]


def test_two_resizes_and_resume_within_the_new_world():
    _, lens, _ = run_world(4, None)
    head, _, s1 = run_world(4, None, steps=lens[0] // 3)
    mid, _, s2 = run_world(3, s1, steps=5)
    mid2, _, s3 = run_world(3, s2, steps=4)  # same world: exact resume inside the replanned rest
    tail, lens5, end = run_world(5, s3)
    assert s3["segments"] == [[4, lens[0] // 3]] and end["segments"] == [[4, lens[0] // 3], [3, 9]]
    counts = collections.Counter(i for part in (head, mid, mid2, tail) for rank in part for b in rank for i in b)
    assert set(counts) == set(range(LENGTHS.shape[0])) and sum(counts.values()) - len(LENGTHS) <= 4
    s = DynamicBatchSampler(LENGTHS, 4000, 16, rank=0, world_size=5, seed=3)
    s.load_state_dict(s3)
    assert s.base_step == lens[0] // 3 + 9 == lens5[0] - len(tail[0])
    with pytest.raises(ValueError, match="ran at another world size"):
        s.set_start_batch(s.base_step - 1)
    s.set_epoch(2)  # the next epoch is an ordinary one at the new world size
    assert s.base_step == 0 and "segments" not in s.state_dict()
    fresh = DynamicBatchSampler(LENGTHS, 4000, 16, rank=0, world_size=5, seed=3)
    fresh.set_epoch(2)
    assert s.batches[:] == fresh.batches[:]


def test_other_data_at_another_world_size_is_refused():
    _, _, state = run_world(4, None, steps=3)
    with pytest.raises(ValueError, match="different configuration"):
        DynamicBatchSampler(LENGTHS[:-1], 4000, 16, rank=0, world_size=3, seed=3).load_state_dict(state)
    s = DynamicBatchSampler(LENGTHS, 4000, 16, rank=0, world_size=3, seed=3)
    before = s.state_dict()
    with pytest.raises(ValueError, match="segment 0 claims 1000000 steps"):
        s.load_state_dict(dict(state, segments=[[4, 10**6]], step=10**6 + 1))
    assert s.state_dict() == before  # a refused state changes nothing


def test_mixed_sampler_elastic_and_roundtrip():
    a, b = LENGTHS[:1500], lognormal_lengths(400, seed=12) * 2

    def make(world=2, rank=0):
        return DynamicBatchSampler.mixed([a, b], 4000, 16, weights=[0.7, 0.3], rank=rank, world_size=world,
                                         seed=9, planner="bucketed")

    check_state_roundtrip(make)
    s = make()
    s.set_epoch(1)
    assert s.source_positions() == [(0, 1330), (1, 170)] and s.mix.counts == (1330, 570)
    ranks = [make(2, r) for r in range(2)]
    for r in ranks:
        r.set_epoch(1)
    its = [iter(r) for r in ranks]
    head = [next(it) for it in its for _ in range(10)]
    state = ranks[0].state_dict()
    assert state["sources"] == [[0, 1330], [1, 170]]
    new = [make(3, r) for r in range(3)]
    for r in new:
        r.load_state_dict(state)
    tail = [b for r in new for b in r]
    drawn = collections.Counter(s.mix.draw(9, 1).tolist())  # the epoch's samples, repeats of the cycle wrap included
    got = collections.Counter(i for b in head + tail for i in b)
    assert sum((got - drawn).values()) <= 2 and not drawn - got


@pytest.mark.slow  # DataLoader worker processes
def test_stateful_dataloader_with_workers_resumes_elastically():
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(world, rank):
        s = DynamicBatchSampler(LENGTHS, 4000, 16, rank=rank, world_size=world, seed=3)
        s.set_epoch(1)
        return StatefulDataLoader(Echo(), batch_sampler=s, num_workers=2, collate_fn=list)

    heads, states = [], []
    for r in range(4):
        dl = loader(4, r)
        it = iter(dl)
        heads.append([next(it) for _ in range(7)])
        states.append(dl.state_dict())
        del it
    tails = []
    for r in range(3):
        dl = loader(3, r)
        dl.load_state_dict(states[0])  # rank 0's checkpoint serves every new rank
        tails.append(list(dl))
    assert len({len(t) for t in tails}) == 1
    counts = collections.Counter(i for part in (heads, tails) for rank in part for b in rank for i in b)
    assert set(counts) == set(range(len(LENGTHS))) and sum(counts.values()) - len(LENGTHS) <= 2
    plain = [list(DataLoader(Echo(), batch_sampler=DynamicBatchSampler(LENGTHS, 4000, 16, rank=r, world_size=3,
                                                                       seed=3), collate_fn=list)) for r in range(3)]
    assert plain[0] != tails[0]


def test_mixed_sampler_with_max_length_leaves_long_draws_out():
    a, b = LENGTHS[:1500], lognormal_lengths(400, seed=12) * 2
    limit = int(np.percentile(np.concatenate([a, b]), 90))
    lengths = np.concatenate([a, b])

    def make(world, rank):
        return DynamicBatchSampler.mixed([a, b], 6000, 16, weights=[0.5, 0.5], rank=rank, world_size=world, seed=2,
                                         planner="bucketed", max_length=limit)

    head = [make(4, r) for r in range(4)]
    its = [iter(s) for s in head]
    first = [next(it) for it in its for _ in range(5)]
    new = [make(3, r) for r in range(3)]
    for s in new:
        s.load_state_dict(head[0].state_dict())
    rest = [b_ for s in new for b_ in s]
    got = collections.Counter(i for b_ in first + rest for i in b_)
    assert all(lengths[i] <= limit for i in got)
    drawn = collections.Counter(i for i in head[0].mix.draw(2, 0).tolist() if lengths[i] <= limit)
    assert not drawn - got and sum((got - drawn).values()) <= 3 + 2


def test_64_ranks_resume_on_48():
    lengths = lognormal_lengths(30_000, seed=21)

    def world(w):
        return [DynamicBatchSampler(lengths, 16_000, 64, rank=r, world_size=w, seed=1, planner="bucketed", verify=False)
                for r in range(w)]

    old = world(64)
    k = len(old[0]) // 2
    head = [b for s in old for _, b in zip(range(k), s)]
    state = old[0].state_dict()
    new = world(48)
    for s in new:
        s.load_state_dict(state)
    tail = [list(s) for s in new]
    assert len({len(t) for t in tail}) == 1 and len(new[0]) == k + len(tail[0])
    counts = np.bincount(np.concatenate([np.concatenate(head)] + [np.concatenate(t) for t in tail]),
                         minlength=len(lengths))
    assert (counts >= 1).all() and (counts - 1).sum() <= 47
