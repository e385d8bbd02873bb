"""Shard read mode's epochs (``epoch/shard_loop.py``, the shard-affine planner window by window): the epoch
invariants over random shard layouts, then StreamingBatches on real tar shards with simulated ranks."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.epoch.read_modes import iter_windows
from streambatch.epoch.windows import WindowConfig, summarize
from streambatch.streaming import StreamingBatches, index_shards
from tests.support.helpers import examples
from tests.support.shards import FPS


def check_epoch(counts, lengths, config, epoch):
    """Every invariant of one shard-mode epoch; returns (trained, windows)."""
    w = config.world_size
    packed = bool(config.options.get("pack"))  # the budget counts the sum of a batch's lengths, not B x longest
    trained = collections.Counter()
    streamed = collections.Counter()  # (shard, local) -> number of ranks streaming it in a piece
    carried_from: dict[tuple[int, int], int] = {}
    windows = list(iter_windows(counts, lambda s: lengths[s], config, epoch))
    step = 0
    for win in windows:
        plan = win.plan
        assert win.first_step == step
        step += plan.num_steps
        sizes = np.diff(plan.offsets).reshape(-1, w)
        assert (sizes > 0).all()  # every step: one non-empty batch per rank
        keys = list(zip(win.shard_ids.tolist(), win.local.tolist()))
        for s in range(plan.num_steps):
            for r in range(w):
                b = plan.batch(s, r)
                lens = np.array([lengths[win.shard_ids[i]][win.local[i]] for i in b])
                assert len(b) <= config.max_batch_size
                used = lens.sum() if packed else len(b) * lens.max()
                assert len(b) == 1 or used <= config.max_batch_tokens
        # carried samples keep the rank that held them
        for i in range(win.n_carried):
            assert carried_from.pop(keys[i]) == win.holder[i]
        assert not carried_from
        # reads: each new sample is in exactly one piece, of its holder; others only as one-sample fetches
        rows = win.reads.tolist()
        covered = collections.Counter()
        for r, sh, lo, hi in rows:
            for j in range(lo, hi):
                covered[(r, sh, j)] += 1
        pieces = [row for row in rows if row[3] - row[2] > 1 or (row[0], row[1], row[2]) in
                  {(int(win.holder[i]), *keys[i]) for i in range(win.n_carried, len(keys))}]
        assert len({(sh, lo, hi) for _, sh, lo, hi in rows}) <= len(set(win.shard_ids.tolist())) + w - 1 + len(
            [row for row in rows if row not in pieces])
        for i in range(win.n_carried, len(keys)):
            assert covered[(int(win.holder[i]), *keys[i])] >= 1
            streamed[keys[i]] += 1
        rank_of = np.repeat(np.arange(sizes.size) % w, sizes.ravel())
        for r, i in zip(rank_of.tolist(), plan.samples.tolist()):
            trained[keys[i]] += 1
            if win.holder[i] != r:
                assert covered[(r, *keys[i])] >= 1, "a rank trains on a sample it neither streams nor fetches"
        if not win.last:
            for i in plan.leftover.tolist():
                carried_from[keys[i]] = int(win.holder[i])
    everything = {(s, j) for s in range(len(counts)) for j in range(counts[s])}
    assert set(streamed) == everything and set(streamed.values()) <= {1}  # each sample streamed once per epoch
    last = windows[-1].plan
    missing = everything - set(trained)
    assert len(missing) == last.num_dropped
    assert sum(trained.values()) - len(trained) == last.num_padded
    summary = summarize(counts, lambda s: lengths[s], config, epoch)
    assert summary.steps == step and summary.samples == len(everything) - last.num_dropped
    assert not config.drop_last or last.num_padded == 0
    return trained, windows


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(0, 50), min_size=1, max_size=25), st.integers(10, 120),
       st.booleans(), st.integers(0, 3), st.integers(0, 2**31), st.booleans())
def test_shard_mode_epoch_invariants(w, shard_sizes, window, drop_last, epoch, seed, outliers):
    rng = np.random.default_rng(seed)
    tokens, cap = 600, 12
    lengths = [rng.integers(1, 120, n) for n in shard_sizes]
    if outliers:  # some samples a batch can hold at most 4 of (pooled), some over the budget
        for x in lengths:
            x[rng.random(x.size) < 0.05] = rng.integers(130, 900)
    counts = np.array(shard_sizes, dtype=np.int64)
    if counts.sum() == 0:
        return
    config = WindowConfig(tokens, cap, w, window, True, drop_last, seed, "greedy", (), "shard")
    check_epoch(counts, lengths, config, epoch)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(0, 50), min_size=1, max_size=25), st.integers(10, 120),
       st.booleans(), st.integers(0, 3), st.integers(0, 2**31), st.booleans())
def test_packed_shard_mode_epoch_invariants(w, shard_sizes, window, drop_last, epoch, seed, outliers):
    rng = np.random.default_rng(seed)
    tokens, cap = 600, 12
    lengths = [rng.integers(1, 120, n) for n in shard_sizes]
    if outliers:  # some samples a batch can hold at most 4 of (pooled), some over the budget
        for x in lengths:
            x[rng.random(x.size) < 0.05] = rng.integers(130, 900)
    counts = np.array(shard_sizes, dtype=np.int64)
    if counts.sum() == 0:
        return
    config = WindowConfig(tokens, cap, w, window, True, drop_last, seed, "bucketed", (("pack", True),), "shard")
    check_epoch(counts, lengths, config, epoch)


def test_deterministic_and_epochs_differ():
    rng = np.random.default_rng(3)
    counts = rng.integers(20, 60, 30)
    lengths = [rng.integers(10, 300, n) for n in counts]
    config = WindowConfig(2000, 16, 4, 200, True, False, 7, "greedy", (), "shard")

    def fingerprints(epoch):
        return [(w.plan.fingerprint(), w.reads.tobytes(), w.holder.tobytes())
                for w in iter_windows(counts, lambda s: lengths[s], config, epoch)]

    assert fingerprints(1) == fingerprints(1)
    assert fingerprints(1) != fingerprints(2)
    # the windows really are shard-affine, and the plan differs from sample mode's
    trained, windows = check_epoch(counts, lengths, config, 1)
    assert all(len({s for r, s, lo, hi in w.reads.tolist() if hi - lo > 1}) >= 4 for w in windows)


def test_empty_rank_and_tiny_epochs_still_give_equal_steps():
    # fewer samples than ranks, and windows where a rank gets nothing: everything lands in the final window
    for counts in ([1], [0, 2, 0], [3, 1], [5] * 3):
        counts = np.array(counts, dtype=np.int64)
        lengths = [np.full(c, 50, dtype=np.int64) for c in counts]
        for drop_last in (False, True):
            config = WindowConfig(400, 8, 4, 1, True, drop_last, 0, "greedy", (), "shard")
            check_epoch(counts, lengths, config, 0)


# ------------------------------------------------------------ through StreamingBatches

SIZES = [37, 23, 41, 0, 29, 35, 18, 44, 31, 26, 39, 22, 30, 27]


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=11, name="affine")
    return c.brace, c.paths, c.expected


@pytest.mark.parametrize("world", [2, 4])
def test_streaming_shard_mode_exactly_once_and_own_pieces(corpus, world):
    brace, paths, expected = corpus
    per_rank, touched = [], []
    for r in range(world):
        ds = StreamingBatches(brace, 400, 12, rank=r, world_size=world, read_mode="shard", window_samples=120)
        assert ds.config.read_mode == "shard"
        ds.set_epoch(1)
        batches = list(ds)
        assert len(batches) == len(ds)
        per_rank.append(batches)
        touched.append(ds.bytes_read)
        # what this rank may read, from the plan: its pieces and one-sample fetches
        cat = ds.catalog
        allowed = set()
        for win in iter_windows(cat.counts, cat.lengths, ds.config, 1):
            for rr, s, lo, hi in win.reads.tolist():
                if rr == r:
                    keys = cat.table(s)[0]
                    allowed |= {keys[j].decode() for j in range(lo, hi)}
            for i in range(win.n_carried):  # carried in: read by this rank in an earlier window
                if win.holder[i] == r:
                    allowed.add(cat.table(int(win.shard_ids[i]))[0][win.local[i]].decode())
        mine = [s["__key__"] for b in batches for s in b]
        assert set(mine) <= allowed
        # a rank reads exactly the samples it yields (offset reads), nothing of other ranks' pieces
        sizes = {}
        for s in range(len(cat.urls)):
            keys, _, sz = cat.table(s)
            sizes.update({k.decode(): int(v) for k, v in zip(keys, sz)})
        assert ds.bytes_read == sum(sizes[k] for k in mine)
    assert len({len(b) for b in per_rank}) == 1
    counts = collections.Counter(s["__key__"] for b in per_rank for x in b for s in x)
    assert set(counts) == set(expected)
    assert sum(counts.values()) - len(expected) == ds.epoch_summary(1).padded < world
    # pieces of different ranks do not overlap: the shares of bytes add up to one epoch's bytes
    assert sum(touched) - sum(sizes.values()) == sum(sizes[k] * (c - 1) for k, c in counts.items())


def test_read_mode_default_and_validation(corpus, tmp_path):
    brace, paths, _ = corpus
    assert StreamingBatches(brace, 400, 12, rank=0, world_size=2).config.read_mode == "sample"
    with pytest.raises(ValueError, match="read_mode must be one of"):
        StreamingBatches(brace, 400, 12, rank=0, world_size=2, read_mode="shards")
    ds = StreamingBatches(brace, 400, 12, rank=0, world_size=2, read_mode="shard")
    assert ds.config.window_samples == 20_000
    assert StreamingBatches(brace, 400, 12, rank=0, world_size=16, read_mode="shard").config.window_samples == 40_000
    assert ds.fingerprint != StreamingBatches(brace, 400, 12, rank=0, world_size=2).fingerprint
    pipes = [f"pipe:cat {p}" for p in paths]
    idx = str(tmp_path / "idx")
    index_shards(pipes, frames_per_second=FPS, index_dir=idx, workers=1, progress=False)
    remote = StreamingBatches(pipes, 400, 12, rank=1, world_size=2, index_dir=idx, window_samples=120)
    assert remote.config.read_mode == "shard"
    local = StreamingBatches(brace, 400, 12, rank=1, world_size=2, read_mode="shard", window_samples=120)
    got = [[s["__key__"] for s in b] for b in remote]
    assert got == [[s["__key__"] for s in b] for b in local]
