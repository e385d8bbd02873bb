"""DynamicBatchSampler with packed batches (``planner="bucketed", pack=True``):
every rank's batches within sum(L) <= budget, equal steps, exactly once, state
round-trips, elastic resume on another world size, mixed sources, and a
DataLoader feeding collate_packed."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler, collate_packed
from tests.support.helpers import lognormal_lengths
from tests.support.roundtrip import check_state_roundtrip

LENGTHS = lognormal_lengths(1500, seed=31)
BUDGET, CAP = 6000, 32


def sampler(rank=0, world=1, lengths=LENGTHS, **kw):
    return DynamicBatchSampler(lengths, BUDGET, CAP, rank=rank, world_size=world, seed=4, planner="bucketed",
                               pack=True, **kw)


def check_batches(batches, lengths=LENGTHS):
    for b in batches:
        assert 0 < len(b) <= CAP and (len(b) == 1 or int(lengths[b].sum()) <= BUDGET)


def test_every_rank_packed_equal_steps_exactly_once():
    for world in (1, 3, 8):
        ranks = [list(sampler(r, world)) for r in range(world)]
        assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) == len(sampler(0, world))
        for r in ranks:
            check_batches(r)
        counts = collections.Counter(i for r in ranks for b in r for i in b)
        assert set(counts) == set(range(LENGTHS.size)) and sum(counts.values()) - LENGTHS.size < world
    # packed batches hold what padded ones could not: some batch has B x longest over the budget
    assert any(len(b) * int(LENGTHS[b].max()) > BUDGET for b in sampler(0, 3))


def test_state_roundtrip():
    check_state_roundtrip(lambda: sampler(1, 3))


def test_resume_on_another_world_size():
    old = [sampler(r, 4) for r in range(4)]
    for s in old:
        s.set_epoch(2)
    k = len(old[0]) // 3
    its = [iter(s) for s in old]
    head = [next(it) for it in its for _ in range(k)]
    state = old[0].state_dict()
    new = [sampler(r, 3) for r in range(3)]
    for s in new:
        s.load_state_dict(state)
    tail = [list(s) for s in new]
    assert len({len(t) for t in tail}) == 1 and state["step"] == k
    check_batches(head + [b for t in tail for b in t])
    counts = collections.Counter(i for b in head + [b for t in tail for b in t] for i in b)
    assert set(counts) == set(range(LENGTHS.size)) and sum(counts.values()) - LENGTHS.size <= 2


def test_mixed_sources():
    a, b = LENGTHS[:1000], lognormal_lengths(300, seed=32) * 2
    both = np.concatenate([a, b])

    def make(rank=0, world=2):
        return DynamicBatchSampler.mixed([a, b], BUDGET, CAP, weights=[0.6, 0.4], rank=rank, world_size=world, seed=5,
                                         planner="bucketed", pack=True)

    check_state_roundtrip(make)
    s = make()
    s.set_epoch(1)
    ranks = [make(r) for r in range(2)]
    for r in ranks:
        r.set_epoch(1)
    got = [bt for r in ranks for bt in r]
    check_batches(got, both)
    drawn = collections.Counter(s.mix.draw(5, 1).tolist())
    trained = collections.Counter(i for bt in got for i in bt)
    assert not drawn - trained and sum((trained - drawn).values()) <= 1  # the draw, but the final step's padding


class Features(torch.utils.data.Dataset):
    def __len__(self):
        return LENGTHS.size

    def __getitem__(self, i):
        return {"__key__": i, "features": torch.full((int(LENGTHS[i]), 4), float(i))}


def test_dataloader_with_collate_packed():
    s = sampler(0, 2)
    loader = DataLoader(Features(), batch_sampler=s, collate_fn=collate_packed)
    for batch, idx in zip(loader, s):
        assert batch["keys"] == idx
        n = int(LENGTHS[idx].sum())
        assert batch["features"].shape == (n, 4) and (n <= BUDGET or len(idx) == 1)
        cu = batch["cu_seqlens"].tolist()
        assert [int(batch["features"][cu[j], 0]) for j in range(len(idx))] == idx


def test_packed_and_padded_states_do_not_mix():
    state = sampler(0, 2).state_dict()
    padded = DynamicBatchSampler(LENGTHS, BUDGET, CAP, rank=0, world_size=2, seed=4, planner="bucketed")
    with pytest.raises(ValueError, match="different configuration"):
        padded.load_state_dict(state)
    with pytest.raises(ValueError, match="different configuration"):
        sampler(0, 2).load_state_dict(padded.state_dict())
