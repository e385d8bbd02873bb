"""StreamingBatches over several weighted sources, on real tar shards:
per-epoch quotas, windows in proportion, every sample once per cycle,
determinism, len(), state round-trips, argument errors."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from streambatch.streaming import StreamingBatches
from streambatch.streaming.shards.sources import Source
from tests.support.corpus import index_corpus
from tests.support.roundtrip import check_state_roundtrip
from tests.support.shards import write_corpus

BUDGET, CAP = 400, 6


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    a, _, ka = write_corpus(d / "a", [30, 25, 0, 35, 20, 28], seed=3, prefix="a")
    b, _, kb = write_corpus(d / "b", [9, 14, 7], seed=4, prefix="b")
    for brace in (a, b):
        index_corpus(brace)
    return a, b, sorted(ka), sorted(kb)


def make(corpora, weights=(0.6, 0.4), rank=0, world=1, **kw):
    kw.setdefault("window_samples", 40)
    return StreamingBatches([Source(corpora[0], weight=weights[0]), Source(corpora[1], weight=weights[1])],
                            BUDGET, CAP, rank=rank, world_size=world, **kw)


def epoch_keys(corpora, epoch, world=1, **kw):
    out = []
    for r in range(world):
        ds = make(corpora, rank=r, world=world, **kw)
        ds.set_epoch(epoch)
        out.append([[s["__key__"] for s in b] for b in ds])
    return out


def test_quotas_cycles_and_determinism(corpora):
    a_keys, b_keys = corpora[2], corpora[3]
    ds = make(corpora, world=2, planner="bucketed")
    assert ds.sources.mix.counts == (101, 67)  # 168 samples split 0.6 / 0.4; b (30 samples) up-sampled ~2.2x
    streams = {"a": [], "b": []}
    for e in range(3):
        ranks = epoch_keys(corpora, e, world=2, planner="bucketed")
        assert len({len(r) for r in ranks}) == 1
        ds.set_epoch(e)
        assert len(ds) == len(ranks[0])  # len() exact, from the sidecars
        got = [k for r in ranks for b in r for k in b]
        by = collections.Counter(k[0] for k in got)
        pad = ds.epoch_summary().padded
        assert abs(by["a"] - 101) + abs(by["b"] - 67) <= pad
        for k in got:
            streams[k[0]].append(k)
        assert ds.source_positions() == [divmod(e * 101, 138), divmod(e * 67, 30)]
    assert ranks == epoch_keys(corpora, 2, world=2, planner="bucketed")  # deterministic per (seed, epoch)
    # over 3 epochs b ran 201 / 30 = 6.7 cycles: every key 6 or 7 times (+1 if it padded a final step);
    # a ran 303 / 138 = 2.2 cycles: 2 or 3 times
    cb = collections.Counter(streams["b"])
    assert set(cb) == set(b_keys) and set(cb.values()) <= {6, 7, 8}
    assert sum(v >= 7 for v in cb.values()) >= 21  # the 0.7 cycle: 21 keys had their 7th round
    ca = collections.Counter(streams["a"])
    assert set(ca) == set(a_keys) and set(ca.values()) <= {2, 3, 4}


def test_windows_hold_the_sources_in_proportion(corpora):
    from streambatch.epoch.mixed_windows import mixed_inputs, source_of_shards

    ds = make(corpora, window_samples=30)
    sc = ds.sources
    for e in range(3):
        wins = list(mixed_inputs(sc, 30, 42, e, True))
        assert len(wins) == 168 // 30
        for w in wins:
            n = np.bincount(source_of_shards(sc, w.ids), minlength=2)
            want = np.array(sc.mix.counts) * w.ids.shape[0] / 168
            assert np.abs(n - want).max() <= 2


def test_repeat_and_samples_specs(corpora):
    ds = StreamingBatches([Source(corpora[0], repeat=1), Source(corpora[1], samples=45)], BUDGET, CAP,
                          rank=0, world_size=1, window_samples=50)
    assert ds.sources.mix.counts == (138, 45) and ds.samples_per_epoch == 183
    keys = [s["__key__"] for b in ds for s in b]
    assert collections.Counter(k[0] for k in keys) == {"a": 138, "b": 45}
    assert len(set(k for k in keys if k[0] == "a")) == 138  # repeat=1: every a-sample once per epoch


def test_state_roundtrip_mixed(corpora):
    check_state_roundtrip(lambda: make(corpora, rank=1, world=2), key=lambda b: tuple(s["__key__"] for s in b))


def test_bad_sources(corpora):
    with pytest.raises(TypeError, match="only Source"):
        StreamingBatches([Source(corpora[0]), corpora[1]], BUDGET, CAP)
    with pytest.raises(ValueError, match="every source has a weight or none"):
        StreamingBatches([Source(corpora[0], weight=1), Source(corpora[1])], BUDGET, CAP)
    with pytest.raises(ValueError, match="one of weight, samples or repeat"):
        Source(corpora[0], weight=1, repeat=2)
    with pytest.raises(ValueError, match="samples_per_epoch applies to a mix"):
        StreamingBatches(corpora[0], BUDGET, CAP, samples_per_epoch=10)
    with pytest.raises(FileNotFoundError, match="source1: .*no usable sidecar"):
        StreamingBatches([Source(corpora[0]), Source(corpora[1], name="source1", index_dir="/nonexistent")],
                         BUDGET, CAP)
    ds = make(corpora, world=2)
    with pytest.raises(ValueError, match="other shards, sidecars or settings"):
        make(corpora, weights=(0.5, 0.5), world=2).load_state_dict(ds.state_dict())
