"""One configuration, one fingerprint, one state vocabulary; and the state and
API edges of the sampler and the streaming dataset (issue 11)."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
from torch.utils.data import DataLoader

from streambatch import DynamicBatchSampler, make_plan
from streambatch.core import state as S
from streambatch.core.config import PlanConfig
from streambatch.core.plan import config_fingerprint
from streambatch.epoch.windows import WindowConfig
from streambatch.streaming import StreamingBatches, index_shards, sidecar_path
from streambatch.streaming.shards.sidecar import read_arrays
from tests.support.helpers import Echo, lognormal_lengths
from tests.support.roundtrip import check_state_roundtrip
from tests.support.shards import FPS

BUDGET, CAP, WINDOW = 400, 12, 90


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([37, 23, 41, 29, 35, 18], seed=3, name="state")
    return c.brace, c.paths, c.expected


def make(corpus, **kw):
    kw.setdefault("window_samples", WINDOW)
    return StreamingBatches(corpus[0], kw.pop("budget", BUDGET), CAP, **kw)


def keys(batches):
    return [tuple(s["__key__"] for s in b) for b in batches]


# ---------------------------------------------------------------- one configuration


def test_config_is_validated_once_per_construction(monkeypatch):
    import streambatch.core.config as config_module

    calls = []
    real = config_module.check_budget
    monkeypatch.setattr(config_module, "check_budget", lambda v: calls.append(v) or real(v))
    s = DynamicBatchSampler(lognormal_lengths(300), 4000, 16, world_size=2, rank=1)
    s.set_epoch(1)
    list(s)
    assert calls == [4000]


def test_make_plan_takes_a_config_and_plans_the_same():
    lengths = lognormal_lengths(500)
    cfg = PlanConfig.build(3000, 16, 4, seed=9, planner="bucketed", planner_options={"bucket_width": 0.05})
    a = make_plan(lengths, cfg, epoch=2)
    b = make_plan(lengths, 3000, 16, 4, seed=9, epoch=2, planner="bucketed", bucket_width=0.05)
    assert a.fingerprint() == b.fingerprint()
    with pytest.raises(TypeError, match="planner options from the config"):
        make_plan(lengths, cfg, bucket_width=0.1)
    assert cfg.replace(max_batch_tokens=2000).max_batch_tokens == 2000
    with pytest.raises(ValueError, match="max_batch_tokens must be >= 1"):
        cfg.replace(max_batch_tokens=0)
    with pytest.raises(TypeError, match="world_size must be an integer.*'2'"):
        PlanConfig.build(100, world_size="2")
    with pytest.raises(ValueError, match="window_samples must be >= 1"):
        WindowConfig.build(100, window_samples=0)


def test_one_fingerprint_scheme(corpus):
    lengths = lognormal_lengths(400)
    s = DynamicBatchSampler(lengths, 4000, 16, world_size=2, rank=0, seed=5)
    assert s.state_dict()[S.FINGERPRINT] == s.config.fingerprint(lengths)
    # the version-1 sampler formula: old checkpoints keep loading
    assert s.config.fingerprint(lengths) == config_fingerprint(lengths, 4000, 16, True, False, 2, 5, "greedy", "[]")
    ds = make(corpus, rank=0, world_size=2)
    assert type(ds.fingerprint) is int and 0 <= ds.fingerprint < 2**63  # a 63-bit int, JSON-exact
    assert ds.fingerprint == ds.state_dict()[S.FINGERPRINT]
    assert ds.state_dict()[S.FINGERPRINT] == ds.config.fingerprint(ds.catalog.fingerprint())
    assert make(corpus, rank=1, world_size=2).fingerprint == ds.fingerprint  # rank is not part of it
    assert make(corpus, rank=0, world_size=2, window_samples=50).fingerprint != ds.fingerprint


def test_sampler_and_streaming_states_share_one_vocabulary(corpus):
    common = {S.VERSION, S.EPOCH, S.STEP, S.WORLD_SIZE, S.SEED, S.FINGERPRINT, S.CONFIG}
    a = DynamicBatchSampler(lognormal_lengths(100), 4000).state_dict()
    b = make(corpus, rank=0, world_size=1).state_dict()
    assert common <= set(a) and common <= set(b)
    assert set(b) - set(a) == {S.WORKER, S.NUM_WORKERS, S.SKIPPED}
    assert a[S.VERSION] == b[S.VERSION] == S.STATE_VERSION
    assert isinstance(a, dict) and isinstance(DynamicBatchSampler([1], 5), S.Stateful)


def test_shared_roundtrip_helper_with_named_keys():
    lengths = lognormal_lengths(800)
    check_state_roundtrip(lambda: DynamicBatchSampler(lengths, 3000, 16, world_size=3, rank=2), key=tuple,
                          cuts=(0.0, 0.5, 1.0), step_key=S.STEP)


def test_version1_sampler_state_still_loads():
    lengths = lognormal_lengths(600)
    ref = DynamicBatchSampler(lengths, 3000, 16, world_size=2, rank=1, seed=4)
    ref.set_epoch(2)
    batches = list(ref)
    old = {"version": 1, "epoch": 2, "batches_consumed": 3, "seed": 4, "world_size": 2,
           "fingerprint": config_fingerprint(lengths, 3000, 16, True, False, 2, 4, "greedy", "[]")}
    s = DynamicBatchSampler(lengths, 3000, 16, world_size=2, rank=1, seed=4)
    s.load_state_dict(old)
    assert list(s) == batches[3:]


def test_version1_streaming_state_still_loads(corpus):
    from streambatch.streaming.pipeline.state import legacy_fingerprint

    ds = make(corpus, rank=1, world_size=2)
    ds.set_epoch(1)
    ref = keys(ds)
    old = {"version": 1, "epoch": 1, "step": 4, "worker": None, "num_workers": 0, "world_size": 2,
           "fingerprint": legacy_fingerprint(ds.config, ds.catalog), "skipped": 0}
    fresh = make(corpus, rank=1, world_size=2)
    fresh.load_state_dict(old)
    assert keys(fresh) == ref[4:]


# ---------------------------------------------------------------- sampler edges


def test_sampler_state_errors_name_the_problem():
    lengths = lognormal_lengths(400)
    s = DynamicBatchSampler(lengths, 4000, 16, world_size=2)
    good = s.state_dict()
    with pytest.raises(ValueError, match="missing key.*step, fingerprint"):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match=r"state\['world_size'\] must be an integer, got '2'"):
        s.load_state_dict({**good, "world_size": "2"})
    with pytest.raises(ValueError, match="max_batch_tokens: saved 4000, now 3000"):
        DynamicBatchSampler(lengths, 3000, 16, world_size=2).load_state_dict(good)
    with pytest.raises(ValueError, match="the lengths differ"):
        DynamicBatchSampler(lengths[:-1], 4000, 16, world_size=2).load_state_dict(good)
    with pytest.raises(ValueError, match="newer streambatch"):
        s.load_state_dict({**good, "version": 99})
    with pytest.raises(ValueError, match=r"beyond the \d+ steps of epoch 0"):
        s.load_state_dict({**good, "step": 10**9})


def test_failed_sampler_load_changes_nothing():
    lengths = lognormal_lengths(400)
    s = DynamicBatchSampler(lengths, 4000, 16, world_size=2, rank=1)
    before = list(s)
    bad = {**s.state_dict(), "epoch": 3, "step": 10**9}
    with pytest.raises(ValueError, match="beyond"):
        s.load_state_dict(bad)
    assert s.epoch == 0 and list(s) == before


@pytest.mark.parametrize("epoch, err", [(2**64 + 1, ValueError), (2**32, ValueError), (-1, ValueError),
                                        ("1", TypeError)])
def test_epochs_are_bounded(corpus, epoch, err):
    s = DynamicBatchSampler([3, 4, 5], 10)
    ds = make(corpus, rank=0, world_size=1)
    with pytest.raises(err, match="epoch"):
        s.set_epoch(epoch)
    with pytest.raises(err, match="epoch"):
        ds.set_epoch(epoch)
    assert s.epoch == 0 and ds.epoch == 0
    s.set_epoch(2**32 - 1)
    ds.set_epoch(2**32 - 1)
    assert ds.epoch == 2**32 - 1


def test_rank_none_needs_a_process_group(corpus, monkeypatch):
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="rank=None cannot be resolved with world_size=2.*not initialised"):
        DynamicBatchSampler([1, 2, 3], 10, rank=None, world_size=2)
    with pytest.raises(ValueError, match="rank=None cannot be resolved"):
        make(corpus, rank=None, world_size=2)
    assert DynamicBatchSampler([1, 2, 3], 10, rank=None, world_size=1).rank == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    for build in (lambda: DynamicBatchSampler([1, 2, 3], 10, rank=None, world_size=None),
                  lambda: make(corpus), lambda: DynamicBatchSampler([1, 2, 3], 10, rank=None, world_size=4)):
        with pytest.raises(ValueError, match="RANK=1, WORLD_SIZE=4.*init_process_group"):
            build()


def test_padding_can_repeat_one_sample_in_every_empty_slot():
    # the README's rule: W - 1 padded slots at most, and one sample may fill all of them
    s = DynamicBatchSampler([7], 100, world_size=8, rank=0)
    batches = [list(DynamicBatchSampler([7], 100, world_size=8, rank=r)) for r in range(8)]
    assert batches == [[[0]]] * 8 and s.num_padded == 7


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_state_read_ahead_of_the_loop_warns(num_workers):
    lengths = lognormal_lengths(1500)
    s = DynamicBatchSampler(lengths, 4000, 16, world_size=2, rank=1)
    it = iter(DataLoader(Echo(), batch_sampler=s, num_workers=num_workers, collate_fn=list))
    got = [next(it) for _ in range(5)]
    assert got == list(s.batches)[:5]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = s.state_dict()
    ahead = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    if num_workers:
        assert state[S.STEP] > 5  # prefetched: the sampler's own count is ahead
        assert len(ahead) == 1 and "the loop has received 5" in str(ahead[0].message)
        assert "StatefulDataLoader" in str(ahead[0].message)
    else:
        assert state[S.STEP] == 5 and not ahead
    del it


def test_stateful_dataloader_reads_the_sampler_without_warning():
    from torchdata.stateful_dataloader import StatefulDataLoader

    s = DynamicBatchSampler(lognormal_lengths(1500), 4000, 16, world_size=2, rank=0)
    loader = StatefulDataLoader(Echo(), batch_sampler=s, num_workers=2, collate_fn=list)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
    # the loader took the sampler's own state, at the 5 batches the loop received (not the prefetched count)
    sampler_state = state["_snapshot"]["_main_snapshot"]["_index_sampler_state"]
    assert sampler_state[S.STEP] == 5 and sampler_state[S.FINGERPRINT] == s.state_dict()[S.FINGERPRINT]
    resumed = DynamicBatchSampler(lognormal_lengths(1500), 4000, 16, world_size=2, rank=0)
    resumed.load_state_dict(sampler_state)
    assert list(resumed) == list(s.batches)[5:]


# ---------------------------------------------------------------- streaming edges


@pytest.mark.parametrize("persistent", [False, True])
def test_start_batch_applies_to_one_pass_under_workers(corpus, persistent):
    ds = make(corpus, rank=1, world_size=2)
    ds.set_epoch(2)
    ref = keys(ds)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    ds.set_start_batch(5)
    assert keys(loader) == ref[5:]
    assert keys(loader) == ref == keys(loader) and len(ds) == len(ref)
    # a main-process load_state_dict too
    state = {**ds.state_dict(), S.STEP: 3}
    ds.load_state_dict(state)
    assert keys(loader) == ref[3:]
    assert keys(loader) == ref


def test_streaming_state_errors_name_the_problem(corpus):
    ds = make(corpus, rank=0, world_size=2)
    good = ds.state_dict()
    with pytest.raises(ValueError, match=r"beyond the \d+ steps of epoch 0"):
        ds.load_state_dict({**good, S.STEP: 10**9})
    with pytest.raises(ValueError, match="missing key.*fingerprint"):
        ds.load_state_dict({k: v for k, v in good.items() if k != S.FINGERPRINT})
    with pytest.raises(ValueError, match=r"state\['world_size'\] must be an integer, got '2'"):
        ds.load_state_dict({**good, S.WORLD_SIZE: "2"})
    with pytest.raises(ValueError, match="max_batch_tokens: saved 400, now 500"):
        make(corpus, rank=0, world_size=2, budget=500).load_state_dict(good)
    assert keys(ds) == keys(make(corpus, rank=0, world_size=2))  # nothing changed by the refusals


def _corrupted(corpus, tmp_path, shard: int, sample: int):
    """A copy of the corpus with one sample's tar header damaged (sidecars still current)."""
    paths = []
    for p in corpus[1]:
        q = str(tmp_path / os.path.basename(p))
        shutil.copy2(p, q)
        shutil.copy2(sidecar_path(p), sidecar_path(q))
        paths.append(q)
    keys_, offsets = read_arrays(sidecar_path(paths[shard]), ("keys", "offsets"))
    with open(paths[shard], "r+b") as f:
        f.seek(int(offsets[sample]) + 1)
        f.write(b"\x00\xff\x13")
    st = os.stat(corpus[1][shard])
    os.utime(paths[shard], ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the sidecar stays current
    return paths, keys_[sample].decode()


def test_skipped_samples_are_counted_across_workers(corpus, tmp_path):
    paths, bad = _corrupted(corpus, tmp_path, 2, 4)
    total = 0
    for rank in range(2):
        ds = StreamingBatches(paths, BUDGET, CAP, window_samples=WINDOW, rank=rank, world_size=2, on_error="skip")
        got = [k for b in keys(DataLoader(ds, batch_size=None, num_workers=2)) for k in b]
        assert ds.num_skipped == ds.state_dict()[S.SKIPPED] == (bad in [k for b in keys(make(corpus, rank=rank,
                                                                world_size=2)) for k in b])
        assert bad not in got
        total += ds.num_skipped
    assert total == 1
    # the count continues through a saved state
    ds = StreamingBatches(paths, BUDGET, CAP, window_samples=WINDOW, on_error="skip")
    list(ds)
    fresh = StreamingBatches(paths, BUDGET, CAP, window_samples=WINDOW, on_error="skip")
    fresh.load_state_dict(ds.state_dict())
    assert fresh.num_skipped == 1


def test_stream_error_fails_only_the_unread_samples(corpus, tmp_path):
    src = corpus[1][1]
    path = str(tmp_path / os.path.basename(src))
    shutil.copy2(src, path)
    url = f"pipe:cat {path}"
    idx = str(tmp_path / "idx")
    index_shards([url], frames_per_second=FPS, index_dir=idx, workers=1, progress=False)
    keys_, offsets, sizes = read_arrays(sidecar_path(url, idx), ("keys", "offsets", "sizes"))
    cut = int(offsets[len(offsets) // 2]) + 100
    with open(path, "r+b") as f:
        f.truncate(cut)
    lost = {k.decode() for k, o, n in zip(keys_, offsets, sizes) if o + n > cut}
    ds = StreamingBatches([url], BUDGET, CAP, index_dir=idx, on_error="skip", shuffle=False)
    got = [k for b in keys(ds) for k in b]
    assert sorted(got) == sorted(k.decode() for k in keys_ if k.decode() not in lost)
    assert ds.num_skipped == len(lost) < len(keys_)


@pytest.mark.slow  # two StatefulDataLoaders with workers per case
@pytest.mark.parametrize("cut", [0, 9])  # the bad sample is in batch 0: skipped after the save, or before
def test_skip_count_survives_a_stateful_dataloader_resume(corpus, tmp_path, cut):
    from torchdata.stateful_dataloader import StatefulDataLoader

    paths, bad = _corrupted(corpus, tmp_path, 2, 4)

    def loader():
        ds = StreamingBatches(paths, BUDGET, CAP, window_samples=WINDOW, on_error="skip")
        return ds, StatefulDataLoader(ds, batch_size=None, num_workers=2)

    ds, dl = loader()
    it = iter(dl)
    head = [next(it) for _ in range(cut)]
    state = dl.state_dict()
    del it
    ds2, dl2 = loader()
    dl2.load_state_dict(state)
    tail = list(dl2)
    got = [s["__key__"] for b in head + tail for s in b]
    assert bad not in got and len(got) == len(set(got)) == len(corpus[2]) - 1
    assert ds2.num_skipped == 1  # skipped once: before the save (restored) or after it
