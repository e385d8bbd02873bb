"""StreamingBatches with packed batches (``pack=True``) on real tar shards, in
both read modes: every rank's batches within sum(L) <= budget, equal steps,
exactly once (but the final step's padding or drop), state round-trips,
elastic resume on another world size, mixed sources, and decoded audio
packed by collate_packed."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from streambatch import collate_packed
from streambatch.streaming import StreamingBatches
from streambatch.streaming.shards.sources import Source
from tests.support.roundtrip import check_state_roundtrip
from tests.support.shards import FPS, SAMPLE_RATE

SIZES = [37, 23, 41, 0, 29, 35, 18, 44, 31, 26, 39, 22, 30, 27]
BUDGET, CAP = 400, 12
MODES = ["sample", "shard"]


@pytest.fixture(scope="module")
def corpus(make_corpus):
    a = make_corpus(SIZES, seed=23, name="packed")
    b = make_corpus([9, 14, 7], seed=24, prefix="b", name="packed-b")
    return a.brace, a.expected, b.brace, b.expected


def make(src, mode, rank=0, world=1, **kw):
    kw.setdefault("window_samples", 120)
    return StreamingBatches(src, kw.pop("budget", BUDGET), CAP, rank=rank, world_size=world, read_mode=mode,
                            pack=True, **kw)


def keys(batches):
    return [[s["__key__"] for s in b] for b in batches]


def run(src, mode, world, epoch=1, state=None, steps=None, **kw):
    out, states = [], []
    for r in range(world):
        ds = make(src, mode, r, world, **kw)
        ds.set_epoch(epoch)
        if state is not None:
            ds.load_state_dict(state)
        it = iter(ds)
        out.append(keys(b for _, b in zip(range(10**9 if steps is None else steps), it)))
        states.append(ds.state_dict())
    return out, states[0], ds


def check_packed(ranks, lengths):
    assert len({len(r) for r in ranks}) == 1  # equal steps
    for r in ranks:
        for b in r:
            assert 0 < len(b) <= CAP and (len(b) == 1 or sum(lengths[k] for k in b) <= BUDGET)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world, drop_last", [(2, True), (3, False), pytest.param(1, False, marks=pytest.mark.slow),
                                               pytest.param(4, True, marks=pytest.mark.slow)])
def test_exactly_once_equal_steps_packed_budget(corpus, mode, world, drop_last):
    src, expected = corpus[0], corpus[1]
    ranks, _, ds = run(src, mode, world, drop_last=drop_last)
    summary = ds.epoch_summary(1)
    assert len(ranks[0]) == len(ds) == summary.steps
    check_packed(ranks, expected)
    counts = collections.Counter(k for r in ranks for b in r for k in b)
    if drop_last:
        assert summary.padded == 0 and max(counts.values()) == 1
        assert len(counts) == len(expected) - summary.dropped
    else:
        assert set(counts) == set(expected) and sum(counts.values()) - len(expected) == summary.padded < world
    # packing is in use: batches the padded rule (B x longest) would refuse
    assert any(len(b) * max(expected[k] for k in b) > BUDGET for r in ranks for b in r)


@pytest.mark.parametrize("mode", MODES)
def test_state_roundtrip(corpus, mode):
    check_state_roundtrip(lambda: make(corpus[0], mode, 1, 2), key=lambda b: tuple(s["__key__"] for s in b))


@pytest.mark.parametrize("mode", MODES)
def test_resume_on_another_world_size(corpus, mode):
    src, expected = corpus[0], corpus[1]
    full, _, _ = run(src, mode, 4)
    k = len(full[0]) // 2
    head, state, _ = run(src, mode, 4, steps=k)
    tail, end, _ = run(src, mode, 3, state=state)
    assert end["segments"] == [[4, k]]
    check_packed(tail, expected)
    check_packed(head, expected)
    got = collections.Counter(x for part in (head, tail) for r in part for b in r for x in b)
    assert set(got) == set(expected) and sum(got.values()) - len(expected) <= 3 + 2


def mixed(corpus, mode, rank, world):
    return StreamingBatches([Source(corpus[0], weight=0.7), Source(corpus[2], weight=0.3)], BUDGET, CAP, rank=rank,
                            world_size=world, read_mode=mode, window_samples=120, pack=True)


@pytest.mark.parametrize("mode", MODES)
def test_mixed_sources(corpus, mode):
    a, expected, b, kb = corpus
    lengths = dict(expected)  # and the second corpus's, from its samples' durations
    ds0 = StreamingBatches(b, BUDGET, CAP, rank=0, world_size=1, window_samples=1000)
    lengths.update({s["__key__"]: n for bt in ds0 for s, n in zip(bt, _frames(bt))})
    assert set(kb) <= set(lengths)
    ranks = []
    for r in range(3):
        ds = mixed(corpus, mode, r, 3)
        ds.set_epoch(1)
        ranks.append(keys(ds))
    check_packed(ranks, lengths)
    summary = mixed(corpus, mode, 0, 3).epoch_summary(1)
    got = collections.Counter(k for r in ranks for bt in r for k in bt)
    assert sum(got.values()) == summary.samples + summary.padded
    by = collections.Counter(k.split("/")[0] for k in got.elements())
    assert abs(by["b"] / sum(by.values()) - 0.3) < 0.05  # the mix's share


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_mixed_state_roundtrip(corpus, mode):
    check_state_roundtrip(lambda: mixed(corpus, mode, 1, 3), key=lambda bt: tuple(s["__key__"] for s in bt))


def _frames(batch):
    import json

    return [int(np.ceil(json.loads(s["json"])["duration"] * FPS - 1e-6)) for s in batch]


@pytest.mark.parametrize("mode", MODES)
def test_decoded_audio_packed_by_collate_packed(corpus, mode):
    src, expected = corpus[0], corpus[1]
    ds = make(src, mode, 0, 2, decode="audio", collate_fn=collate_packed)
    n = 0
    for batch in DataLoader(ds, batch_size=None, num_workers=1):
        audio, cu = batch["audio"], batch["cu_seqlens"]
        assert audio.dtype == torch.float32 and audio.shape[0] == 1 and batch["sample_rate"] == SAMPLE_RATE
        assert cu[-1] == audio.shape[1] and cu.dtype == torch.int32 and len(cu) == len(batch["keys"]) + 1
        for j, (k, meta) in enumerate(zip(batch["keys"], batch["json"])):
            frames = int(cu[j + 1] - cu[j])
            assert abs(frames - meta["duration"] * SAMPLE_RATE) < 1 and expected[k] == int(
                np.ceil(meta["duration"] * FPS - 1e-6))
        assert sum(expected[k] for k in batch["keys"]) <= BUDGET or len(batch["keys"]) == 1
        n += 1
    assert n == len(ds)
