"""The contract every corpus format meets through StreamingBatches, checked on
a real corpus of each (written by the format's own tools: tests/support/corpora.py,
tests/support/shards.py): every sample exactly once per epoch (but the counted
padding), equal steps on every rank, exact resume, elastic resume on another
world size, and about 1/W of the bytes per rank where the format allows it
(tar formats in either read mode; Parquet in shard mode, its default).

A format registered from your own code gets the same tests: name its module
in ``STREAMBATCH_FORMAT_MODULES`` (comma-separated, importable, e.g. with
``PYTHONPATH=.``). The module registers its ``FORMAT`` and defines
``write_corpus(directory) -> (given, {sample key: planning length at 100
frames/s}, [the corpus' data files])``, a small corpus of its format.

    STREAMBATCH_FORMAT_MODULES=my_format PYTHONPATH=. python -m pytest tests/streaming/formats/test_corpus_contract.py
"""

from __future__ import annotations

import collections
import importlib
import os

import pytest

from streambatch.streaming import FORMATS, Source, StreamingBatches
from tests.support.corpora import FPS, write_nemo, write_parquet, write_shar
from tests.support.corpus import indexed_corpus
from tests.support.helpers import FULL
from tests.support.roundtrip import check_state_roundtrip

BUDGET, CAP, WINDOW = 600, 10, 80
N = 150


def _webdataset(d):
    c = indexed_corpus(d, [N // 6] * 6, seed=3)  # tests/support/shards.py's tars, indexed beside them
    return c.brace, c.expected, c.paths


def _shar(d):
    directory, expected = write_shar(d, N, shard_size=25, seed=4)
    return directory, expected, [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".tar")]


def _nemo(d):
    directory, expected = write_nemo(d, N - 1, num_shards=6, seed=5)  # N entries with the -sub1 one
    return (os.path.join(directory, "tarred_audio_manifest.json"), expected,
            [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".tar")])


def _parquet(d):
    paths, expected = write_parquet(d, N, files=3, rows_per_group=10, seed=6, writer="pyarrow")
    return os.path.join(os.fspath(d), "*.parquet"), expected, paths


WRITERS = {"webdataset": _webdataset, "shar": _shar, "nemo": _nemo, "parquet": _parquet}
for _module in filter(None, (m.strip() for m in os.environ.get("STREAMBATCH_FORMAT_MODULES", "").split(","))):
    _mod = importlib.import_module(_module)  # registers its format; its writer joins the corpora below
    WRITERS[_mod.FORMAT.name] = _mod.write_corpus


def test_every_registered_format_is_covered():
    assert set(FORMATS) <= set(WRITERS), f"no test corpus for {sorted(set(FORMATS) - set(WRITERS))}"


@pytest.fixture(scope="module", params=sorted(WRITERS))
def corpus(request, tmp_path_factory):
    given, expected, files = WRITERS[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, given, expected, sum(os.path.getsize(f) for f in files)


def make(corpus, rank=0, world=1, **kw):
    kw.setdefault("window_samples", WINDOW)
    return StreamingBatches(corpus[1], kw.pop("budget", BUDGET), CAP, rank=rank, world_size=world,
                            frames_per_second=FPS, **kw)


def keys(ds):
    return [tuple(s["__key__"] for s in b) for b in ds]


SLOW = pytest.mark.slow


@pytest.mark.parametrize("world", [3, pytest.param(1, marks=SLOW), pytest.param(4, marks=SLOW)])
@pytest.mark.parametrize("read_mode", ["sample", "shard"])
def test_exactly_once_equal_steps_and_budget(corpus, world, read_mode):
    fmt, _, expected, _ = corpus
    per_rank = []
    for r in range(world):
        ds = make(corpus, r, world, read_mode=read_mode)
        ds.set_epoch(1)
        per_rank.append(keys(ds))
    summary = ds.epoch_summary()
    assert ds.catalog.layouts is None if fmt == "webdataset" else ds.catalog.layouts[0] is not None
    assert all(len(r) == summary.steps == len(ds) for r in per_rank)  # equal steps
    counts = collections.Counter(k for r in per_rank for b in r for k in b)
    assert set(counts) == set(expected)  # lengths were planned from the format's metadata, keys as its own
    assert sum(counts.values()) - len(expected) == summary.padded < world
    for r in per_rank:
        for b in r:
            assert 0 < len(b) <= CAP and (len(b) == 1 or len(b) * max(expected[k] for k in b) <= BUDGET)


def test_lengths_come_from_the_formats_metadata(corpus):
    # planned per sample from cuts / manifests / the duration column alone, as the audio's own length
    _, _, expected, _ = corpus
    ds = make(corpus)
    cat = ds.catalog
    planned = {}
    for s in range(len(cat.urls)):
        if corpus[0] == "parquet":  # rows: keys are <file name>/<row>; no tar table
            keys_s = [f"{os.path.basename(cat.urls[s])}/{i}" for i in range(cat.counts[s])]
        elif cat.layout(s) is not None and not cat.layout(s).tar:
            pytest.skip("another format without a tar table: its keys are its own")
        else:
            keys_s = [k.decode() for k in cat.table(s)[0]]
        planned.update({k: int(v) for k, v in zip(keys_s, cat.lengths(s))})
    assert planned == expected


def test_resume(corpus):
    if corpus[0] != "shar" and not FULL:
        pytest.skip("the fast tier resumes one format; --full resumes each (the resume logic is the plan's)")
    check_state_roundtrip(lambda: make(corpus, 1, 2), key=lambda b: tuple(s["__key__"] for s in b))


@pytest.mark.parametrize("read_mode", ["shard", pytest.param("sample", marks=SLOW)])
def test_elastic_resume(corpus, read_mode):
    _, _, expected, _ = corpus
    w0, w1 = 4, 3
    n0 = len(make(corpus, 0, w0, read_mode=read_mode))
    k = int(0.4 * n0)
    head, state = [], None
    for r in range(w0):
        ds = make(corpus, r, w0, read_mode=read_mode)
        it = iter(ds)
        head += [tuple(s["__key__"] for s in next(it)) for _ in range(k)]
        state = ds.state_dict()
    tail = []
    lens = set()
    for r in range(w1):
        ds = make(corpus, r, w1, read_mode=read_mode)
        ds.load_state_dict(state)
        got = keys(ds)
        lens.add(len(got))
        tail += got
    assert len(lens) == 1  # equal steps after the resize
    counts = collections.Counter(x for b in head + tail for x in b)
    assert set(counts) == set(expected)
    assert sum(counts.values()) - len(expected) <= (w0 - 1) + (w1 - 1)  # final-step padding only


@pytest.mark.parametrize("read_mode", ["shard", pytest.param("sample", marks=SLOW)])
def test_bytes_per_rank(corpus, read_mode):
    fmt, _, _, total = corpus
    world = 4
    read = []
    for r in range(world):
        ds = make(corpus, r, world, read_mode=read_mode)
        assert sum(len(b) for b in ds) > 0
        read.append(ds.bytes_read)
    if fmt == "parquet" and read_mode == "sample":
        # row groups are the unit: every rank reads every row group holding one of its samples (all of them)
        assert min(read) > 0.8 * total
        return
    # each rank about 1/W: its samples (tar formats), its row groups (Parquet: rows of a group
    # shared by two ranks' slices, or carried to the next window, are read by both)
    # (NeMo: the -sub1 entry reads its file's member a second time, maybe on another rank)
    slack = {"parquet": 1.35, "nemo": 1.02}.get(fmt, 1.0)
    assert sum(read) <= slack * total
    assert max(read) < (0.45 if fmt == "parquet" else 0.4) * total


@pytest.mark.slow
def test_mix_of_formats(tmp_path):
    corpora = {name: WRITERS[name](tmp_path / name) for name in ("webdataset", "shar", "nemo", "parquet")}
    sources = [Source(c[0], weight=1.0, name=name) for name, c in corpora.items()]
    world = 3
    per_rank = []
    for r in range(world):
        ds = StreamingBatches(sources, BUDGET, CAP, rank=r, world_size=world, frames_per_second=FPS,
                              window_samples=WINDOW, samples_per_epoch=200)
        per_rank.append(keys(ds))
    assert len({len(x) for x in per_rank}) == 1
    got = collections.Counter(k for r in per_rank for b in r for k in b)
    by_source = collections.Counter(next(n for n, c in corpora.items() if k in c[1]) for k in got.elements())
    assert set(by_source) == set(corpora)  # every format contributes
    assert sum(got.values()) - ds.epoch_summary().padded == 200
    for name, quota in zip(ds.sources.names, ds.sources.mix.counts):
        assert abs(by_source[name] - quota) < world  # each source its quota (plus padding)
