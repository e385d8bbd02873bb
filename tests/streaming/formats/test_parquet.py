"""Parquet through StreamingBatches: files written by Hugging Face ``datasets``
(``Dataset.to_parquet`` with an ``Audio`` column) and by pyarrow, rows
compared with pyarrow's own reads, lengths from one column (units, bad
values), from the audio headers, and (slow tier) over HTTP (nginx laid out
like the Hub, with its token) and S3 (moto): only the footer and the length
column read to plan, about 1/W of the row groups per rank at W = 4.

hf:// itself needs the Hub's API (no server here answers it): its URLs are
checked for detection and routing only."""

from __future__ import annotations

import collections
import os
import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from streambatch.streaming import Parquet, ShardError, StreamingBatches, collate_audio
from streambatch.streaming.shards.corpora import resolve
from tests.support.corpora import FPS, SAMPLE_RATE, write_parquet
from tests.support.servers import nginx_server, s3_server

pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module", params=["datasets", pytest.param("pyarrow", marks=pytest.mark.slow)])
def files(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"pq-{request.param}")
    paths, expected = write_parquet(d, 120, files=3, rows_per_group=16, seed=9, writer=request.param)
    return str(d), paths, expected


def run(given, **kw):
    ds = StreamingBatches(given, kw.pop("budget", 800), 8, frames_per_second=kw.pop("fps", FPS),
                          rank=kw.pop("rank", 0), world_size=kw.pop("world_size", 1), **kw)
    return ds, [s for b in ds for s in b]


def test_rows_equal_pyarrows_own_reads(files):
    directory, paths, expected = files
    ref = {}
    for p in paths:
        for i, row in enumerate(pq.read_table(p).to_pylist()):
            ref[f"{os.path.basename(p)}/{i}"] = row
    ds, got = run(directory)
    assert ds.catalog.layouts[0].audio_column == "audio" and ds.config.read_mode == "shard"
    assert collections.Counter(s["__key__"] for s in got) == collections.Counter(set(expected))
    for s in got:
        row = ref[s["__key__"]]
        assert s["audio.flac"] == row["audio"]["bytes"] and s["audio.path"] == row["audio"]["path"]
        assert s["text"] == row["text"] and s["duration"] == row["duration"]


@pytest.mark.slow
def test_decode_and_collate(files):
    directory, _, expected = files
    _, got = run(directory, decode="audio", collate_fn=collate_audio)
    ds = StreamingBatches(directory, 800, 8, frames_per_second=FPS, rank=0, world_size=1, decode="audio",
                          collate_fn=collate_audio)
    for batch in ds:
        assert batch["audio"].dtype == torch.float32 and batch["sample_rate"] == SAMPLE_RATE
        for key, n in zip(batch["keys"], batch["audio_lengths"].tolist()):
            assert int(np.ceil(n / SAMPLE_RATE * FPS - 1e-6)) == expected[key]  # the column matches the audio


@pytest.mark.slow
def test_detection_and_spellings(files):
    directory, paths, _ = files
    ref = None
    for given, fmt in ((directory, None), (os.path.join(directory, "*.parquet"), None), (paths, None),
                       (Parquet(paths), None), (paths, "parquet")):
        _, got = run(given, format=fmt, world_size=2, rank=1)
        keys = [s["__key__"] for s in got]
        assert ref is None or keys == ref
        ref = keys
    for url in ("hf://datasets/org/name@~parquet/default/train/*.parquet",
                "https://huggingface.co/datasets/org/name/resolve/refs%2Fconvert%2Fparquet/default/train/0000.parquet",
                "s3://bucket/speech/train-{00000..00009}.parquet"):
        fmt, spec = resolve(url)
        assert fmt.name == "parquet" and spec == Parquet(url)


@pytest.mark.slow
def test_lengths_units_and_bad_values(files, tmp_path):
    directory, paths, expected = files
    with pytest.raises(ValueError, match="frames_per_second"):  # seconds without a frame rate
        StreamingBatches(directory, 800, 8, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"no column 'dur'.*\['audio', 'text', 'duration'\]"):
        StreamingBatches(directory, 800, 8, length_from="column:dur", frames_per_second=FPS, rank=0, world_size=1)
    ds, _ = run(directory, length_from="audio")  # from each row's audio header: the same lengths
    assert sorted(int(x) for x in ds.catalog.all_lengths) == sorted(expected.values())
    table = pq.read_table(paths[0])
    frames = [int(round(d * SAMPLE_RATE)) for d in table.column("duration").to_pylist()]
    bad = table.append_column("frames", __import__("pyarrow").array(frames, type="int64"))
    one = tmp_path / "one.parquet"
    pq.write_table(bad, one, row_group_size=10)
    ds, got = run(str(one), length_from="column:frames", fps=None, budget=80_000)  # an integer column: a count
    assert sorted(int(x) for x in ds.catalog.all_lengths) == sorted(frames)
    for values, match in (([1.5, None], "row 1"), ([1.5, -2.0], "row 1"), ([1.5, float("nan")], "row 1")):
        t = __import__("pyarrow").table({"duration": values})
        pq.write_table(t, tmp_path / "bad.parquet")
        with pytest.raises(ValueError, match=match):
            run(str(tmp_path / "bad.parquet"))
    pq.write_table(__import__("pyarrow").table({"duration": [1.5, 2.25]}), tmp_path / "frac.parquet")
    with pytest.raises(ValueError, match="a fraction; pass frames_per_second"):
        run(str(tmp_path / "frac.parquet"), fps=None)


@pytest.mark.slow
def test_columns_keys_and_a_changed_file(files, tmp_path):
    directory, paths, _ = files
    t = pq.read_table(paths[0]).rename_columns(["speech", "text", "duration"])
    t = t.append_column("id", __import__("pyarrow").array([f"utt{i}" for i in range(t.num_rows)]))
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(t, renamed, row_group_size=7)
    ds, got = run(Parquet(str(renamed), key_column="id"))
    assert ds.catalog.layouts[0].audio_column == "speech"  # found by its {bytes, path} type
    assert sorted(s["__key__"] for s in got) == sorted(f"utt{i}" for i in range(t.num_rows))
    assert all("speech.flac" in s for s in got)
    with pytest.raises(ValueError, match="no key column 'nope'"):
        run(Parquet(str(renamed), key_column="nope"))
    copy = tmp_path / "copy.parquet"
    shutil.copy(paths[0], copy)
    ds = StreamingBatches(str(copy), 800, 8, frames_per_second=FPS, rank=0, world_size=1)
    pq.write_table(pq.read_table(paths[1]), copy, row_group_size=5)  # rewritten after the job opened it
    with pytest.raises(ShardError, match="changed since this job opened it"):
        list(ds)


@pytest.mark.slow
def test_memory_holds_a_window_not_a_file(files, monkeypatch):
    # a worker keeps only the rows of a loaded row group it yields in this window, dropped once taken
    from streambatch.streaming.shards.corpora.parquet import ParquetRows

    directory, _, _ = files
    held = []
    orig = ParquetRows.take

    def spy(self, shard, row):
        out = orig(self, shard, row)
        held.append(len(self._rows))
        return out

    monkeypatch.setattr(ParquetRows, "take", spy)
    ds = StreamingBatches(directory, 800, 8, frames_per_second=FPS, rank=0, world_size=2, window_samples=30)
    n = sum(len(b) for b in ds)
    assert n > 0 and max(held) <= 2 * 30  # a window of this rank's rows, never the corpus
    assert held[-1] == 0


# ------------------------------------------------------------ remote (slow tier: real servers)

TOKEN = "hf_localtesttoken"
REPO = "datasets/org/speech/resolve/refs%2Fconvert%2Fparquet/default/train"


@pytest.mark.slow
def test_parquet_over_http_like_the_hub(tmp_path, monkeypatch):
    paths, expected = write_parquet(tmp_path / "src", 800, files=4, rows_per_group=25, seed=3)
    root = tmp_path / "hub"
    repo = root / REPO.replace("%2F", "/")  # nginx decodes the escaped revision, as a path
    repo.mkdir(parents=True)
    for p in paths:
        shutil.copy(p, repo)
    total = sum(os.path.getsize(p) for p in paths)
    with nginx_server(root, bearer=TOKEN) as web:
        monkeypatch.setenv("HF_ENDPOINT", web.url)  # the Hub's host gets HF_TOKEN
        monkeypatch.setenv("STREAMBATCH_INSECURE_HTTP", web.url)  # a plain-http test server: named to get the token
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        urls = [f"{web.url}/{REPO}/{os.path.basename(p)}" for p in paths]
        web.clear_log()
        world, got, read = 4, collections.Counter(), []
        for r in range(world):
            ds = StreamingBatches(urls, 800, 8, frames_per_second=FPS, rank=r, world_size=world,
                                  cache_dir=str(tmp_path / "cache"))
            if r == 0:
                planned = sum(e.body_bytes for e in web.log())
                assert planned < 0.05 * total  # planning read footers and the duration column, not the audio
            web.clear_log()
            for b in ds:
                got.update(s["__key__"] for s in b)
            read.append(sum(e.body_bytes for e in web.log()))
            assert 0 < ds.bytes_read <= read[-1]  # row groups read from the cache <= pieces downloaded
        assert set(got) == set(expected) and sum(got.values()) - len(expected) < world
        assert max(read) < 0.4 * total and sum(read) < 1.3 * total  # about 1/W each: its own row groups
        # DataLoader workers share the rank's node-local cache: each piece crosses the network once
        ds = StreamingBatches(urls, 800, 8, frames_per_second=FPS, rank=world - 1, world_size=world,
                              cache_dir=str(tmp_path / "cache"))
        web.clear_log()
        with_workers = [[s["__key__"] for s in b] for b in DataLoader(ds, batch_size=None, num_workers=2)]
        assert sum(e.body_bytes for e in web.log()) == read[-1]  # the same pieces as one process downloaded
        assert with_workers == [[s["__key__"] for s in b] for b in ds]
        with pytest.raises((ShardError, OSError), match="HF_TOKEN|401|Parquet"):
            monkeypatch.setenv("HF_TOKEN", "hf_wrong")
            StreamingBatches(urls, 800, 8, frames_per_second=FPS, rank=0, world_size=1,
                             retry=1)


@pytest.mark.slow
def test_parquet_on_s3(files, tmp_path):
    directory, paths, expected = files
    ref = {s["__key__"]: s["audio.flac"] for s in run(directory)[1]}
    with s3_server() as s3:
        s3.upload_dir("speech", directory, prefix="pq/", suffixes=(".parquet",))
        so = s3.storage_options()
        got = collections.Counter()
        for r in range(3):
            ds, samples = run("s3://speech/pq/*.parquet", rank=r, world_size=3, storage_options=so)
            assert ds.catalog.sizes.min() > 0  # remote: size and ETag checked before training
            for s in samples:
                got[s["__key__"]] += 1
                assert s["audio.flac"] == ref[s["__key__"]]
        assert set(got) == set(expected)
