"""Elastic resume of StreamingBatches: the rest of an epoch saved at one world
size is planned window by window for another; every sample once, equal
steps, deterministic; through StatefulDataLoader with workers too."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.epoch.sample_loop import plain_inputs, plan_windows
from streambatch.epoch.windows import WindowConfig
from streambatch.streaming import StreamingBatches
from streambatch.streaming.shards.sources import Source
from tests.support.helpers import check_resizes, examples

SIZES = [31, 27, 0, 40, 22, 35, 29, 18, 33]
BUDGET, CAP = 400, 4


@pytest.fixture(scope="module")
def corpus(make_corpus):
    a = make_corpus(SIZES, seed=13, name="elastic")
    o = make_corpus([12, 9], seed=5, prefix="o", name="elastic-o")
    return a.brace, sorted(a.expected), o.brace, sorted(o.expected)


def make(src, rank, world, **kw):
    kw.setdefault("window_samples", 60)
    return StreamingBatches(src, BUDGET, CAP, rank=rank, world_size=world, **kw)


def keys(batch):
    return [s["__key__"] for s in batch]


def run(src, world, state=None, steps=None, epoch=1, **kw):
    """Every rank of a world in this process: resume from ``state`` (else start
    the epoch), take ``steps`` batches (default: all); rank 0's state after."""
    out, states = [], []
    for r in range(world):
        ds = make(src, r, world, **kw)
        ds.set_epoch(epoch)
        if state is not None:
            ds.load_state_dict(state)
        it = iter(ds)
        out.append([keys(b) for _, b in zip(range(steps if steps is not None else 10**9), it)])
        states.append(ds.state_dict())
    assert all(s == states[0] for s in states)  # rank-independent
    return out, len(ds), states[0]


SLOW = pytest.mark.slow  # the fast tier runs one plain and one mixed case


@pytest.mark.parametrize("w0, w1, frac, mixed", [
    (4, 3, 0.4, False), (8, 5, 0.25, True),
    pytest.param(2, 4, 0.6, False, marks=SLOW), pytest.param(8, 5, 0.25, False, marks=SLOW),
    pytest.param(4, 3, 0.4, True, marks=SLOW), pytest.param(2, 4, 0.6, True, marks=SLOW),
])
def test_resume_on_another_world_size(corpus, w0, w1, frac, mixed):
    src = [Source(corpus[0], weight=0.7), Source(corpus[2], weight=0.3)] if mixed else corpus[0]
    full, n0, _ = run(src, w0)
    k = int(frac * n0)
    head, _, state = run(src, w0, steps=k)
    tail, n1, end = run(src, w1, state)
    assert tail == run(src, w1, state)[0]  # deterministic
    assert len({len(t) for t in tail}) == 1 and n1 == k + len(tail[0])
    assert end["segments"] == [[w0, k]] and end["step"] == n1
    got = collections.Counter(x for part in (head, tail) for rank in part for b in rank for x in b)
    ref = collections.Counter(x for rank in full for b in rank for x in b)  # the epoch at w0, uninterrupted
    assert set(got) == set(ref)
    assert sum((got - ref).values()) <= w1 - 1 and sum((ref - got).values()) <= w0 - 1  # final-step padding only
    if not mixed:
        assert set(got) == set(corpus[1])


def test_resize_twice_and_back(corpus):
    _, n, _ = run(corpus[0], 4)
    a, _, s1 = run(corpus[0], 4, steps=n // 4)
    b, _, s2 = run(corpus[0], 2, s1, steps=7)
    c, _, s3 = run(corpus[0], 2, s2, steps=3)  # same world: exact resume
    d, _, s4 = run(corpus[0], 4, s3)
    assert s4["segments"] == [[4, n // 4], [2, 10]]
    got = collections.Counter(x for part in (a, b, c, d) for rank in part for bt in rank for x in bt)
    assert set(got) == set(corpus[1]) and sum(got.values()) - len(corpus[1]) <= 3
    ds = make(corpus[0], 0, 4)
    ds.load_state_dict(s3)
    with pytest.raises(ValueError, match="start must be"):
        ds.set_start_batch(n // 4)  # before this world's first step
    ds.set_epoch(2)  # the next epoch is an ordinary one
    assert len(ds) == make(corpus[0], 0, 4).epoch_summary(2).steps and "segments" not in ds.state_dict()


def trained(windows, lo: int, hi: int) -> list[tuple[int, int]]:
    """(shard, index) of every sample the windows train in epoch steps [lo, hi)."""
    out = []
    for w in windows:
        assert (w.plan.batch_sizes() >= 1).all()  # equal steps: every rank has a batch in every step
        for s in range(w.num_steps):
            if lo <= w.first_step + s < hi:
                for r in range(w.plan.world_size):
                    i = w.plan.batch(s, r)
                    out += list(zip(w.shard_ids[i].tolist(), w.local[i].tolist()))
    return out


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=10), st.lists(st.tuples(st.integers(1, 6), st.floats(0, 1)),
       max_size=3), st.integers(1, 6), st.sampled_from(["greedy", "bucketed"]), st.booleans(),
       st.sampled_from([None, 600]), st.integers(0, 2**20))
def test_window_segments_train_every_sample_once(counts, history, world, planner, drop_last, max_length, seed):
    rng = np.random.default_rng(seed)
    lens = {s: np.ceil(np.exp(rng.normal(5, 0.9, c))).astype(np.int64) for s, c in enumerate(counts)}
    counts = np.array(counts, dtype=np.int64)

    def windows(w, segments):
        cfg = WindowConfig(3000, 8, w, 50, True, drop_last, seed, planner, (), "sample", max_length)
        return list(plan_windows(plain_inputs(counts, lens.__getitem__, cfg, 1), cfg, 1, segments))

    check_resizes(windows, trained, history, world, lens, drop_last, max_length)


@pytest.mark.parametrize("history, world", [([(16, 0.4)], 4), ([(4, 0.3)], 16), ([(12, 0.5), (3, 0.2)], 24)])
def test_default_windows_follow_the_world_and_resume_once(history, world):
    """The default window_samples grows with W (2,500 per rank above 8): an epoch resumed at another world
    keeps its first world's windows (the steps replayed are the ones trained), every sample once."""
    from streambatch.epoch.read_modes import READ_MODES

    mode = READ_MODES["sample"]
    assert (mode.default_window(4), mode.default_window(16)) == (20_000, 40_000)
    rng = np.random.default_rng(3)
    counts = np.full(30, 1_000, dtype=np.int64)  # 30,000 samples: one window at W = 16, two at W = 4
    lens = {s: np.ceil(np.exp(rng.normal(5, 0.9, 1_000))).astype(np.int64) for s in range(30)}

    def windows(w, segments):
        cfg = WindowConfig(3000, 8, w, mode.default_window(w), True, False, 5, "bucketed", (), "sample", None)
        return list(mode.plain(counts, lens.__getitem__, cfg, 1, segments, mode.default_window))

    check_resizes(windows, trained, history, world, lens, False, None)


def test_default_window_state_loads_at_another_world(corpus):
    # as shard mode's: a state saved at W = 16 (40,000-sample windows) loads at W = 8 (20,000), compared and
    # replayed at the saver's window size; a window size the user gave is a setting, refused when it differs
    big = StreamingBatches(corpus[0], BUDGET, CAP, rank=0, world_size=16, read_mode="sample")
    assert big.config.window_samples == 40_000 and big.config_at(8).window_samples == 20_000
    big.set_epoch(1)
    big.set_start_batch(1)
    small = StreamingBatches(corpus[0], BUDGET, CAP, rank=0, world_size=8, read_mode="sample")
    small.load_state_dict(big.state_dict())
    assert small.state_dict()["segments"] == [[16, 1]]
    fixed = StreamingBatches(corpus[0], BUDGET, CAP, rank=0, world_size=8, read_mode="sample", window_samples=20_000)
    with pytest.raises(ValueError, match="window_samples"):
        fixed.load_state_dict(big.state_dict())


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("restore_loader", [False, True])
def test_stateful_dataloader_workers(corpus, restore_loader):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def collate(batch):
        return [s["__key__"] for s in batch]

    def loader(ds):
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    heads, states = [], []
    for r in range(4):
        ds = make(corpus[0], r, 4, collate_fn=collate)
        ds.set_epoch(1)
        dl = loader(ds)
        it = iter(dl)
        heads.append([next(it) for _ in range(5)])
        states.append(dl.state_dict())
        del it
    tails = []
    for r in range(3):
        ds = make(corpus[0], r, 3, collate_fn=collate)
        ds.load_state_dict(states[0])  # the loader's whole state: where the world stopped
        dl = loader(ds)
        if restore_loader:
            dl.load_state_dict(states[0])
        tails.append(list(dl))
    assert len({len(t) for t in tails}) == 1
    got = collections.Counter(x for part in (heads, tails) for rank in part for b in rank for x in b)
    assert set(got) == set(corpus[1]) and sum(got.values()) - len(corpus[1]) <= 2
    if restore_loader:
        ds = make(corpus[0], 0, 3, collate_fn=collate)  # without the main-process load: a clear error
        dl = loader(ds)
        dl.load_state_dict(states[0])
        with pytest.raises(Exception, match="only the loader knows where that world stopped"):
            list(dl)
