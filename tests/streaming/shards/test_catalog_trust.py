"""A catalog's entries are data, never commands (``streaming/shards/catalog_trust.py``):
``pipe:`` entries refused unless trusted, a remote catalog limited to its own
storage, relative entries resolved against the catalog's location, version 1
catalogs still loading. Local catalogs here; the same served by nginx in
``tests/streaming/shards/test_catalog_trust_servers.py``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from streambatch.streaming import StreamingBatches, index_shards, open_catalog
from streambatch.streaming.io.ranged import load_npz
from streambatch.streaming.shards.catalog_file import _text, catalog_arrays, read_catalog, write_catalog
from streambatch.streaming.shards.catalog_trust import UntrustedCatalogError, check_trust, refusal, resolve
from tests.support.corpus import index_corpus
from tests.support.shards import FPS, write_corpus

SIZES = [14, 9, 12]


def keys(ds):
    return [[s["__key__"] for s in b] for b in ds]


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize(("catalog", "entry", "refused"), [
    ("/data/c.catalog.npz", "pipe:curl -s https://h/a.tar", "pipe: command"),
    ("https://h/d/c.catalog.npz", "pipe:curl -s https://h/a.tar", "pipe: command"),
    ("https://h/d/c.catalog.npz", "/etc/passwd", "this machine's disk"),
    ("https://h/d/c.catalog.npz", "file:///home/u/.ssh/id_rsa", "this machine's disk"),
    ("s3://b/d/c.catalog.npz", "https://elsewhere/a.tar", "a https:// URL, listed by a catalog in s3://"),
    ("https://h/d/c.catalog.npz", "s3://b/a.tar", "a s3:// URL"),
    # another origin (scheme, host, port; a bucket for object stores): issue 32 (it would get the credentials)
    ("https://h/d/c.catalog.npz", "http://h/d/a.tar", "another origin (http://h:80)"),
    ("https://h/d/c.catalog.npz", "https://h/e/a.tar", None),
    ("gs://b/c.catalog.npz", "gcs://b/a.tar", None),
    ("s3://b/d/c.catalog.npz", "s3://other-bucket/a.tar", "another origin (s3://other-bucket)"),
    ("/data/c.catalog.npz", "https://h/a.tar", None),  # the documented local catalog of HTTP shards
    ("/data/c.catalog.npz", "/data/a.tar", None),
    ("/data/c.catalog.npz", "file:///data/a.tar", None),
])
def test_what_a_catalog_may_list(catalog, entry, refused):
    why = refusal(catalog, entry, False)
    assert (why is None) if refused is None else (refused in why), why


def test_trust_lifts_the_rules():
    assert refusal("https://h/c.catalog.npz", "pipe:cat a.tar", True) is None
    assert refusal("https://h/c.catalog.npz", "pipe:cat a.tar", check_trust({"pipe"})) is None
    assert refusal("https://h/c.catalog.npz", "/a.tar", check_trust({"pipe"})) is not None
    assert refusal("https://h/c.catalog.npz", "/a.tar", check_trust(["file"])) is None
    for bad in ("pipe", 1, [1], None):
        with pytest.raises(TypeError, match="trust_catalog must be"):
            check_trust(bad)


def test_relative_entries_resolve_against_the_catalog():
    assert resolve("https://h/d/c.catalog.npz?X-Amz-Signature=s", "a.tar", 2) == "https://h/d/a.tar"
    assert resolve("s3://b/d/c.catalog.npz", "../e/a.tar", 1) == "s3://b/e/a.tar"  # never the local disk
    assert resolve("/data/d/c.catalog.npz", "a.tar", 2) == "/data/d/a.tar"
    assert resolve("d/c.catalog.npz", "sub/a.tar", 2) == os.path.join("d", "sub", "a.tar")
    assert resolve("d/c.catalog.npz", "d/a.tar", 1) == "d/a.tar"  # version 1: as the indexer was given it
    assert resolve("/x/c.catalog.npz", "pipe:cat a.tar", 2) == "pipe:cat a.tar"


# ---------------------------------------------------------------- pipe: entries, for real


@pytest.fixture
def pipe_catalog(tmp_path):
    """A local catalog of pipe: shards whose command also touches a marker file."""
    _, paths, expected = write_corpus(tmp_path / "shards", SIZES, seed=6)
    marker = tmp_path / "ran"
    pipes = [f"pipe:touch {marker}; cat {p}" for p in paths]
    cat = str(tmp_path / "idx" / "streambatch.catalog.npz")
    index_shards(pipes, frames_per_second=FPS, index_dir=str(tmp_path / "idx"), workers=1, progress=False,
                 catalog=cat)
    os.unlink(marker)  # indexing ran the commands: that was the user's own list
    return cat, marker, sorted(expected)


def test_pipe_entries_of_a_catalog_are_refused(pipe_catalog, tmp_path):
    cat, marker, _ = pipe_catalog
    for make in (lambda: StreamingBatches(cat, 400, 8, cache_dir=str(tmp_path / "c")),
                 lambda: open_catalog(cat)):
        with pytest.raises(UntrustedCatalogError, match=r"lists shard 0 as 'pipe:touch .*sh -c.*trust_catalog=True"):
            make()
    assert not marker.exists()


@pytest.mark.parametrize("trust", [True, {"pipe"}])
def test_a_trusted_catalog_runs_its_pipes(pipe_catalog, tmp_path, trust):
    cat, marker, expected = pipe_catalog
    ds = StreamingBatches(cat, 400, 8, cache_dir=str(tmp_path / "c"), trust_catalog=trust)
    assert sorted(k for b in keys(ds) for k in b) == expected and marker.exists()


# ---------------------------------------------------------------- relative entries, version 1


def test_catalog_entries_are_relative_to_the_catalog(tmp_path, monkeypatch):
    write_corpus(tmp_path / "data", SIZES, seed=7)
    monkeypatch.chdir(tmp_path)
    cat = os.path.join("data", "streambatch.catalog.npz")
    index_corpus("data/train-{000000..000002}.tar", catalog=cat)
    with load_npz(cat) as z:
        stored = z["urls"].tobytes().decode().split("\n")
    assert stored == [f"train-{i:06d}.tar" for i in range(3)]
    here = keys(StreamingBatches(cat, 400, 8))
    monkeypatch.chdir(tmp_path / "data")  # another working directory: the catalog still finds its shards
    there = StreamingBatches(os.path.join(tmp_path, cat), 400, 8)
    assert keys(there) == here and there.catalog.urls[0] == str(tmp_path / "data" / "train-000000.tar")


def test_version_1_catalogs_still_load(tmp_path, monkeypatch):
    write_corpus(tmp_path / "data", SIZES, seed=8)
    monkeypatch.chdir(tmp_path)
    brace = "data/train-{000000..000002}.tar"
    index_corpus(brace, catalog=False)
    v2 = str(tmp_path / "v2.catalog.npz")
    index_corpus(brace, catalog=v2)
    c = read_catalog(v2)
    metas = [{"etag": e or None, "digest": d, "size": int(s) if s >= 0 else None}
             for e, d, s in zip(c["etags"], c["digests"], c["sizes"])]
    lengths = np.split(c["lengths"], np.cumsum(c["counts"])[:-1])
    urls = [f"data/train-{i:06d}.tar" for i in range(3)]  # as streambatch 0.1 stored them: cwd-relative
    meta, arrays = catalog_arrays(urls, urls, metas, lengths, c["meta"]["length_from"], at=v2)
    arrays["urls"], arrays["sidecars"] = _text(urls), _text([u + ".idx.npz" for u in urls])
    meta["version"] = 1
    v1 = str(tmp_path / "sub" / "v1.catalog.npz")
    write_catalog(v1, meta, arrays)
    assert json.loads(load_npz(v1)["meta"].tobytes())["version"] == 1
    assert keys(StreamingBatches(v1, 400, 8)) == keys(StreamingBatches(brace, 400, 8))
