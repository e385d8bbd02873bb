"""Catalogs served over HTTP by a real nginx on 127.0.0.1, and shard URLs
carrying credentials over real HTTP: a remote catalog's ``pipe:`` and local
entries are refused before anything runs or opens them (the reproduction of
the issue: a marker file created after one batch), relative entries are
fetched from the catalog's own server, and no credential in a shard URL
reaches an error, its traceback, a warning or another rank."""

from __future__ import annotations

import logging
import os
import traceback

import pytest

from streambatch.streaming import ShardError, StreamingBatches, index_shards
from streambatch.streaming.io.retry import RetryPolicy
from streambatch.streaming.shards.catalog_trust import UntrustedCatalogError
from tests.support.corpus import index_corpus
from tests.support.servers import nginx_server
from tests.support.shards import FPS, write_corpus

pytestmark = pytest.mark.slow

SIZES = [14, 9, 12, 10]
TOKEN, SIGNATURE = "s3cr3tT0kenValue42", "a1b2c3d4e5f6SIGNATUREdeadbeef"


def keys(ds):
    return [[s["__key__"] for s in b] for b in ds]


def assert_clean(text):
    assert TOKEN not in text and SIGNATURE not in text, text[:3000]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A directory nginx serves: shards, and the catalogs the tests write into it."""
    root = tmp_path_factory.mktemp("www")
    _, paths, expected = write_corpus(root, SIZES, seed=9)
    with nginx_server(root) as ng:
        yield root, ng, paths, expected


def test_a_served_catalog_cannot_run_commands(served, tmp_path):
    root, ng, paths, _ = served
    marker = tmp_path / "ran"
    pipes = [f"pipe:touch {marker}; cat {p}" for p in paths]
    index_shards(pipes, frames_per_second=FPS, index_dir=str(root / "pipes"), workers=1, progress=False,
                 catalog=str(root / "pipes" / "streambatch.catalog.npz"))
    marker.unlink()
    with pytest.raises(UntrustedCatalogError, match=r"lists shard 0 as 'pipe:touch .*sh -c"):
        ds = StreamingBatches(f"{ng.url}/pipes/streambatch.catalog.npz", 400, 8, cache_dir=str(tmp_path / "c"))
        next(iter(ds))
    assert not marker.exists()


def test_a_served_catalog_cannot_read_local_files(served, tmp_path):
    root, ng, paths, _ = served
    index_corpus(paths, catalog=str(root / "local.catalog.npz"))
    with pytest.raises(UntrustedCatalogError, match=r"this machine's disk, listed by a catalog that is not on it"):
        StreamingBatches(f"{ng.url}/local.catalog.npz", 400, 8, cache_dir=str(tmp_path / "c"))
    ds = StreamingBatches(f"{ng.url}/local.catalog.npz", 400, 8, cache_dir=str(tmp_path / "c"),
                          trust_catalog={"file"})
    assert sum(len(b) for b in ds) == sum(SIZES)


def test_relative_entries_come_from_the_catalogs_server(served, tmp_path, monkeypatch):
    root, ng, _, expected = served
    monkeypatch.chdir(root)
    # stored as train-000000.tar, train-000000.tar.idx.npz
    index_corpus("train-{000000..000003}.tar", catalog="rel.catalog.npz")
    monkeypatch.chdir(tmp_path)  # nothing of the corpus here: every byte must come over HTTP
    ng.clear_log()
    ds = StreamingBatches(f"{ng.url}/rel.catalog.npz", 400, 8, cache_dir=str(tmp_path / "c"))
    assert ds.catalog.urls[0] == f"{ng.url}/train-000000.tar" and ds.config.read_mode == "shard"
    assert sorted(k for b in keys(ds) for k in b) == sorted(expected)
    fetched = {e.path for e in ng.log() if e.method == "GET"}
    assert "/train-000000.tar" in fetched and "/train-000000.tar.idx.npz" in fetched


def test_credentials_in_shard_urls_reach_no_message(served, tmp_path, caplog):
    root, ng, _, _ = served
    secret = [f"http://alice:{TOKEN}@127.0.0.1:{ng.port}/train-{i:06d}.tar?X-Amz-Signature={SIGNATURE}"
              for i in range(len(SIZES))]
    idx = str(tmp_path / "idx")
    index_shards(secret, frames_per_second=FPS, index_dir=idx, workers=2, progress=False, catalog=False)

    def broken(sample):
        raise RuntimeError(f"cannot decode {sample['__url__']}")

    ds = StreamingBatches(secret, 400, 8, index_dir=idx, decode=broken, cache_dir=str(tmp_path / "c"))
    assert_clean(repr(ds) + repr(ds.catalog) + repr(ds.remote))
    with pytest.raises(ShardError, match="decoding sample") as info:
        next(iter(ds))
    assert_clean("".join(traceback.format_exception(info.value)))
    skip = StreamingBatches(secret, 400, 8, index_dir=idx, decode=broken, on_error="skip",
                            cache_dir=str(tmp_path / "c2"))
    with caplog.at_level(logging.WARNING, logger="streambatch"):
        assert sum(len(b) for b in skip) == 0
    assert skip.num_skipped == sum(SIZES)
    with pytest.raises(ValueError, match="longer than max_length") as info:
        StreamingBatches(secret, 400, 8, index_dir=idx, max_length=2, long_samples="raise")
    assert_clean("".join(traceback.format_exception(info.value)))
    # a shard gone from the server: the backend's own exception (which quotes the URL) is chained in
    gone = secret[:1] + [secret[1].replace("train-000001", "missing-000001")]
    os.link(os.path.join(idx, "train-000001.tar.idx.npz"), os.path.join(idx, "missing-000001.tar.idx.npz"))
    ds = StreamingBatches(gone, 400, 8, index_dir=idx, cache_dir=str(tmp_path / "c3"), verify=False,
                          retry=RetryPolicy(retries=1, backoff=0.01))
    with caplog.at_level(logging.WARNING, logger="streambatch"), pytest.raises(ShardError) as info:
        list(ds)
    assert_clean("".join(traceback.format_exception(info.value)))
    assert "***" in caplog.text
    assert_clean(caplog.text)
