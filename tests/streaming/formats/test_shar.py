"""Lhotse Shar through StreamingBatches: corpora written by lhotse's own
SharWriter, samples compared with lhotse's own Shar reader, lengths from the
cuts files alone, damage and mistakes reported, and (slow tier) the same
corpus over S3 (moto) and HTTP (nginx)."""

from __future__ import annotations

import collections
import gzip
import os
import shutil

import numpy as np
import pytest

from streambatch.streaming import Shar, ShardError, StreamingBatches
from tests.support.corpora import FPS, write_shar
from tests.support.servers import nginx_server, s3_server

lhotse = pytest.importorskip("lhotse")


@pytest.fixture(scope="module")
def shar(tmp_path_factory):
    return write_shar(tmp_path_factory.mktemp("shar"), 60, shard_size=16, seed=11)


def samples(ds):
    return {s["__key__"]: s for b in ds for s in b}


def test_samples_equal_lhotses_own_reader(shar):
    directory, expected = shar
    ds = StreamingBatches(directory, 800, 8, frames_per_second=FPS, decode="audio", rank=0, world_size=1)
    got = samples(ds)
    ref = {c.id: c for c in lhotse.CutSet.from_shar(in_dir=directory)}
    assert set(got) == set(ref) == set(expected)
    for key, cut in ref.items():
        audio, rate = got[key]["recording.flac"]
        assert rate == cut.sampling_rate
        np.testing.assert_allclose(audio.numpy(), cut.load_audio(), atol=1e-6)
        assert got[key]["cut.json"]["supervisions"][0]["text"] == cut.supervisions[0].text
        assert got[key]["recording.json"]["num_samples"] == cut.recording.num_samples
        assert cut.id.count(".") == 1  # ids hold dots: members are paired, not split at the first dot


@pytest.mark.slow
def test_detected_named_and_spelled_out(shar):
    directory, expected = shar
    files = sorted(os.listdir(directory))
    fields = {"cuts": [os.path.join(directory, f) for f in files if f.startswith("cuts.")],
              "recording": [os.path.join(directory, f) for f in files if f.startswith("recording.")]}
    ref = None
    for given, fmt in ((directory, None), (directory, "shar"), (Shar(directory), None), (Shar(fields=fields), None)):
        ds = StreamingBatches(given, 800, 8, frames_per_second=FPS, rank=0, world_size=1, format=fmt)
        keys = [tuple(s["__key__"] for s in b) for b in ds]
        assert ref is None or keys == ref
        ref = keys
    assert collections.Counter(k for b in ref for k in b) == collections.Counter(set(expected))


def test_no_audio_is_read_to_plan(shar, monkeypatch):
    # the catalog, len() and the epoch summary come from the cuts files: no tar is opened
    from streambatch.streaming.shards.corpora import base

    directory, _ = shar
    opened = []
    monkeypatch.setattr(base, "scan_members", lambda *a, **k: opened.append(a) or [])
    ds = StreamingBatches(directory, 800, 8, frames_per_second=FPS, rank=0, world_size=2)
    assert len(ds) == ds.epoch_summary().steps > 0 and not opened


@pytest.mark.slow
def test_length_from_any_cut_field_and_units(shar):
    directory, expected = shar
    with pytest.raises(ValueError, match="frames_per_second"):  # durations are seconds
        StreamingBatches(directory, 800, 8, rank=0, world_size=1)
    ds = StreamingBatches(directory, 80_000, 8, length_from="json:recording.num_samples", rank=0, world_size=1)
    assert int(ds.catalog.all_lengths.max()) > 1000  # sample counts, as integers
    with pytest.raises(ValueError, match="no field 'nope'"):
        StreamingBatches(directory, 800, 8, length_from="json:nope", frames_per_second=FPS, rank=0, world_size=1)


@pytest.mark.slow
def test_mismatched_or_changed_shards_are_refused(shar, tmp_path):
    directory, _ = shar
    bad = tmp_path / "bad"
    shutil.copytree(directory, bad)
    # another shard's tar under this shard's name: the cut ids differ from the cuts file's
    shutil.copy(bad / "recording.000001.tar", bad / "recording.000000.tar")
    shutil.copy(bad / "cuts.000001.jsonl.gz", bad / "cuts.000000.jsonl.gz")  # keep the counts plausible
    with open(bad / "cuts.000000.jsonl.gz", "rb") as f:
        lines = gzip.decompress(f.read()).splitlines()
    with open(bad / "cuts.000000.jsonl.gz", "wb") as f:
        f.write(gzip.compress(b"\n".join(lines[1:] + lines[:1]) + b"\n"))  # same cuts, another order
    ds = StreamingBatches(str(bad), 800, 8, frames_per_second=FPS, rank=0, world_size=1)
    with pytest.raises(ShardError, match="not one shard|belongs to cut"):
        samples(ds)
    skipping = StreamingBatches(str(bad), 800, 8, frames_per_second=FPS, rank=0, world_size=1, on_error="skip")
    got = samples(skipping)
    assert skipping.num_skipped == 16 and len(got) == 60 - 16  # that shard's cuts, counted
    os.remove(bad / "recording.000002.tar")
    with pytest.raises(FileNotFoundError, match="do not pair up"):
        StreamingBatches(str(bad), 800, 8, frames_per_second=FPS, rank=0, world_size=1)
    with pytest.raises(ValueError, match="compressed tar"):
        Shar(fields={"cuts": ["c.jsonl.gz"], "recording": ["r.tar.gz"]}).files(None)
    with pytest.raises(ValueError, match="not both"):
        Shar(in_dir=directory, fields={"cuts": [], "recording": []})


# ------------------------------------------------------------ remote (slow tier: real servers)


@pytest.mark.slow
def test_shar_over_s3_and_http(shar, tmp_path):
    directory, expected = shar
    local = {r: [tuple(s["__key__"] for s in b) for b in StreamingBatches(directory, 800, 8, frames_per_second=FPS,
                                                                         rank=r, world_size=2, read_mode="shard")]
             for r in range(2)}
    audio = {k: s["recording.flac"] for k, s in samples(StreamingBatches(directory, 800, 8, frames_per_second=FPS,
                                                                       rank=0, world_size=1)).items()}
    with s3_server() as s3:
        s3.upload_dir("corpus", directory, prefix="shar/", suffixes=(".tar", ".gz"))
        so = s3.storage_options()
        got = collections.Counter()
        for r in range(2):
            ds = StreamingBatches("s3://corpus/shar", 800, 8, frames_per_second=FPS, rank=r, world_size=2,
                                  format="shar", storage_options=so, cache_dir=str(tmp_path / "cache"))
            assert ds.config.read_mode == "shard"  # remote: each rank streams its own slice
            batches = list(ds)
            assert [tuple(s["__key__"] for s in b) for b in batches] == local[r]  # the same plan as local files
            for b in batches:
                for s in b:
                    got[s["__key__"]] += 1
                    assert s["recording.flac"] == audio[s["__key__"]]
        assert set(got) == set(expected)
    with nginx_server(directory) as web:  # no listing over HTTP: the files spelled out, as for lhotse
        n = len([f for f in os.listdir(directory) if f.startswith("cuts.")])
        fields = {"cuts": f"{web.url}/cuts.{{000000..{n - 1:06d}}}.jsonl.gz",
                  "recording": f"{web.url}/recording.{{000000..{n - 1:06d}}}.tar"}
        ds = StreamingBatches(Shar(fields=fields), 800, 8, frames_per_second=FPS, rank=0, world_size=1,
                              cache_dir=str(tmp_path / "cache2"))
        assert {k: s["recording.flac"] for k, s in samples(ds).items()} == audio
