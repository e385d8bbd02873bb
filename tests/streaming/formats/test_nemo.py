"""NeMo tarred audio through StreamingBatches: tars and manifests in the
layout of NeMo's convert_to_tarred_audio_dataset.py (tests/support/corpora.py),
samples compared with plain tarfile reads of the members the manifest names,
one manifest or sharded ones (NeMo's _OP_/_CL_ braces too), the -subN
entries, damage reported, and (slow tier) the corpus on S3."""

from __future__ import annotations

import collections
import json
import os
import shutil
import tarfile

import pytest

from streambatch.streaming import NemoTarred, ShardError, StreamingBatches
from streambatch.streaming.shards.corpora.nemo import member_name, nemo_braces
from tests.support.corpora import FPS, write_nemo
from tests.support.servers import s3_server


@pytest.fixture(scope="module")
def nemo(tmp_path_factory):
    return write_nemo(tmp_path_factory.mktemp("nemo"), 40, num_shards=4, seed=2)


def run(given, **kw):
    ds = StreamingBatches(given, 800, 8, frames_per_second=FPS, rank=kw.pop("rank", 0),
                          world_size=kw.pop("world_size", 1), **kw)
    return ds, [s for b in ds for s in b]


def reference(directory):
    """{key: (audio bytes, manifest entry)} read with tarfile, member by the manifest's name."""
    out = {}
    with open(os.path.join(directory, "tarred_audio_manifest.json")) as f:
        entries = [json.loads(line) for line in f]
    for e in entries:
        with tarfile.open(os.path.join(directory, f"audio_{e['shard_id']}.tar")) as tar:
            data = tar.extractfile(member_name(e)).read()
        out[os.path.splitext(e["audio_filepath"])[0]] = (data, e)
    return out


def test_samples_equal_the_members_the_manifest_names(nemo):
    directory, expected = nemo
    ref = reference(directory)
    _, got = run(directory)
    assert collections.Counter(s["__key__"] for s in got) == collections.Counter(set(expected))
    subs = [s for s in got if "-sub1" in s["__key__"]]
    assert len(subs) == 1  # the entry NeMo's converter wrote as a second use of one file
    for s in got:
        data, entry = ref[s["__key__"]]
        assert s["wav"] == data and json.loads(s["json"]) == entry
    assert subs[0]["wav"] == ref[subs[0]["__key__"].replace("-sub1", "")][0]


@pytest.mark.slow
def test_one_manifest_sharded_manifests_and_nemo_braces(nemo):
    directory, _ = nemo
    sharded = os.path.join(directory, "sharded_manifests", "manifest__OP_0..3_CL_.json")
    assert nemo_braces(sharded).endswith("manifest_{0..3}.json")
    tars = os.path.join(directory, "audio__OP_0..3_CL_.tar")
    ref = None
    for given in (directory, os.path.join(directory, "tarred_audio_manifest.json"), sharded,
                  NemoTarred(sharded, tars), NemoTarred(os.path.join(directory, "tarred_audio_manifest.json"), tars)):
        ds, got = run(given, world_size=2, rank=1)
        keys = [s["__key__"] for s in got]
        assert ref is None or keys == ref  # the same plan whichever way the corpus is named
        ref = keys
    assert ds.catalog.urls == tuple(os.path.join(directory, f"audio_{i}.tar") for i in range(4))


def test_lengths_from_the_manifests_alone(nemo):
    directory, expected = nemo
    ds, _ = run(directory)
    assert sorted(int(x) for x in ds.catalog.all_lengths) == sorted(expected.values())
    with pytest.raises(ValueError, match="frames_per_second"):
        StreamingBatches(directory, 800, 8, rank=0, world_size=1)


@pytest.mark.slow
def test_damage_and_mistakes(nemo, tmp_path):
    directory, _ = nemo
    bad = tmp_path / "bad"
    shutil.copytree(directory, bad, ignore=shutil.ignore_patterns("source"))
    with tarfile.open(bad / "audio_1.tar", "w"):  # shard 1's tar lost its members
        pass
    with pytest.raises(ShardError, match="has no member"):
        run(str(bad))
    ds, got = run(str(bad), on_error="skip")
    assert ds.num_skipped == 10 and len(got) == 41 - 10
    lines = (bad / "tarred_audio_manifest.json").read_text().splitlines()
    (bad / "broken.json").write_text("\n".join([lines[0], json.dumps({"duration": 1.0, "shard_id": 0})]) + "\n")
    with pytest.raises(ValueError, match="no audio_filepath"):
        run(str(bad / "broken.json"))
    (bad / "broken.json").write_text(json.dumps({"audio_filepath": "x.wav", "duration": 1.0}) + "\n")
    with pytest.raises(ValueError, match="shard_id"):
        run(str(bad / "broken.json"))


@pytest.mark.slow
def test_nemo_on_s3(nemo, tmp_path):
    directory, expected = nemo
    ref = reference(directory)
    with s3_server() as s3:
        s3.upload_dir("corpus", directory, prefix="nemo/", suffixes=(".tar", ".json"))
        so = s3.storage_options()
        got = collections.Counter()
        for r in range(2):
            _, samples = run("s3://corpus/nemo/tarred_audio_manifest.json", rank=r, world_size=2, storage_options=so,
                             cache_dir=str(tmp_path / "cache"))
            for s in samples:
                got[s["__key__"]] += 1
                assert s["wav"] == ref[s["__key__"]][0]
        assert set(got) == set(expected)
