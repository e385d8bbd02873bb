"""Sidecar indexing, header-only audio lengths and tar reading by offset."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from streambatch.streaming import ShardError, StreamingBatches, index_shards, length_spec, sidecar_path
from streambatch.streaming.formats.audio import audio_info, flac_info, wav_info
from streambatch.streaming.formats.tar_samples import parse_sample
from streambatch.streaming.io.reader import LocalReader
from streambatch.streaming.io.urls import expand_urls
from streambatch.streaming.shards.sidecar import read_arrays, read_meta, shard_stat, write_sidecar
from tests.support.corpus import index_corpus
from tests.support.shards import FPS, SAMPLE_RATE, audio_bytes, wds_samples, write_with_shardwriter


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([12, 0, 9, 15], seed=3, name="idx", local=False)  # unindexed: the indexer is under test
    return c.brace, c.paths, c.expected


def _fresh(corpus, tmp_path):
    """A private copy of the corpus (tests that modify shards)."""
    _, paths, expected = corpus
    out = []
    for p in paths:
        q = tmp_path / os.path.basename(p)
        shutil.copyfile(p, q)
        out.append(str(q))
    return out, expected


def test_sidecar_matches_webdataset(corpus, tmp_path):
    paths, expected = _fresh(corpus, tmp_path)
    summary = index_corpus(paths)
    assert (summary.shards, summary.indexed, summary.samples) == (4, 4, len(expected))
    assert summary.total_length == sum(expected.values())
    assert summary.percentiles["max"] == max(expected.values())
    ref = {s["__key__"]: s for s in wds_samples(paths)}
    reader = LocalReader()
    keys_in_order = []
    for p in paths:
        keys, lengths, offsets, sizes = read_arrays(sidecar_path(p), ("keys", "lengths", "offsets", "sizes"))
        for k, n, off, size in zip(keys, lengths, offsets, sizes):
            k = k.decode()
            keys_in_order.append(k)
            assert n == expected[k]
            got = parse_sample(reader.read(p, int(off), int(size)), p, int(off), k)
            want = {m: v for m, v in ref[k].items() if m != "__local_path__"}
            assert got == want
    assert keys_in_order == list(ref)  # tar order, webdataset's grouping
    # reading every sample by offset reads each shard's sample bytes once
    assert reader.bytes_read <= sum(os.path.getsize(p) for p in paths)


def test_current_sidecars_are_skipped_and_stale_ones_redone(corpus, tmp_path):
    paths, _ = _fresh(corpus, tmp_path)
    assert index_shards(paths, frames_per_second=FPS, workers=2, progress=False).indexed == 4
    assert index_shards(paths, frames_per_second=FPS, workers=2, progress=False).indexed == 0
    # a copy with a new mtime but the same bytes is still current
    shutil.copyfile(paths[0], paths[0] + ".bak")
    os.replace(paths[0] + ".bak", paths[0])
    os.utime(paths[0], ns=(1, 1))
    assert index_corpus(paths).indexed == 0
    # a shard that changed is stale: refused when streaming, redone by indexing
    with open(paths[2], "ab") as f:
        f.write(bytes(1024))
    with pytest.raises(FileNotFoundError, match=r"stale.*streambatch index --force"):
        StreamingBatches(paths, 400, 8)
    assert index_corpus(paths).indexed == 1
    # another length source counts as stale too
    assert index_shards(paths, length_from="audio", workers=1, progress=False).indexed == 4
    assert index_shards(paths, length_from="audio", workers=1, progress=False, force=True).indexed == 4


def test_missing_sidecar_names_the_command_or_indexes_on_the_fly(corpus, tmp_path):
    paths, expected = _fresh(corpus, tmp_path)
    pattern = str(tmp_path / "train-{000000..000003}.tar")
    with pytest.raises(FileNotFoundError, match=r"streambatch index .*train-\{000000\.\.000003\}.*index_missing=True"):
        StreamingBatches(pattern, 400, 8)
    ds = StreamingBatches(pattern, 400, 8, index_missing=True, frames_per_second=FPS, length_from="json:duration")
    assert ds.catalog.num_samples == len(expected)
    assert all(os.path.exists(sidecar_path(p)) for p in paths)


def test_audio_header_lengths(corpus, tmp_path):
    paths, expected = _fresh(corpus, tmp_path)
    index_shards(paths, length_from="audio", workers=1, progress=False)
    index_dir = tmp_path / "fps"
    index_shards(paths, length_from="audio", frames_per_second=FPS, index_dir=str(index_dir), workers=1,
                 progress=False)
    ref = {s["__key__"]: s for s in wds_samples(paths)}
    for p in paths:
        keys, frames = read_arrays(sidecar_path(p), ("keys", "lengths"))
        (scaled,) = read_arrays(sidecar_path(p, str(index_dir)), ("lengths",))
        for k, n, m in zip(keys, frames, scaled):
            s = ref[k.decode()]
            audio = s.get("wav") or s.get("flac")
            info = soundfile.info(io.BytesIO(audio))
            assert n == info.frames
            assert m == expected[k.decode()]


@pytest.mark.parametrize("fmt", ["wav", "flac"])
@pytest.mark.parametrize("channels", [1, 2])
def test_header_parsers_agree_with_soundfile(fmt, channels):
    rng = np.random.default_rng(channels)
    for frames in (1, 17, 4096, 12345):
        data = audio_bytes(frames, fmt, rng, channels=channels)
        info = soundfile.info(io.BytesIO(data))
        got = wav_info(data, len(data)) if fmt == "wav" else flac_info(data)
        assert got == (info.frames, info.samplerate) == (frames, SAMPLE_RATE)
        assert audio_info(data[:200], fmt, len(data)) == got


def test_wav_written_as_a_stream_uses_the_member_size():
    data = bytearray(audio_bytes(1000, "wav", np.random.default_rng(0)))
    pos = data.index(b"data")
    data[pos + 4 : pos + 8] = (0xFFFFFFFF).to_bytes(4, "little")
    assert wav_info(bytes(data), len(data)) == (1000, SAMPLE_RATE)


def test_length_function_and_parallel_workers(corpus, tmp_path):
    paths, expected = _fresh(corpus, tmp_path)
    summary = index_shards(paths, length_from=lambda s: json.loads(s["json"])["duration"],
                           frames_per_second=FPS, workers=2, progress=False)
    assert summary.total_length == sum(expected.values())


def test_shardwriter_shards(tmp_path):
    paths = write_with_shardwriter(tmp_path, 25, maxcount=10)
    assert len(paths) == 3
    summary = index_corpus(paths)
    assert summary.samples == 25
    ds = StreamingBatches(paths, 300, 8, window_samples=10, world_size=1, rank=0)
    keys = sorted(s["__key__"] for b in ds for s in b)
    assert keys == [f"k{n:05d}" for n in range(25)]


def test_pipe_urls_need_index_dir_and_stream(corpus, tmp_path):
    paths, expected = _fresh(corpus, tmp_path)
    pipes = [f"pipe:cat {p}" for p in paths]
    with pytest.raises(ValueError, match="index_dir"):
        index_corpus(pipes)
    idx = str(tmp_path / "sidecars")
    assert index_shards(pipes, frames_per_second=FPS, index_dir=idx, workers=1, progress=False).samples == len(expected)
    local_idx = str(tmp_path / "local")
    index_shards(paths, frames_per_second=FPS, index_dir=local_idx, workers=1, progress=False)
    for p in paths:  # the stream scan and the seeking scan agree byte for byte
        a = read_arrays(sidecar_path(f"pipe:cat {p}", idx), ("keys", "lengths", "offsets", "sizes"))
        b = read_arrays(sidecar_path(p, local_idx), ("keys", "lengths", "offsets", "sizes"))
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(FileNotFoundError, match="not local files"):
        StreamingBatches(pipes, 400, 8, index_dir=str(tmp_path / "nowhere"))
    remote = StreamingBatches(pipes, 400, 8, index_dir=idx, world_size=2, rank=1, read_mode="sample")
    local = StreamingBatches(paths, 400, 8, index_dir=local_idx, world_size=2, rank=1)
    got = [[(s["__key__"], s["json"]) for s in b] for b in remote]
    want = [[(s["__key__"], s["json"]) for s in b] for b in local]
    assert got == want
    assert remote.bytes_read >= local.bytes_read  # a stream is read up to each needed sample


def test_corrupt_and_truncated_shards_name_shard_and_offset(corpus, tmp_path):
    paths, _ = _fresh(corpus, tmp_path)
    index_corpus(paths)
    keys, offsets = read_arrays(sidecar_path(paths[0]), ("keys", "offsets"))
    bad_at = int(offsets[3])
    with open(paths[0], "r+b") as f:
        f.seek(bad_at + 10)
        f.write(b"\xff\xfe")
    name = os.path.basename(paths[0])
    with pytest.raises(ShardError, match=rf"corrupt tar header in shard .*{name} at byte {bad_at}"):
        index_corpus(paths[:1], force=True)
    size = os.path.getsize(paths[2])
    with open(paths[2], "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ShardError, match=rf"{os.path.basename(paths[2])} is truncated"):
        index_corpus(paths[2:3], force=True)
    with open(tmp_path / "x.tar.gz", "wb") as f:
        f.write(b"\x1f\x8b" + bytes(600))
    with pytest.raises(ShardError, match="compressed"):
        index_shards([str(tmp_path / "x.tar.gz")], workers=1, progress=False)
    with pytest.raises(ShardError, match="cannot open shard"):
        index_shards([str(tmp_path / "missing.tar")], workers=1, progress=False)


def test_bad_length_sources(corpus, tmp_path):
    paths, _ = _fresh(corpus, tmp_path)
    with pytest.raises(ValueError, match="fraction.*frames_per_second"):
        index_shards(paths[:1], length_from="json:duration", workers=1, progress=False)
    with pytest.raises(ValueError, match="cannot read field 'nope'"):
        index_shards(paths[:1], length_from="json:nope", workers=1, progress=False)
    with pytest.raises(ValueError, match="length_from must be"):
        length_spec("duration")
    with pytest.raises(ValueError, match="frames_per_second must be"):
        length_spec("audio", 0)
    with pytest.raises(ValueError, match="empty"):
        expand_urls([])
    with pytest.raises(ValueError, match="listed twice"):
        expand_urls(["a.tar", "a.tar"])
    with pytest.raises(TypeError, match="urls must be"):
        expand_urls(3)


def test_sidecar_meta_records_identity(corpus, tmp_path):
    paths, _ = _fresh(corpus, tmp_path)
    index_corpus(paths[:1])
    meta = read_meta(sidecar_path(paths[0]))
    assert meta["size"] == os.path.getsize(paths[0])
    assert meta["length_from"] == "json:duration*100/s"
    assert meta == {**meta, **shard_stat(paths[0])}
    # rewriting a sidecar is atomic and leaves no temp files behind
    arrays = dict(zip(("keys", "lengths", "offsets", "sizes"),
                      read_arrays(sidecar_path(paths[0]), ("keys", "lengths", "offsets", "sizes"))))
    write_sidecar(sidecar_path(paths[0]), paths[0], arrays, length_spec("json:duration", FPS), shard_stat(paths[0]))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_demo_corpus_is_reproducible_and_streams(tmp_path):
    from streambatch.cli.corpus import make_shards

    a = make_shards(str(tmp_path / "a"), 2, 6, seed=4, sample_rate=8000, median_seconds=0.5, speech="generated")
    b = make_shards(str(tmp_path / "b"), 2, 6, seed=4, sample_rate=8000, median_seconds=0.5, speech="generated")
    assert [Path(x).read_bytes() for x in a] == [Path(x).read_bytes() for x in b]
    summary = index_shards(a, frames_per_second=50, workers=1, progress=False)
    assert summary.samples == 12
    assert oct(os.stat(sidecar_path(a[0])).st_mode & 0o777) == oct(0o666 & ~_umask())
    metas = [json.loads(s["json"]) for s in wds_samples(a)]
    assert all(0.5 <= m["duration"] <= 20 and m["sample_rate"] == 8000 for m in metas)
    ds = StreamingBatches(a, 200, 4, decode="audio", window_samples=12)
    got = [s for batch in ds for s in batch]
    assert sorted(s["__key__"] for s in got) == [f"utt{n:09d}" for n in range(12)]
    assert all(abs(s["flac"][0].shape[1] / 8000 - s["json"]["duration"]) < 1e-3 for s in got)


def _umask():
    from streambatch.streaming.shards.sidecar import _umask as u

    return u()
