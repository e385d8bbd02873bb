"""The cache's disk is the machine's, not the sample's: an unusable
``cache_dir`` is refused at construction, a full or read-only disk raises
``CacheError`` (an OSError, not a ShardError) that ``on_error="skip"`` does
not skip and that is never retried as a network fault, and prefetch holds
back on a small disk instead of failing. Real shards streamed through
``pipe:cat`` (the same cache as s3/http), real small disks: tmpfs mounts
(root with CAP_SYS_ADMIN, as in CI; skipped where mounting is not allowed)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import uuid

import pytest
from torch.utils.data import DataLoader

from streambatch.streaming import ShardError, StreamingBatches
from streambatch.streaming.errors import CacheError
from streambatch.streaming.io.cache import ShardCache, ShardRef
from streambatch.streaming.io.retry import RetryPolicy, is_transient

BUDGET, CAP, WINDOW = 2000, 16, 40
SIZES = [20] * 8  # ~200 KB a shard, 1.6 MB in all


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=1, median=0.5, longest=0.6, name="disk", local=False, pipes=True)
    return c.paths, c.pipes, c.index_dir


@contextlib.contextmanager
def tmpfs(parent, size: str):
    """A fresh tmpfs of ``size`` (mount's syntax: '1m', '128k') under ``parent``."""
    point = os.path.join(parent, f"tmpfs-{uuid.uuid4().hex[:8]}")
    os.makedirs(point)
    if not shutil.which("mount"):
        pytest.skip("no mount command here")
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", point],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {out.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", point], capture_output=True)


def remount_read_only(point: str) -> None:
    subprocess.run(["mount", "-o", "remount,ro", point], check=True, capture_output=True)


def dataset(corpus, cache_dir, **kw):
    _, pipes, idx = corpus
    kw = dict(dict(window_samples=WINDOW, index_dir=idx, cache_dir=cache_dir, on_error="skip",
                   retry=RetryPolicy(retries=5, backoff=0.2)), **kw)
    return StreamingBatches(pipes, BUDGET, CAP, **kw)


def count(ds, workers: int = 0) -> int:
    """Samples of one pass. On an error its workers are shut down before it
    propagates (a traceback would keep the loader alive until a garbage
    collection, whose shutdown of the workers then takes seconds)."""
    it = iter(DataLoader(ds, batch_size=None, num_workers=workers))
    try:
        return sum(len(b) for b in it)
    except Exception as exc:
        error = exc.with_traceback(None)
    del it
    raise error


# ---------------------------------------------------------------- no mount needed


def test_disk_errors_are_never_transient():
    assert not is_transient(CacheError(errno.ENOSPC, "full"))
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        assert not is_transient(OSError(code, os.strerror(code)))
    assert is_transient(ConnectionResetError()) and is_transient(OSError(errno.EPIPE, "broken pipe"))
    e = CacheError(errno.ENOSPC, "the shard cache /x is full")
    assert isinstance(e, OSError) and not isinstance(e, ShardError) and e.errno == errno.ENOSPC
    assert str(e) == "the shard cache /x is full"
    assert str(CacheError("as a DataLoader worker's error comes back")) == "as a DataLoader worker's error comes back"


def test_cache_dir_under_a_regular_file_is_refused_at_construction(corpus, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match=r"a-file/.*cache_dir=") as info:
        dataset(corpus, str(blocker / "cache"))
    assert info.value.errno == errno.ENOTDIR and not isinstance(info.value, ShardError)


@pytest.mark.parametrize("workers", [0, 2])
def test_cache_dir_broken_after_construction_raises_instead_of_skipping(corpus, tmp_path, workers):
    ds = dataset(corpus, str(tmp_path / "cache"))
    directory = ds.remote.directory
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    with open(directory, "w") as f:  # the rank's directory is now a regular file: nothing can be created in it
        f.write("x")
    with pytest.raises(CacheError, match=r"not writable.*cache_dir=") as info:
        count(ds, workers)
    assert not isinstance(info.value, ShardError)
    assert ds.num_skipped == 0  # not one sample was skipped as broken


def test_little_room_for_the_estimated_bound_warns_but_works(tmp_path, caplog):
    from types import SimpleNamespace

    import numpy as np

    from streambatch.streaming.io.disk import cache_estimate, check_cache_dir

    # 8 remote shards of 1 MB, 800 samples; windows of 200: 2 MB a window
    catalog = SimpleNamespace(urls=[f"s3://b/{i}.tar" for i in range(8)] + ["/local.tar"],
                              local=np.array([False] * 8 + [True]), sizes=[10**6] * 8 + [-1], num_samples=800)
    # rank_share: each rank streams 1/W of a window (shard mode), else every rank may read all of it (sample mode)
    assert cache_estimate(catalog, 4, 200, True, 2, None) == 2 * 2 * 10**6 // 4 + 2 * 10**6
    assert cache_estimate(catalog, 4, 200, False, 2, None) == 2 * 2 * 10**6 + 2 * 10**6
    assert cache_estimate(catalog, 4, 200, True, 4, 10**5) == 10**6 + 10**5 + 10**6
    assert cache_estimate(SimpleNamespace(urls=["pipe:cat a"], local=np.array([False]), sizes=[-1], num_samples=5),
                          1, 5, True, 4, None) == 0
    free = shutil.disk_usage(tmp_path).free
    with caplog.at_level(logging.WARNING, logger="streambatch.streaming"):
        check_cache_dir(str(tmp_path / "c"), str(tmp_path), need=free // 2)
        assert not caplog.records
        check_cache_dir(str(tmp_path / "c"), str(tmp_path), need=free * 2)
    message = caplog.records[-1].getMessage()
    assert "bytes free" in message and "cache_dir=" in message and "window_samples=" in message
    assert os.listdir(tmp_path / "c") == []  # the probe file is gone


# ---------------------------------------------------------------- small disks (tmpfs)


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_holds_back_on_a_small_disk_and_nothing_is_skipped(corpus, tmp_path, workers, caplog):
    with tmpfs(tmp_path, "1m") as disk:
        ds = dataset(corpus, disk)
        # prefetch (4 ranges ahead, per worker) would need more than the disk: it waits instead of failing
        assert count(ds, workers) == sum(SIZES) and ds.num_skipped == 0
        assert "retrying" not in caplog.text


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_piece_larger_than_the_disk_raises_cache_error_even_with_skip(corpus, tmp_path, workers, caplog):
    with tmpfs(tmp_path, "128k") as disk:
        ds = dataset(corpus, disk)
        with caplog.at_level(logging.WARNING, logger="streambatch.streaming"), pytest.raises(CacheError) as info:
            count(ds, workers)
        text = str(info.value)
        assert disk in text and "bytes free" in text and "needs" in text
        for setting in ("cache_dir=", "prefetch_shards=", "window_samples="):
            assert setting in text
        assert ds.num_skipped == 0 and "retrying" not in caplog.text


def test_disk_full_mid_download_is_not_retried(corpus, tmp_path):
    paths, pipes, _ = corpus
    with tmpfs(tmp_path, "128k") as disk:
        cache = ShardCache(disk, retry=RetryPolicy(retries=5, backoff=1.0))
        ref = ShardRef(pipes[0])  # size unknown: no check before, the disk fills while writing
        with pytest.raises(CacheError, match="is full") as info:
            cache.get(ref)
        assert info.value.errno == errno.ENOSPC and cache.stats.retries == 0
        assert not [f for f in os.listdir(disk) if f.endswith((".data", ".partial"))]  # the torn file is gone
        cache.close()


def test_read_only_cache_dir_is_refused_at_construction(corpus, tmp_path):
    with tmpfs(tmp_path, "1m") as disk:
        remount_read_only(disk)
        with pytest.raises(CacheError, match=rf"{disk}.*cache_dir=") as info:
            dataset(corpus, disk)
        assert info.value.errno == errno.EROFS


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_disk_turned_read_only_while_reading_raises_instead_of_skipping(corpus, tmp_path, workers):
    with tmpfs(tmp_path, "4m") as disk:
        ds = dataset(corpus, disk)
        remount_read_only(disk)
        with pytest.raises(CacheError, match=r"not writable.*cache_dir=") as info:
            count(ds, workers)
        assert info.value.errno in (errno.EROFS, None) and ds.num_skipped == 0  # (None: via a worker)
