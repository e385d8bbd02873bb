"""Shard-affine planning (read_mode="shard"): the walk kernel against a naive
twin, the cut, and the epoch invariants over random shard layouts; then
StreamingBatches on real tar shards with simulated ranks."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streambatch.streaming import StreamingBatches, index_shards
from streambatch.streaming.epoch.affinity.kernels import affine_steps, packed_affine_steps
from streambatch.streaming.epoch.affinity.plan import cut_points, plan_affine_window, water_levels
from streambatch.streaming.epoch.modes import iter_windows, summarize
from streambatch.streaming.epoch.windows import WindowConfig

from helpers import examples
from shards import FPS, write_corpus

# ------------------------------------------------------------ the walk kernel


def naive_walk(slen, starts, tokens, cap, target_rank=0):
    """The walk of ``affine_steps`` (quadratic cost, no cost cap), written out;
    ``target_rank``: the target is that cheapest of the ranks' full batches."""
    w = len(starts) - 1
    pos = list(starts[:-1])
    steps = []
    while all(pos[r] < starts[r + 1] for r in range(w)):
        fulls = []
        for r in range(w):
            e = pos[r] + 1
            while e < starts[r + 1] and e + 1 - pos[r] <= cap and (e + 1 - pos[r]) * slen[e] <= tokens:
                e += 1
            fulls.append(e)
        target = sorted((e - p) * slen[e - 1] ** 2 for p, e in zip(pos, fulls))[min(target_rank, w - 1)]
        row = []
        for r in range(w):
            costs = {e: (e - pos[r]) * slen[e - 1] ** 2 for e in range(pos[r] + 1, fulls[r] + 1)}
            below = [e for e, c in costs.items() if c <= target]
            e = max(below) if below else pos[r] + 1
            if e < fulls[r] and costs[e + 1] - target < target - costs[e]:
                e += 1
            row.append(e - pos[r])
            pos[r] = e
        steps.append(row)
    return steps, pos


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(0, 60), min_size=1, max_size=40), st.integers(50, 500),
       st.integers(1, 8), st.randoms(use_true_random=False), st.integers(0, 5))
def test_walk_matches_naive_twin(w, pool, tokens, cap, rnd, target_rank):
    sizes = [rnd.randint(0, len(pool)) for _ in range(w)]
    segs = [sorted(rnd.choice(pool) for _ in range(n)) for n in sizes]
    slen = np.array([x for s in segs for x in s], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    counts, k, pos = affine_steps(slen, starts, tokens, cap, 1, 0, np.iinfo(np.int64).max, target_rank)
    want, want_pos = naive_walk(slen.tolist(), starts.tolist(), tokens, cap, target_rank)
    assert counts[:k].tolist() == want
    assert pos.tolist() == want_pos


def naive_packed_walk(slen, starts, tokens, cap, max_cost, target_rank=0):
    """The walk of ``packed_affine_steps`` (quadratic cost): prefixes whose
    tokens and costs are sums over their samples, written out."""
    w = len(starts) - 1
    pos = list(starts[:-1])
    steps = []

    def cost(p, e):
        return sum(x * x for x in slen[p:e])

    while all(pos[r] < starts[r + 1] for r in range(w)):
        fulls = []
        for r in range(w):
            e = pos[r] + 1
            while (e < starts[r + 1] and e + 1 - pos[r] <= cap and sum(slen[pos[r] : e + 1]) <= tokens
                   and cost(pos[r], e + 1) <= max_cost):
                e += 1
            fulls.append(e)
        target = sorted(cost(p, e) for p, e in zip(pos, fulls))[min(target_rank, w - 1)]
        row = []
        for r in range(w):
            costs = {e: cost(pos[r], e) for e in range(pos[r] + 1, fulls[r] + 1)}
            below = [e for e, c in costs.items() if c <= target]
            e = max(below) if below else pos[r] + 1
            if e < fulls[r] and costs[e + 1] - target < target - costs[e]:
                e += 1
            row.append(e - pos[r])
            pos[r] = e
        steps.append(row)
    return steps, pos


@settings(max_examples=examples(100), deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(0, 60), min_size=1, max_size=40), st.integers(50, 500),
       st.integers(1, 8), st.one_of(st.just(np.iinfo(np.int64).max), st.integers(1, 20_000)),
       st.randoms(use_true_random=False), st.integers(0, 5))
def test_packed_walk_matches_naive_twin(w, pool, tokens, cap, max_cost, rnd, target_rank):
    sizes = [rnd.randint(0, len(pool)) for _ in range(w)]
    segs = [sorted(rnd.choice(pool) for _ in range(n)) for n in sizes]
    slen = np.array([x for s in segs for x in s], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    counts, k, pos = packed_affine_steps(slen, starts, tokens, cap, 1, 0, max_cost, target_rank)
    want, want_pos = naive_packed_walk(slen.tolist(), starts.tolist(), tokens, cap, max_cost, target_rank)
    assert counts[:k].tolist() == want
    assert pos.tolist() == want_pos


def test_cut_points_and_water_levels():
    rng = np.random.default_rng(0)
    weights = rng.integers(1, 100, 500)
    for carry in (np.zeros(4, np.int64), np.array([0, 3000, 0, 500]), np.array([0, 10**6, 0, 0])):
        shares = water_levels(carry, int(weights.sum()))
        assert 0 <= weights.sum() - shares.sum() < 4  # all of it, but for rounding down
        level = carry + shares
        assert np.all((shares == 0) | (level == level[shares > 0].max()))  # ranks below the level reach it
        cuts = cut_points(weights, shares)
        assert cuts[0] == 0 and cuts[-1] == weights.size and np.all(np.diff(cuts) >= 0)
        got = np.add.reduceat(np.append(weights, 0), cuts[:-1])[: len(shares)] * (np.diff(cuts) > 0)
        assert np.all(np.abs(got - shares) <= 2 * weights.max())


# ------------------------------------------------------------ epoch invariants


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


def test_packed_window_balance_and_tail():
    from streambatch import CostModel

    from helpers import lognormal_lengths

    lens = lognormal_lengths(24_000, seed=5)
    none = np.zeros(0, np.int64)
    aw = plan_affine_window(none, none, lens, 16_000, 64, 8, True, False, False, 1, {"pack": True})
    plan = aw.plan
    sizes = np.diff(plan.offsets)
    real = np.add.reduceat(lens[plan.samples], plan.offsets[:-1])
    assert np.all((real <= 16_000) | (sizes == 1))
    padded = sizes * np.maximum.reduceat(lens[plan.samples], plan.offsets[:-1])
    assert np.any((padded > 16_000) & (sizes > 1))  # batches the padded rule would refuse: packing is in use
    cost = CostModel.quadratic().packed_cost(lens[plan.samples], plan.offsets).reshape(-1, 8)
    assert np.mean(cost.sum(1) / (8 * cost.max(1))) >= 0.98
    assert len(aw.leftover) < 8 * 64  # ranks run out together: about one batch left per rank at most


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


def test_balance_on_audio_like_lengths():
    from helpers import lognormal_lengths

    lens = lognormal_lengths(24_000, seed=5)
    none = np.zeros(0, np.int64)
    aw = plan_affine_window(none, none, lens, 16_000, 64, 8, True, False, False, 1, {})
    plan = aw.plan
    sizes = np.diff(plan.offsets)
    longest = np.maximum.reduceat(lens[plan.samples], plan.offsets[:-1])
    cost = (sizes * longest.astype(float) ** 2).reshape(-1, 8)
    assert np.mean(cost.sum(1) / (8 * cost.max(1))) >= 0.95
    assert len(aw.leftover) < 8 * 64  # ranks run out together: about one batch left per rank at most


# ------------------------------------------------------------ through StreamingBatches

SIZES = [37, 23, 41, 0, 29, 35, 18, 44, 31, 26, 39, 22, 30, 27]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("affine")
    brace, paths, expected = write_corpus(d, SIZES, seed=11)
    index_shards(brace, frames_per_second=FPS, workers=1, progress=False)
    return brace, paths, expected


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
