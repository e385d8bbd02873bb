"""Elastic resume in read_mode="shard": the window a resize interrupts is
finished in sample mode at the new world size, later windows are
shard-affine at it. Every sample once (but the final step's padding or
drop), equal steps, deterministic, reads covering what each rank trains;
then StreamingBatches on real tar shards with simulated ranks."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.epoch.shard_loop import affine_windows
from streambatch.epoch.windows import WindowConfig
from streambatch.streaming import StreamingBatches, index_shards
from tests.support.helpers import check_resizes, examples
from tests.support.shards import FPS

# ------------------------------------------------------------ the plan layer


def trained(windows, lo: int, hi: int) -> list[tuple[int, int]]:
    """(shard, index) of every sample the windows train in epoch steps [lo, hi);
    checks that each rank has a batch in every step and that each trained
    sample was read by its rank: in a row of this window, or of an earlier
    window of the same world (a carried sample stays with its holder)."""
    out = []
    memory: set = set()  # (rank, shard, index) read by this world so far
    prev_world = -1
    for w in windows:
        assert (w.plan.batch_sizes() >= 1).all()  # equal steps: every rank has a batch in every step
        world = w.plan.world_size
        rows = {(r, s, j) for r, s, a, b in w.reads.tolist() for j in range(a, b)}
        memory = rows | (memory if world == prev_world else set())
        readable = memory
        for s in range(w.num_steps):
            if lo <= w.first_step + s < hi:
                for r in range(world):
                    i = w.plan.batch(s, r)
                    keys = list(zip(w.shard_ids[i].tolist(), w.local[i].tolist()))
                    assert all((r, *k) in readable for k in keys), "a rank trains a sample it never read"
                    out += keys
        prev_world = world
    return out


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=14), st.lists(st.tuples(st.integers(1, 6), st.floats(0, 1)),
       max_size=3), st.integers(1, 6), st.booleans(), st.sampled_from([None, 600]), st.booleans(),
       st.integers(0, 2**20))
def test_shard_segments_train_every_sample_once(counts, history, world, drop_last, max_length, outliers, seed):
    if sum(counts) == 0:
        return  # StreamingBatches refuses a corpus without samples
    rng = np.random.default_rng(seed)
    lens = {s: rng.integers(1, 120, c) for s, c in enumerate(counts)}
    if outliers:  # pooled outliers, some over max_length
        for x in lens.values():
            x[rng.random(x.size) < 0.05] = rng.integers(130, 900)
    counts = np.array(counts, dtype=np.int64)

    def windows(w, segments):
        cfg = WindowConfig(600, 12, w, 40, True, drop_last, seed, "greedy", (), "shard", max_length)
        return list(affine_windows(counts, lens.__getitem__, cfg, 1, segments))

    check_resizes(windows, trained, history, world, lens, drop_last, max_length)


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=14), st.lists(st.tuples(st.integers(1, 6), st.floats(0, 1)),
       max_size=3), st.integers(1, 6), st.booleans(), st.sampled_from([None, 600]), st.booleans(),
       st.integers(0, 2**20))
def test_packed_shard_segments_train_every_sample_once(counts, history, world, drop_last, max_length, outliers, seed):
    # packed batches (pack=True): the same resizes, and every batch of every piece within sum(L) <= budget
    if sum(counts) == 0:
        return
    rng = np.random.default_rng(seed)
    lens = {s: rng.integers(1, 120, c) for s, c in enumerate(counts)}
    if outliers:
        for x in lens.values():
            x[rng.random(x.size) < 0.05] = rng.integers(130, 900)
    counts = np.array(counts, dtype=np.int64)

    def windows(w, segments):
        cfg = WindowConfig(600, 12, w, 40, True, drop_last, seed, "bucketed", (("pack", True),), "shard", max_length)
        out = list(affine_windows(counts, lens.__getitem__, cfg, 1, segments))
        for win in out:
            for s in range(win.num_steps):
                for r in range(win.plan.world_size):
                    b = win.plan.batch(s, r)
                    total = sum(int(lens[int(win.shard_ids[i])][int(win.local[i])]) for i in b)
                    assert len(b) == 1 or total <= 600
        return out

    check_resizes(windows, trained, history, world, lens, drop_last, max_length)


def test_no_segments_is_iter_windows():
    from streambatch.epoch.read_modes import iter_windows

    rng = np.random.default_rng(4)
    counts = rng.integers(10, 40, 20)
    lens = [rng.integers(5, 200, n) for n in counts]
    cfg = WindowConfig(1500, 12, 4, 100, True, False, 3, "greedy", (), "shard")
    a = list(iter_windows(counts, lens.__getitem__, cfg, 2))
    b = list(affine_windows(counts, lens.__getitem__, cfg, 2, ((4, 0),)))  # an empty segment changes nothing
    assert [(x.plan.fingerprint(), x.reads.tobytes()) for x in a] == [(x.plan.fingerprint(), x.reads.tobytes())
                                                                     for x in b]


# ------------------------------------------------------------ through StreamingBatches

SIZES = [21, 17, 0, 25, 19, 23, 14, 22, 18, 20, 16, 24, 15, 21, 19, 13]
BUDGET, CAP = 400, 4


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=17, name="eshard")
    return c.brace, c.expected


def make(src, rank, world, **kw):
    kw.setdefault("window_samples", 60)
    return StreamingBatches(src, BUDGET, CAP, rank=rank, world_size=world, read_mode="shard", **kw)


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


def boundary(corpus, world, **kw):
    """An epoch step of ``world`` on a window boundary (not the first)."""
    ds = make(corpus[0], 0, world, **kw)
    starts = [w.first_step for w in ds.plan.windows(1)]
    assert len(starts) >= 2
    return starts[len(starts) // 2]


SLOW = pytest.mark.slow


@pytest.mark.parametrize("w0, w1, frac, kw", [
    (4, 3, 0.4, {}), (2, 4, 0.6, {"drop_last": True}), (8, 5, "boundary", {"max_length": 450}),
    pytest.param(4, 3, "boundary", {"drop_last": True}, marks=SLOW),
    pytest.param(2, 4, 0.6, {}, marks=SLOW), pytest.param(8, 5, 0.25, {"drop_last": True}, marks=SLOW),
    pytest.param(4, 3, 0.75, {"max_length": 450, "drop_last": True}, marks=SLOW),
    pytest.param(3, 3, 0.5, {}, marks=SLOW),
])
def test_shard_mode_resume_on_another_world_size(corpus, w0, w1, frac, kw):
    src, expected = corpus
    full, n0, _ = run(src, w0, **kw)
    k = boundary(corpus, w0, **kw) if frac == "boundary" else int(frac * n0)
    head, _, state = run(src, w0, steps=k, **kw)
    tail, n1, end = run(src, w1, state, **kw)
    assert tail == run(src, w1, state, **kw)[0]  # deterministic
    assert len({len(t) for t in tail}) == 1 and n1 == k + len(tail[0])  # equal steps
    assert end["step"] == n1
    got = collections.Counter(x for part in (head, tail) for rank in part for b in rank for x in b)
    ref = collections.Counter(x for rank in full for b in rank for x in b)  # the epoch at w0, uninterrupted
    if w0 == w1:  # same world: today's exact resume
        assert "segments" not in end and [h + t for h, t in zip(head, tail)] == full
        return
    assert end["segments"] == [[w0, k]]
    ds = make(src, 0, w1, **kw)
    ds.load_state_dict(state)
    summary = ds.epoch_summary(1)
    wanted = {key for key, v in expected.items() if "max_length" not in kw or v <= kw["max_length"]}
    assert set(got) <= wanted
    assert len(wanted - set(got)) == summary.dropped
    if not kw.get("drop_last"):
        assert set(got) == set(ref) == wanted
    assert sum(got.values()) - len(got) <= (w0 - 1) + (w1 - 1)  # final-step padding only
    ds.set_epoch(2)  # the next epoch is an ordinary shard-mode epoch at the new world size
    assert len(ds) == make(src, 0, w1, **kw).epoch_summary(2).steps and "segments" not in ds.state_dict()


def test_shard_mode_resize_twice(corpus):
    src, expected = corpus
    _, n, _ = run(src, 4)
    a, _, s1 = run(src, 4, steps=n // 4)
    b, _, s2 = run(src, 2, s1, steps=9)
    c, _, s3 = run(src, 5, s2)
    assert s3["segments"] == [[4, n // 4], [2, 9]]
    got = collections.Counter(x for part in (a, b, c) for rank in part for bt in rank for x in bt)
    assert set(got) == set(expected) and sum(got.values()) - len(expected) <= 3 + 1 + 4


def test_default_window_follows_world_size(corpus):
    # shard mode's default window_samples grows with W (2,500 per rank above 8): a state saved at
    # W = 16 still loads at W = 8, its windows replayed with the saver's window size
    src, expected = corpus
    big = StreamingBatches(src, BUDGET, CAP, rank=0, world_size=16, read_mode="shard")
    assert big.config.window_samples == 40_000 and big.config_at(8).window_samples == 20_000
    big.set_epoch(1)
    big.set_start_batch(2)
    small = StreamingBatches(src, BUDGET, CAP, rank=0, world_size=8, read_mode="shard")
    small.load_state_dict(big.state_dict())
    assert small.state_dict()["segments"] == [[16, 2]]
    fixed = StreamingBatches(src, BUDGET, CAP, rank=0, world_size=8, read_mode="shard", window_samples=20_000)
    with pytest.raises(ValueError, match="window_samples"):  # a window size given by the user is a setting
        fixed.load_state_dict(big.state_dict())


def test_remote_resume_reads_like_local(corpus, tmp_path):
    # pipe: shards go through the remote reader (cache, pieces): the replanned window and the
    # fetched carry read the same samples as local files
    import glob

    src, _ = corpus
    pipes = [f"pipe:cat {p}" for p in sorted(glob.glob(src.split("{")[0] + "*.tar"))]
    idx = str(tmp_path / "idx")
    index_shards(pipes, frames_per_second=FPS, index_dir=idx, workers=1, progress=False)
    _, n, _ = run(src, 4)
    _, _, state = run(src, 4, steps=n // 3)
    local, _, _ = run(src, 3, state)
    _, _, remote_state = run(pipes, 4, steps=n // 3, index_dir=idx)
    assert remote_state["step"] == state["step"]
    remote, _, _ = run(pipes, 3, remote_state, index_dir=idx)
    assert remote == local
