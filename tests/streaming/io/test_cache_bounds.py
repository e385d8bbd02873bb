"""The shard cache's bounds: passes that stop early (a loop that breaks,
Lightning's ``limit_train_batches``) leave nothing behind, so the rank's
cache directory stays within the documented bound of about two windows'
share plus the prefetched pieces; and the prefetch queue keeps its order and
bounds (``ShardCache._top_up``: a cursor and running counters, not a rescan).
Real shards: ``pipe:cat`` ones in the fast tier (the same cache as s3/http),
nginx on 127.0.0.1 in the slow tier."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
from torch.utils.data import DataLoader

from streambatch.streaming import StreamingBatches, index_shards
from streambatch.streaming.io.cache import ShardCache, ShardRef
from tests.support.shards import FPS

BUDGET, CAP = 2000, 8
SHARDS, PER_SHARD, WINDOW, WORLD = 36, 20, 120, 2
PREFETCH = 2


def du(directory: str) -> int:
    """Bytes the files under ``directory`` take on disk (as ``du`` counts them)."""
    total = 0
    for d, _, fs in os.walk(directory):
        for f in fs:
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile (a worker shutting down)
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def documented_bound(paths: list[str], workers: int) -> int:
    """README: disk ~ the rank's share of two windows (shard mode: 2 x window
    bytes / W) plus the prefetched ranges (prefetch_shards per worker)."""
    sizes = [os.path.getsize(p) for p in paths]
    window = sum(sizes) * WINDOW / (SHARDS * PER_SHARD)
    return int(2 * window / WORLD + max(1, workers) * PREFETCH * max(sizes))


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus([PER_SHARD] * SHARDS, seed=11, median=0.5, longest=0.6, name="bounds", local=False, pipes=True)
    return c.directory, c.paths, c.pipes, c.index_dir


def early_stopped_passes(urls, idx, cache, workers, passes=8, stop_after=3):
    """du of rank 0's cache directory at each early stop and after each pass closed."""
    ds = StreamingBatches(urls, BUDGET, CAP, window_samples=WINDOW, rank=0, world_size=WORLD, index_dir=idx,
                          cache_dir=cache, prefetch_shards=PREFETCH, read_mode="shard")
    at_stop, after = [], []
    for epoch in range(passes):
        ds.set_epoch(epoch)  # shard-mode pieces are cut elsewhere each epoch: new cache keys every pass
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        it = iter(loader)
        for _ in range(stop_after):
            next(it)
        at_stop.append(du(ds.remote.directory))
        del it  # the pass stops early: its generator (or its workers) close
        after.append(du(ds.remote.directory))
    return at_stop, after, ds.remote.directory


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_early_stopped_passes_leave_nothing_behind(corpus, tmp_path, workers):
    _, paths, pipes, idx = corpus
    at_stop, after, directory = early_stopped_passes(pipes, idx, str(tmp_path), workers)
    bound = documented_bound(paths, workers)
    assert max(at_stop) <= bound, (at_stop, bound)
    assert max(after) <= bound, (after, bound)
    # a closed pass keeps no piece: what a pass downloaded does not pile up pass after pass
    assert after == [0] * len(after), after
    assert not [f for f in os.listdir(directory) if f.endswith((".data", ".partial")) or f.startswith(".tmp-")]


def test_a_live_workers_pieces_survive_another_ones_close(corpus, tmp_path):
    """A process closing early deletes only what no other process holds: a
    piece another worker of the rank has open stays (and goes when that one closes)."""
    _, paths, pipes, _ = corpus
    size = os.path.getsize(paths[0])
    a, b = (ShardCache(str(tmp_path), prefetch_shards=1) for _ in range(2))
    ref = ShardRef(pipes[0], size)
    fd = b.open(ref)  # b reads it
    a.get(ref)
    a.close([(ref, ("e0w0",))])
    assert os.path.exists(a.path(ref)) and len(os.pread(fd, 512, 0)) == 512
    b.close([(ref, ("e0w0",))])
    assert not os.path.exists(b.path(ref))


class Recording(ShardCache):
    """A cache that records its background downloads in the order they are
    submitted, each waiting for a go-ahead, so the test sees what is in
    flight at each moment."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.started: list[ShardRef] = []
        self.go = threading.Event()
        pool, log = self.prefetch._pool, self.started

        class Pool:
            def submit(self, fn, ref):
                log.append(ref)
                return pool.submit(fn, ref)

            def shutdown(self, **kw):
                pool.shutdown(**kw)

        self.prefetch._pool = Pool()

    def _background(self, ref):
        self.go.wait(10)
        return super()._background(ref)


def started(cache: Recording, n: int) -> list[ShardRef]:
    """The refs submitted so far, once ``n`` are (or after 5 s)."""
    for _ in range(500):
        with cache._lock:
            if len(cache.started) >= n:
                break
        threading.Event().wait(0.01)
    threading.Event().wait(0.05)  # and no more than that
    with cache._lock:
        return list(cache.started)


def test_prefetch_order_and_bounds_with_the_cursor(corpus, tmp_path):
    _, paths, pipes, _ = corpus
    refs = [ShardRef(u, os.path.getsize(p)) for u, p in zip(pipes, paths)]
    big = max(r.nbytes for r in refs)
    cache = Recording(str(tmp_path / "a"), prefetch_shards=3, threads=8)
    cache.schedule(refs[:10])
    assert started(cache, 3) == refs[:3]  # in need order, at most prefetch_shards ahead
    cache.go.set()
    for i, r in enumerate(refs[:10]):
        assert cache.get(r) == cache.path(r)
        with cache._lock:
            assert len([x for x in cache.prefetch._futures if x not in cache.prefetch._taken]) <= 3
        n = min(10, i + 4)
        assert started(cache, n) == refs[:n]  # one more starts per piece taken, in order
    assert cache.started == refs[:10]  # each once
    # a new schedule (the next window): what was taken is not fetched again, the rest in the new order
    cache.go.clear()
    cache.schedule([refs[3], refs[12], refs[11], refs[10], refs[13]])
    assert started(cache, 13)[10:] == [refs[12], refs[11], refs[10]]
    cache.go.set()
    for r in refs[:10]:
        cache.release(r, "e0w0", 1)
    assert started(cache, 13) == refs[:10] + [refs[12], refs[11], refs[10]]  # releasing frees no slot...
    cache.get(refs[12])
    assert started(cache, 14)[13:] == [refs[13]]  # ... taking one does
    cache.close()
    assert not [f for f in os.listdir(tmp_path / "a") if f.endswith(".data")]  # the closed cache kept nothing

    # prefetch_bytes: stop at the first piece that would go over (never skip ahead to a smaller one)
    by_bytes = Recording(str(tmp_path / "b"), prefetch_shards=10, prefetch_bytes=2 * big, threads=8)
    by_bytes.schedule(refs[:6])
    assert started(by_bytes, 2) == refs[:2]
    by_bytes.go.set()
    by_bytes.get(refs[0])
    assert started(by_bytes, 3) == refs[:3]
    by_bytes.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_early_stopped_passes_over_http_stay_within_the_bound(corpus, tmp_path, workers):
    from tests.support.servers import nginx_server

    root, paths, _, _ = corpus
    with nginx_server(root) as ng:
        urls = [f"{ng.url}/{os.path.basename(p)}" for p in paths]
        idx = str(tmp_path / "idx")
        index_shards(urls, frames_per_second=FPS, index_dir=idx, progress=False)
        at_stop, after, _ = early_stopped_passes(urls, idx, str(tmp_path / "cache"), workers)
    bound = documented_bound(paths, workers)
    print(f"du at each stop {at_stop}, after each pass {after}, bound {bound}, data {sum(map(os.path.getsize, paths))}")
    assert max(at_stop) <= bound and max(after) <= bound, (at_stop, after, bound)
    assert after == [0] * len(after), after
