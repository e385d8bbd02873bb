"""Positions that cannot be lost (issue 32, item 5), and the resume guide's three paths, end to end.

A ``StreamingBatches.state_dict()`` taken in the main process after plain DataLoader workers ran the epoch's pass
cannot know the position (the workers hold it): it returned ``step: 0`` without a word, and resuming from it
trained the batches already trained again. It now warns (RuntimeWarning, as the sampler does when a loader
prefetches from it), naming the three ways that work (``docs/guide/resume.md``):

1. torchdata's ``StatefulDataLoader``: save ``loader.state_dict()``;
2. a plain ``DataLoader`` with workers: save your own step count, resume with ``set_epoch`` + ``set_start_batch``;
3. no workers (``num_workers=0``): the object's own ``state_dict()`` is exact.

Each path is run for the map-style sampler and for the streaming dataset: train 5 steps, save, rebuild everything
(a restart), resume, and the two runs together must be one uninterrupted epoch, batch for batch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from streambatch import DynamicBatchSampler, StreamingBatches
from tests.support.helpers import lognormal_lengths

STOP = 5
LENGTHS = lognormal_lengths(400, seed=4)


class Indices(Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        return int(i)


def keys(batch) -> list[str]:
    return [s["__key__"] for s in batch]


@pytest.fixture(scope="module")
def pattern(make_corpus):
    return make_corpus([40, 35, 45, 30], seed=7, name="resume").brace


def dataset(pattern):
    return StreamingBatches(pattern, 300, 8, window_samples=60)


def sampler():
    return DynamicBatchSampler(LENGTHS, 4000, 16, planner="bucketed")


def loader_kw(workers: int) -> dict:
    return {"num_workers": workers, "multiprocessing_context": "fork"} if workers else {"num_workers": 0}


# ---------------------------------------------------------------- a position that cannot be known


def test_main_process_state_after_a_workers_pass_warns_naming_the_fix(pattern):
    ds = dataset(pattern)
    ds.set_epoch(0)
    loader = DataLoader(ds, batch_size=None, **loader_kw(2))
    for step, _ in enumerate(loader, 1):
        if step == STOP:
            break
    with pytest.warns(RuntimeWarning, match=r"StatefulDataLoader.*set_start_batch.*num_workers=0") as said:
        ds.state_dict()
    assert len(said) == 1 and "epoch 0" in str(said[0].message)
    del loader
    ds.set_epoch(1)  # the next epoch's start is known again: its pass has not begun
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert (ds.state_dict()["epoch"], ds.state_dict()["step"]) == (1, 0)


def test_main_process_state_after_a_whole_epoch_by_workers_warns_too(pattern):
    ds = dataset(pattern)
    ds.set_epoch(0)
    assert sum(1 for _ in DataLoader(ds, batch_size=None, **loader_kw(2))) == len(ds)
    with pytest.warns(RuntimeWarning, match="set_epoch"):
        ds.state_dict()  # it says step 0 of epoch 0: the whole epoch again on resume
    ds.set_start_batch(3)  # a position set in the main process is known
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert ds.state_dict()["step"] == 3


# ---------------------------------------------------------------- the three paths


def reference_streaming(pattern) -> list[list[str]]:
    ds = dataset(pattern)
    ds.set_epoch(0)
    return [keys(b) for b in ds]


def reference_sampler() -> list[list[int]]:
    s = sampler()
    s.set_epoch(0)
    return [list(b) for b in s]


@pytest.mark.parametrize("kind", ["streaming", "sampler"])
def test_path_1_stateful_dataloader(pattern, kind):
    want = reference_streaming(pattern) if kind == "streaming" else reference_sampler()
    got = []
    if kind == "streaming":
        ds = dataset(pattern)
        ds.set_epoch(0)
        loader = StatefulDataLoader(ds, batch_size=None, **loader_kw(2))
    else:
        s = sampler()
        s.set_epoch(0)
        loader = StatefulDataLoader(Indices(), batch_sampler=s, collate_fn=list, **loader_kw(2))
    for step, batch in enumerate(loader, 1):
        got.append(keys(batch) if kind == "streaming" else batch)
        if step == STOP:
            checkpoint = {"epoch": 0, "loader": loader.state_dict()}
            break
    del loader
    # a restart: everything built anew
    if kind == "streaming":
        ds = dataset(pattern)
        ds.set_epoch(checkpoint["epoch"])
        ds.load_state_dict(checkpoint["loader"])  # the main process learns where the workers stopped
        loader = StatefulDataLoader(ds, batch_size=None, **loader_kw(2))
        got += [keys(b) for b in loader]
    else:
        s = sampler()
        s.set_epoch(checkpoint["epoch"])
        loader = StatefulDataLoader(Indices(), batch_sampler=s, collate_fn=list, **loader_kw(2))
        loader.load_state_dict(checkpoint["loader"])
        got += [b for b in loader]
    assert got == want


@pytest.mark.parametrize("kind", ["streaming", "sampler"])
def test_path_2_own_step_count_and_set_start_batch(pattern, kind):
    want = reference_streaming(pattern) if kind == "streaming" else reference_sampler()
    obj = dataset(pattern) if kind == "streaming" else sampler()
    obj.set_epoch(0)
    loader = (DataLoader(obj, batch_size=None, **loader_kw(2)) if kind == "streaming" else
              DataLoader(Indices(), batch_sampler=obj, collate_fn=list, **loader_kw(2)))
    got = []
    for step, batch in enumerate(loader, 1):
        got.append(keys(batch) if kind == "streaming" else batch)
        if step == STOP:
            checkpoint = {"epoch": 0, "step": step}
            break
    del loader
    obj = dataset(pattern) if kind == "streaming" else sampler()
    obj.set_epoch(checkpoint["epoch"])
    obj.set_start_batch(checkpoint["step"])
    loader = (DataLoader(obj, batch_size=None, **loader_kw(2)) if kind == "streaming" else
              DataLoader(Indices(), batch_sampler=obj, collate_fn=list, **loader_kw(2)))
    got += [keys(b) if kind == "streaming" else b for b in loader]
    assert got == want


@pytest.mark.parametrize("kind", ["streaming", "sampler"])
def test_path_3_no_workers_and_the_objects_own_state(pattern, kind):
    want = reference_streaming(pattern) if kind == "streaming" else reference_sampler()
    obj = dataset(pattern) if kind == "streaming" else sampler()
    obj.set_epoch(0)
    loader = (DataLoader(obj, batch_size=None) if kind == "streaming" else
              DataLoader(Indices(), batch_sampler=obj, collate_fn=list))
    got = []
    for step, batch in enumerate(loader, 1):
        got.append(keys(batch) if kind == "streaming" else batch)
        if step == STOP:
            checkpoint = obj.state_dict()
            break
    assert checkpoint["step"] == STOP
    obj = dataset(pattern) if kind == "streaming" else sampler()
    obj.load_state_dict(checkpoint)
    loader = (DataLoader(obj, batch_size=None) if kind == "streaming" else
              DataLoader(Indices(), batch_sampler=obj, collate_fn=list))
    got += [keys(b) if kind == "streaming" else b for b in loader]
    assert got == want
    assert len({k for b in got for k in b}) == (sum(map(len, got)) if kind == "streaming" else len(LENGTHS))
    assert np.array_equal(np.sort([k for b in got for k in b]), np.sort([k for b in want for k in b]))
