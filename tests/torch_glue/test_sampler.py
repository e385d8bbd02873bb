"""DynamicBatchSampler: drop-in equality with the reference, resume, DataLoader use."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler
from streambatch.planners.greedy.reference import padded_rank_batches, seed_rank_batches
from tests.support.helpers import Echo, examples, lognormal_lengths
from tests.support.roundtrip import check_state_roundtrip


@settings(max_examples=examples(60), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), max_size=120),
    world_size=st.integers(1, 6),
    max_batch_size=st.integers(1, 8),
    max_batch_tokens=st.integers(1, 200),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 10**6),
    epoch=st.integers(0, 3),
)
def test_batches_match_reference_on_every_rank(lengths, world_size, max_batch_size, max_batch_tokens,
                                               shuffle, drop_last, seed, epoch):
    cfg = dict(max_batch_size=max_batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, epoch=epoch)
    ref = padded_rank_batches(lengths, max_batch_tokens, world_size, **cfg)
    seed_ref = seed_rank_batches(lengths, max_batch_tokens, world_size, **cfg)
    for rank in range(world_size):
        s = DynamicBatchSampler(lengths, max_batch_tokens, max_batch_size, shuffle, drop_last, rank,
                                world_size, seed)
        s.set_epoch(epoch)
        got = list(s)
        assert got == ref[rank] == list(s.batches)
        assert len(s) == len(ref[0])  # equal on every rank
        if len({len(b) for b in seed_ref}) == 1:
            assert got == seed_ref[rank]  # the seed was already equal: identical output


def test_state_roundtrip_mid_end_and_next_epoch():
    lengths = lognormal_lengths(3000)
    for world_size, drop_last in [(1, False), (4, False), (4, True)]:
        check_state_roundtrip(
            functools.partial(DynamicBatchSampler, lengths, 4000, 32, drop_last=drop_last, rank=world_size - 1,
                              world_size=world_size, seed=7),
            key=tuple, epochs=2, cuts=(0.0, 0.37, 0.5, 1.0))


def test_seed_style_resume_with_set_epoch_and_set_start_batch():
    lengths = lognormal_lengths(2000)
    full = DynamicBatchSampler(lengths, 4000, 16, rank=2, world_size=3)
    full.set_epoch(3)
    ref = list(full)
    s = DynamicBatchSampler(lengths, 4000, 16, rank=2, world_size=3)
    s.set_epoch(3)
    s.set_start_batch(5)
    assert list(s) == ref[5:]
    assert list(s) == ref  # the start offset is consumed by one iterator


def test_state_from_another_configuration_is_refused():
    lengths = lognormal_lengths(500)
    s = DynamicBatchSampler(lengths, 4000, 16, world_size=2)
    state = s.state_dict()
    # another world size resumes elastically (tests/planners/test_elastic.py), but not with other settings
    with pytest.raises(ValueError, match="different configuration"):
        DynamicBatchSampler(lengths, 3000, 16, world_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="different configuration"):
        DynamicBatchSampler(lengths, 3000, 16, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="different configuration"):
        DynamicBatchSampler(lengths[:-1], 4000, 16, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=42"):
        DynamicBatchSampler(lengths, 4000, 16, world_size=2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a DynamicBatchSampler state"):
        s.load_state_dict({"epoch": 0})


def test_start_batch_beyond_the_epoch_is_refused():
    s = DynamicBatchSampler(lognormal_lengths(300), 4000, 16)
    with pytest.raises(ValueError, match=rf"\[0, {len(s)}\].*{len(s) + 1}"):
        s.set_start_batch(len(s) + 1)
    with pytest.raises(ValueError, match="-1"):
        s.set_start_batch(-1)


@pytest.mark.parametrize("rank, world_size, match", [(4, 4, r"\[0, 4\)"), (-1, 2, "rank"), (0, 0, "world_size")])
def test_bad_world_layout(rank, world_size, match):
    with pytest.raises(ValueError, match=match):
        DynamicBatchSampler([1, 2, 3], 10, rank=rank, world_size=world_size)


def test_world_defaults_without_torch_distributed():
    s = DynamicBatchSampler([1, 2, 3], 10, rank=None, world_size=None)
    assert (s.rank, s.world_size) == (0, 1)


def test_input_types_plan_identically():
    lengths = lognormal_lengths(700)
    variants = [lengths, lengths.tolist(), lengths.astype(np.int32), lengths.astype(np.float64),
                torch.from_numpy(lengths)]
    plans = [list(DynamicBatchSampler(v, 3000, 16, world_size=3, rank=1)) for v in variants]
    assert all(p == plans[0] for p in plans)


def test_empty_lengths_plan_zero_batches():
    s = DynamicBatchSampler([], 100, world_size=4, rank=3)
    assert len(s) == 0 and list(s) == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_yields_the_plan(num_workers):
    lengths = lognormal_lengths(1500)
    s = DynamicBatchSampler(lengths, 4000, 16, world_size=2, rank=1)
    loader = DataLoader(Echo(), batch_sampler=s, num_workers=num_workers, collate_fn=list)
    assert list(loader) == list(s.batches)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(num_workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    lengths = lognormal_lengths(2500)

    def loader():
        s = DynamicBatchSampler(lengths, 4000, 16, world_size=2, rank=0, seed=3)
        return StatefulDataLoader(Echo(), batch_sampler=s, num_workers=num_workers, collate_fn=list)

    ref = list(loader())
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(17)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    tail = list(second)
    assert head + tail == ref
