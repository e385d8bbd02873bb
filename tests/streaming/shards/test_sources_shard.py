"""Mixed sources in read_mode="shard": each window takes its share of every
source's quota (possibly ending inside a shard) and is cut into W
shard-affine pieces. Quotas, every sample once per cycle, equal steps,
determinism, state round-trips and elastic resume, on real tar shards with
simulated ranks; each rank trains only samples it streamed (or fetched)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from streambatch.epoch.mixed_windows import source_of_shards
from streambatch.streaming import StreamingBatches, index_shards
from streambatch.streaming.shards.sources import Source
from tests.support.corpus import index_corpus
from tests.support.roundtrip import check_state_roundtrip
from tests.support.shards import FPS, write_corpus

BUDGET, CAP = 400, 6


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixshard")
    a, _, ka = write_corpus(d / "a", [30, 25, 0, 35, 20, 28, 31, 22], seed=3, prefix="a")
    b, _, kb = write_corpus(d / "b", [9, 14, 7, 12], seed=4, prefix="b")
    for brace in (a, b):
        index_corpus(brace)
    return a, b, sorted(ka), sorted(kb)


def make(corpora, weights=(0.6, 0.4), rank=0, world=1, **kw):
    kw.setdefault("window_samples", 40)
    kw.setdefault("read_mode", "shard")
    return StreamingBatches([Source(corpora[0], weight=weights[0]), Source(corpora[1], weight=weights[1])],
                            BUDGET, CAP, rank=rank, world_size=world, **kw)


def epoch_keys(corpora, epoch, world=1, **kw):
    out = []
    for r in range(world):
        ds = make(corpora, rank=r, world=world, **kw)
        ds.set_epoch(epoch)
        out.append([[s["__key__"] for s in b] for b in ds])
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_quotas_cycles_and_determinism(corpora, world):
    a_keys, b_keys = corpora[2], corpora[3]
    ds = make(corpora, world=world)
    assert ds.config.read_mode == "shard"
    ca_n, cb_n = ds.sources.mix.counts
    streams = {"a": [], "b": []}
    epochs = 4
    padded = 0
    for e in range(epochs):
        ranks = epoch_keys(corpora, e, world=world)
        assert len({len(r) for r in ranks}) == 1  # equal steps
        ds.set_epoch(e)
        assert len(ds) == len(ranks[0])
        got = [k for r in ranks for b in r for k in b]
        by = collections.Counter(k[0] for k in got)
        assert abs(by["a"] - ca_n) + abs(by["b"] - cb_n) <= ds.epoch_summary().padded
        padded += ds.epoch_summary().padded
        for k in got:
            streams[k[0]].append(k)
    assert ranks == epoch_keys(corpora, epochs - 1, world=world)  # deterministic per (seed, epoch)
    # every sample once per cycle: after c full cycles and a part, each key c or c + 1 times, but for the
    # final steps' padding repeats
    extra = 0
    for keys, stream, quota in ((a_keys, streams["a"], ca_n), (b_keys, streams["b"], cb_n)):
        counts = collections.Counter(stream)
        cycles = epochs * quota // len(keys)
        assert set(counts) == set(keys) and min(counts.values()) >= cycles
        extra += sum(max(0, v - cycles - 1) for v in counts.values())
        assert sum(v > cycles for v in counts.values()) >= epochs * quota % len(keys)  # the partial cycle
    assert extra <= padded


def test_each_rank_trains_what_it_read(corpora):
    world = 3
    streamed = collections.Counter()
    for r in range(world):
        ds = make(corpora, rank=r, world=world)
        ds.set_epoch(1)
        cat = ds.catalog
        allowed = set()
        for win in ds.plan.windows(1):
            keys = list(zip(win.shard_ids.tolist(), win.local.tolist()))
            rows = win.reads.tolist()
            for rr, s, lo, hi in rows:
                if rr == r:
                    names = cat.table(s)[0]
                    allowed |= {names[j].decode() for j in range(lo, hi)}
            for i in range(win.n_carried):  # carried in: read by this rank in an earlier window
                if win.holder[i] == r:
                    allowed.add(cat.table(keys[i][0])[0][keys[i][1]].decode())
            if r == 0:
                # each new sample of the window is in a piece of its holder; every rank holds every source
                covered = {(rr, s, j) for rr, s, lo, hi in rows for j in range(lo, hi)}
                new = range(win.n_carried, len(keys))
                assert all((int(win.holder[i]), *keys[i]) in covered for i in new)
                streamed.update(keys[i] for i in new)
                src = source_of_shards(ds.sources, win.shard_ids[win.n_carried:])
                for q in range(world):
                    mine = src[win.holder[win.n_carried:] == q]
                    assert set(np.unique(mine).tolist()) == set(np.unique(src).tolist())
        mine = [s["__key__"] for b in ds for s in b]
        assert set(mine) <= allowed
    # one epoch streams every drawn sample once (the mix's quota: each source's next positions)
    assert sum(streamed.values()) == ds.samples_per_epoch


def test_group_cuts_large_weights():
    from streambatch.planners.shard_affine.planner import group_cuts, water_levels

    rng = np.random.default_rng(0)
    weights = rng.integers(10**9, 4 * 10**9, 80_000)  # level x group weight overflows int64
    groups = np.array([0, 50_000, 80_000])
    levels = water_levels(np.zeros(32, np.int64), int(weights.sum()))
    cuts, rank = group_cuts(weights, levels, groups)
    for g in range(2):
        a, b = groups[g], groups[g + 1]
        per = np.bincount(rank[a:b], weights=weights[a:b], minlength=32)
        assert per.max() / per.mean() < 1.01  # every rank: its share of every group


def test_default_read_mode_for_mixes(corpora, tmp_path):
    assert make(corpora, read_mode=None).config.read_mode == "sample"  # all local
    idx = str(tmp_path / "idx")
    pipes = [f"pipe:cat {p}" for p in sorted(__import__("glob").glob(corpora[1].split("{")[0] + "*.tar"))]
    index_shards(pipes, frames_per_second=FPS, index_dir=idx, workers=1, progress=False)
    remote = StreamingBatches([Source(corpora[0], weight=0.6), Source(pipes, weight=0.4, index_dir=idx)], BUDGET,
                              CAP, rank=1, world_size=2, window_samples=40)
    assert remote.config.read_mode == "shard"  # any remote source: shard mode, like one shard list
    local = make(corpora, rank=1, world=2)
    assert [[s["__key__"] for s in b] for b in remote] == [[s["__key__"] for s in b] for b in local]


def test_state_roundtrip_mixed_shard(corpora):
    check_state_roundtrip(lambda: make(corpora, rank=1, world=2), key=lambda b: tuple(s["__key__"] for s in b))


@pytest.mark.parametrize("w0, w1, frac", [(4, 3, 0.4), pytest.param(2, 4, 0.6, marks=pytest.mark.slow),
                                         pytest.param(8, 5, 0.25, marks=pytest.mark.slow)])
def test_mixed_shard_resume_on_another_world_size(corpora, w0, w1, frac):
    def run(world, state=None, steps=None):
        out, states = [], []
        for r in range(world):
            ds = make(corpora, rank=r, world=world)
            ds.set_epoch(1)
            if state is not None:
                ds.load_state_dict(state)
            it = iter(ds)
            out.append([[s["__key__"] for s in b] for _, b in zip(range(steps or 10**9), it)])
            states.append(ds.state_dict())
        assert all(s == states[0] for s in states)
        return out, len(ds), states[0]

    full, n0, _ = run(w0)
    k = int(frac * n0)
    head, _, state = run(w0, steps=k)
    tail, n1, end = run(w1, state)
    assert tail == run(w1, state)[0]
    assert len({len(t) for t in tail}) == 1 and n1 == k + len(tail[0]) and end["segments"] == [[w0, k]]
    got = collections.Counter(x for part in (head, tail) for rank in part for b in rank for x in b)
    ref = collections.Counter(x for rank in full for b in rank for x in b)
    assert set(got) == set(ref)
    assert sum((got - ref).values()) <= w1 - 1 and sum((ref - got).values()) <= w0 - 1
