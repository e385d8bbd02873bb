"""Each stage of ``StreamingBatches`` on its own: the shard lists (URLs
expanded once), the read-mode strategy, the epoch plan, this rank's steps and
their position, the byte reads, and parse / decode / skip.

The dataset wires these (``streaming/dataset.py``); these tests drive one
stage with the previous stage's real output, so a stage can change and be
checked without running the whole pass."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from streambatch.core import state as S
from streambatch.epoch import read_modes as modes
from streambatch.epoch.epoch_plan import EpochPlan
from streambatch.epoch.read_modes import READ_MODES, iter_windows, resolve_mode
from streambatch.epoch.windows import WindowConfig
from streambatch.streaming import ShardError, StreamingBatches
from streambatch.streaming.io.remote_io import RemoteOptions
from streambatch.streaming.pipeline import samples as stages
from streambatch.streaming.pipeline.reads import Raw, SampleReads, Step
from streambatch.streaming.pipeline.steps import Cursor, Progress
from streambatch.streaming.shards import catalog as catalog_module
from streambatch.streaming.shards import lists as lists_module
from streambatch.streaming.shards.catalog_file import catalog_arrays, write_catalog
from streambatch.streaming.shards.lists import IndexOptions, ShardLists
from streambatch.streaming.shards.sources import Source

SIZES = [13, 0, 21, 8, 17, 11]
BUDGET, CAP = 300, 6


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=11, prefix="a", name="stages")
    return c.brace, c.paths, c.expected


def opened(corpus, window=25, world=2, read_mode="sample"):
    """(catalog, plan) as the dataset's constructor builds them."""
    lists = ShardLists(corpus[0])
    _, catalog = lists.open(IndexOptions(), RemoteOptions())
    config = WindowConfig.build(BUDGET, CAP, world, True, False, 7, "bucketed", {}, window_samples=window,
                                read_mode=read_mode)
    return catalog, EpochPlan.over_shards(catalog, None, config, READ_MODES[read_mode], auto_window=False)


# ---------------------------------------------------------------- shard lists: URLs expanded once


def test_shard_lists_expand_each_list_once(corpus, monkeypatch):
    calls = []
    real = lists_module.expand_urls
    monkeypatch.setattr(lists_module, "expand_urls", lambda u: calls.append(u) or real(u))
    lists = ShardLists(corpus[0])
    assert lists.all_local(RemoteOptions())  # the read mode's question
    _, catalog = lists.open(IndexOptions(), RemoteOptions())  # and the catalog's
    assert calls == [corpus[0]] and list(catalog.urls) == corpus[1]
    mix = ShardLists([Source(corpus[0], weight=1), Source(corpus[1][:2], weight=2)])
    assert mix.all_local(RemoteOptions()) and len(calls) == 3
    sources, catalog = mix.open(IndexOptions(), RemoteOptions())
    assert len(calls) == 3 and sources.catalog is catalog and len(catalog.urls) == len(SIZES) + 2


def test_a_catalog_file_is_read_once(corpus, tmp_path, monkeypatch):
    from streambatch.streaming.shards.sidecar import SidecarFile, sidecar_path

    metas, lengths = [], []
    for p in corpus[1]:
        with SidecarFile(sidecar_path(p, None)) as sc:
            metas.append(sc.meta)
            lengths.append(sc.lengths())
    path = str(tmp_path / "a.catalog.npz")
    meta, arrays = catalog_arrays(corpus[1], [sidecar_path(p, None) for p in corpus[1]], metas, lengths,
                                  metas[0]["length_from"], at=path)
    write_catalog(path, meta, arrays)
    reads = []
    real = lists_module.read_catalog
    monkeypatch.setattr(lists_module, "read_catalog", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    lists = ShardLists(path)
    assert lists.all_local(RemoteOptions())
    _, catalog = lists.open(IndexOptions(), RemoteOptions())
    assert reads == [path] and list(catalog.urls) == corpus[1]
    assert catalog.counts.tolist() == SIZES


def test_samples_per_epoch_needs_a_mix(corpus):
    with pytest.raises(ValueError, match="samples_per_epoch applies to a mix"):
        ShardLists(corpus[0], samples_per_epoch=10)


def test_locality_is_decided_once_per_shard(corpus, monkeypatch):
    ds = StreamingBatches(corpus[0], BUDGET, CAP, rank=0, world_size=1, window_samples=25)
    assert ds.catalog.local.tolist() == [True] * len(SIZES)
    calls = []
    monkeypatch.setattr(catalog_module, "is_local", lambda u: calls.append(u) or True)
    ds.set_epoch(1)
    assert sum(len(b) for b in ds) == sum(SIZES)
    assert calls == []  # the pass asks the catalog's per-shard answer, not the URL, per sample


# ---------------------------------------------------------------- the read mode's strategy


def test_resolve_mode_once_into_a_strategy():
    asked = []

    def local(answer):
        return lambda: asked.append(answer) or answer

    assert resolve_mode(None, local(True)) is READ_MODES["sample"]
    assert resolve_mode(None, local(False)) is READ_MODES["shard"]
    assert resolve_mode("shard", local(True)) is READ_MODES["shard"] and asked == [True, False]  # not asked
    with pytest.raises(ValueError, match=r"read_mode must be one of \['sample', 'shard'\]"):
        resolve_mode("shards", local(True))
    # both read modes' default windows: 20,000 samples and at least 2,500 per rank (sample mode's followed W
    # since 2026-12-04: at W = 64 its windows of 20,000 held 2-3 steps each)
    assert READ_MODES["sample"].default_window(8) == 20_000 and READ_MODES["shard"].default_window(16) == 40_000
    assert READ_MODES["sample"].default_window(64) == READ_MODES["shard"].default_window(64) == 160_000
    assert READ_MODES["shard"].rank_share and not READ_MODES["sample"].rank_share
    assert set(modes.READ_MODES) == {"sample", "shard"}


# ---------------------------------------------------------------- the epoch plan


def test_epoch_plan_windows_and_cached_summary(corpus):
    catalog, plan = opened(corpus)
    got = list(plan.windows(2))
    want = list(iter_windows(catalog.counts, catalog.lengths, plan.config, 2))
    assert [w.first_step for w in got] == [w.first_step for w in want] and len(got) >= 2
    assert all(np.array_equal(a.plan.samples, b.plan.samples) for a, b in zip(got, want))
    summary = plan.summary(2)
    assert plan.summary(2) is summary and summary.steps == sum(w.num_steps for w in got)
    assert plan.config_at(5).world_size == 5 and plan.config_at(5).window_samples == 25
    assert plan.fingerprint_at(2) != plan.fingerprint_at(3)
    assert plan.samples_per_epoch == sum(SIZES) and plan.source_positions(4) == [(4, 0)]


# ---------------------------------------------------------------- this rank's steps


def test_cursor_yields_this_workers_steps_of_every_window(corpus):
    _, plan = opened(corpus)
    total = plan.summary(1).steps
    seen = {}
    for worker in range(3):
        cursor = Cursor(1, worker, worker, 3, ())
        rws = list(cursor.windows(plan.windows(1), rank=1))
        assert len(rws) == len(list(plan.windows(1)))  # every window, those without steps too
        for rw in rws:
            assert all(rw.window.first_step <= s < rw.window.first_step + rw.window.num_steps for s in rw.steps)
            for s, idx in zip(rw.steps, rw.batches):
                assert np.array_equal(idx, rw.window.plan.batch(s - rw.window.first_step, 1))
                seen[s] = worker
        cursor.check_end()
    assert sorted(seen) == list(range(total)) and all(seen[s] == s % 3 for s in seen)


def test_cursor_refuses_a_start_beyond_the_epoch(corpus):
    _, plan = opened(corpus)
    total = plan.summary(0).steps
    cursor = Cursor(0, total + 1, None, 0, ())
    assert sum(len(rw.steps) for rw in cursor.windows(plan.windows(0), rank=0)) == 0
    with pytest.raises(ValueError, match=f"resuming at step {total + 1} of epoch 0, which has only {total} steps"):
        cursor.check_end()


def test_progress_state_round_trip():
    saver = Progress(fingerprint=99)
    saver.epoch = 3
    cursor = saver.begin(None, 0)
    cursor.step = 7
    for _ in range(2):
        saver.add_skip(cursor)
    state = saver.state_dict()
    assert state == {S.EPOCH: 3, S.STEP: 7, S.WORKER: None, S.NUM_WORKERS: 0, S.SKIPPED: 2}
    loader = Progress(fingerprint=99)
    loader.load_state_dict({**state, S.SEGMENTS: ((4, 5),)}, None, 0)
    assert loader.epoch == 3 and loader.skipped() == 2 and loader.segments(3) == ((4, 5),)
    assert loader.state_dict()[S.STEP] == 7 and S.HISTORY in loader.state_dict()  # pending, not started yet
    resumed = loader.begin(None, 0)
    assert (resumed.epoch, resumed.start, resumed.segments) == (3, 7, ((4, 5),))
    assert loader.begin(None, 0).start == 5  # the resume is used once; then the epoch starts after the history
    # a main-process state loaded in worker 1 of 2: that worker starts one step later, its count stays with worker 0
    worker = Progress(fingerprint=99)
    worker.load_state_dict({**state, S.SEGMENTS: ()}, 1, 2)
    c = worker.begin(1, 2)
    assert (c.start, c.stride, c.limit) == (8, 2, 2) and worker.skipped() == 0


# ---------------------------------------------------------------- byte reads, parse, decode, skip


def test_sample_reads_read_exactly_the_steps_samples(corpus):
    catalog, plan = opened(corpus, world=1)
    reads = SampleReads(catalog, None, "raise")
    cursor = Cursor(0, 0, None, 0, ())
    got, total = [], 0
    for step in reads.steps(cursor.windows(plan.windows(0), rank=0), 0):
        raws = list(step.samples)
        assert all(isinstance(r, Raw) for r in raws)
        got += [r.key for r in raws]
        total += sum(len(r.data) for r in raws)
    reads.close()
    assert sorted(got) == sorted(corpus[2]) and reads.bytes_read == total


def test_sample_reads_pass_a_broken_shard_on_as_errors(corpus, tmp_path):
    catalog, plan = opened(corpus, world=1)
    sidecar = catalog.sidecars[2]
    os.rename(sidecar, sidecar + ".away")
    try:
        with pytest.raises(ShardError, match="cannot read sidecar"):
            for step in SampleReads(catalog, None, "raise").steps(Cursor(0, 0, None, 0, ()).windows(
                    plan.windows(0), rank=0), 0):
                list(step.samples)
        out = [x for step in SampleReads(catalog, None, "skip").steps(Cursor(0, 0, None, 0, ()).windows(
            plan.windows(0), rank=0), 0) for x in step.samples]
    finally:
        os.rename(sidecar + ".away", sidecar)
    errors = [x for x in out if isinstance(x, ShardError)]
    assert len(errors) == SIZES[2] and len(out) == sum(SIZES)


def _raw(corpus, catalog, shard=0, i=0):
    keys, offsets, sizes = catalog.table(shard)
    url = catalog.urls[shard]
    with open(url, "rb") as f:
        f.seek(int(offsets[i]))
        data = f.read(int(sizes[i]))
    return Raw(shard, url, int(offsets[i]), keys[i].decode(), data)


def test_parse_decode_skip_sample_by_sample(corpus):
    catalog, _ = opened(corpus)
    good = _raw(corpus, catalog, 0, 0)
    torn = Raw(good.shard, good.url, good.offset, good.key, good.data[:100])
    order = []

    def source():
        for raw in (good, ShardError("shard x.tar at byte 9: unreadable"), torn, good):
            order.append(("read", raw if isinstance(raw, ShardError) else raw.key))
            yield raw

    def fn(sample):
        order.append(("decode", sample["__key__"]))
        return {"n": len(sample)}

    steps = stages.decode(stages.parse(iter([Step(4, source())])), fn)
    skipped = []
    (index, batch), = list(stages.keep_read(steps, "skip", lambda: skipped.append(1) or len(skipped)))
    assert index == 4 and batch == [{"n": 4}, {"n": 4}] and len(skipped) == 2
    # lazy: each sample is read, then decoded, before the next is read
    assert [k for k, _ in order] == ["read", "decode", "read", "read", "read", "decode"]
    order.clear()
    with pytest.raises(ShardError, match="unreadable"):
        list(stages.keep_read(stages.decode(stages.parse(iter([Step(0, source())])), fn), "raise", lambda: 0))
    assert [k for k, _ in order] == ["read", "decode", "read"]  # nothing after the failing sample is read


def test_a_failing_decoder_is_a_shard_error_naming_the_sample(corpus):
    catalog, _ = opened(corpus)
    good = _raw(corpus, catalog, 2, 3)

    def broken(sample):
        raise KeyError("flac")

    (x,) = next(stages.decode(stages.parse(iter([Step(0, iter([good]))])), broken)).samples
    assert isinstance(x, ShardError) and isinstance(x.__cause__, KeyError)
    assert f"decoding sample {good.key!r}" in str(x) and f"(byte {good.offset})" in str(x)
    (none,) = next(stages.decode(stages.parse(iter([Step(0, iter([good]))])), lambda s: None)).samples
    assert isinstance(none, ShardError) and "decode returned None" in str(none)


def test_output_options_check_their_values():
    assert stages.OutputOptions.build("audio").decode is stages.decode_audio
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
        stages.OutputOptions.build(on_error="ignore")
    with pytest.raises(ValueError, match="decode must be None, 'audio' or a function"):
        stages.OutputOptions.build(decode="wav")
    with pytest.raises(TypeError, match="collate_fn must be callable"):
        stages.OutputOptions.build(collate_fn=SimpleNamespace())


def test_the_stages_pickle_for_spawned_workers(corpus):
    # spawned DataLoader workers get the dataset by pickle: every stage object it holds must travel
    import pickle

    ds = StreamingBatches(corpus[0], BUDGET, CAP, rank=1, world_size=2, window_samples=25, read_mode="shard")
    ds.set_epoch(2)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.plan.source.mode == READ_MODES["shard"] and copy.config == ds.config
    assert [[s["__key__"] for s in b] for b in copy] == [[s["__key__"] for s in b] for b in ds]


def test_every_stage_module_says_what_its_stream_yields():
    import ast
    import pathlib

    import streambatch.epoch as epoch
    import streambatch.streaming as streaming

    # the streaming stages and the plan layer's windows (the epoch-plan stage)
    for package, least in ((streaming, 40), (epoch, 9)):
        root = pathlib.Path(package.__file__).parent
        missing = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
                   if "\nStream: " not in "\n" + (ast.get_docstring(ast.parse(p.read_text())) or "")]
        assert not missing, f"module docstrings without a 'Stream: ...' line: {missing}"
        assert len(list(root.rglob("*.py"))) > least


def test_the_last_stages_move_the_position_and_scrub_errors():
    from streambatch.streaming.runtime.failures import watched

    cursor = Cursor(0, 1, 1, 2, (), limit=2)  # worker 1 of 2 (no windows seen here: check_end allows its limit)
    out = list(stages.collate(cursor.deliver(iter([(1, ["a"]), (3, ["b", "c"])])), len))
    assert out == [1, 2] and cursor.step == 5  # past step 3, by the stride of 2 workers

    def failing():
        yield 1
        raise OSError("cannot open https://user:hunter2@host/x.tar")

    got = []
    with pytest.raises(OSError) as info:
        for x in watched(failing(), None, 0, 1):
            got.append(x)
    assert got == [1] and "hunter2" not in str(info.value)  # scrubbed before it leaves the pass


def test_a_missing_package_is_raised_even_with_on_error_skip(corpus):
    # Skipping would drop every sample of the epoch with a warning each, when the fix is one pip install.
    catalog, _ = opened(corpus)
    good = _raw(corpus, catalog, 0, 0)

    def needs_soundfile(sample):
        raise ImportError("decoding .flac audio needs soundfile: pip install 'streambatch[audio]'")

    steps = stages.decode(stages.parse(iter([Step(0, iter([good, good]))])), needs_soundfile)
    with pytest.raises(ImportError, match="streambatch\\[audio\\]"):
        list(stages.keep_read(steps, "skip", lambda: 0))
