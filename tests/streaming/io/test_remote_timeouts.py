"""Every network call waits at most ``RetryPolicy.timeout`` (real servers on
127.0.0.1 behind the fault proxy, which can leave a request unanswered
forever or go silent mid-body): metadata requests at construction and in
``index_shards`` / ``streambatch index``, catalog and sidecar reads, S3 reads
(not s3fs's own 15 s). And indexing from a server that ignores Range
requests (nginx with ``max_ranges 0``) streams each shard once instead of
failing, with sidecars equal to those of local copies. Server tests are in
the slow tier; the in-memory fsspec backend (sync, chunked reads) is fast.

Timings are bounds far above what the fix needs (about the timeout) and
far below what the unfixed code took (aiohttp's 300 s, s3fs's 15 s per
attempt), so a loaded machine does not make them flaky."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time

import pytest

from streambatch.streaming import ShardError, StreamingBatches, index_shards
from streambatch.streaming.io.remote import RemoteShard
from streambatch.streaming.io.retry import RetryPolicy
from streambatch.streaming.shards.catalog_file import read_catalog
from streambatch.streaming.shards.sidecar import read_arrays, sidecar_path
from tests.support.launch_remote import BUDGET, CAP, WINDOW
from tests.support.servers import HOST, FaultProxy, nginx_server, s3_server
from tests.support.shards import FPS

SIZES = [9, 7, 11]
FAST = RetryPolicy(timeout=2, retries=0)
BOUND = 20.0  # seconds: the fix answers in ~2 s per attempt; the unfixed code waited 300 s (HTTP), 15 s (S3)
NEVER = 10**9  # hang_next: every matching request


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=11, name="shards")
    out = c.directory, c.brace, c.paths, c.expected
    local_epoch(out)  # loads the planner now, not inside a timed construction
    return out


@pytest.fixture(scope="module")
def nginx(corpus):
    with nginx_server(corpus[0]) as ng:
        yield ng


def keys(batches):
    return [[s["__key__"] for s in b] for b in batches]


def local_epoch(corpus):
    return keys(StreamingBatches(corpus[1], BUDGET, CAP, window_samples=WINDOW, read_mode="shard"))


def arrays(path):
    return [a.tolist() for a in read_arrays(path, ("keys", "lengths", "offsets", "sizes"))]


def raises_within(exc_type, fn, match=None, bound=BOUND):
    t0 = time.monotonic()
    with pytest.raises(exc_type, match=match) as info:
        fn()
    elapsed = time.monotonic() - t0
    assert elapsed < bound, f"took {elapsed:.1f} s to give up"
    return info.value


TIMEOUT_HINT = r"no answer within 2 s.*RetryPolicy\.timeout = 2 s.*retry=RetryPolicy\(timeout="


# ---------------------------------------------------------------- the proxy's new faults


@pytest.mark.slow
def test_proxy_hangs_and_nginx_without_ranges(corpus, nginx):
    with FaultProxy(nginx.port) as px:
        px.match, px.hang_next = "HEAD ", 1
        with socket.create_connection((HOST, px.port), timeout=1) as s:
            s.sendall(b"HEAD /train-000000.tar HTTP/1.1\r\nHost: x\r\n\r\n")
            with pytest.raises(socket.timeout):
                s.recv(1)  # no answer at all
        px.match, px.hang_next, px.hang_after = "GET ", 1, 300
        with socket.create_connection((HOST, px.port), timeout=1) as s:
            s.sendall(b"GET /train-000000.tar HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            with pytest.raises(socket.timeout):
                while True:
                    chunk = s.recv(65536)
                    assert chunk, "the proxy closed the connection instead of going silent"
                    got += chunk
            assert len(got) == 300 and got.startswith(b"HTTP/1.1 200")
        assert [r.fault for r in px.requests] == ["hang", "hang"]
    with nginx_server(corpus[0], ranges=False) as plain:
        with socket.create_connection((HOST, plain.port), timeout=5) as s:
            s.sendall(b"GET /train-000000.tar HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\nConnection: close\r\n\r\n")
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")  # the whole file, not 206


# ---------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def proxied(corpus, nginx, tmp_path_factory):
    """A proxy in front of nginx; the shards indexed through it (sidecars and catalog in a local dir)."""
    with FaultProxy(nginx.port) as px:
        idx = str(tmp_path_factory.mktemp("idx"))
        urls = [f"{px.url}/train-{i:06d}.tar" for i in range(len(SIZES))]
        index_shards(urls, frames_per_second=FPS, index_dir=idx, progress=False)
        yield px, urls, idx


@pytest.fixture
def px(proxied):
    px = proxied[0]
    yield px
    px.match, px.hang_next, px.hang_after = None, 0, 0
    px.reset_stats()


@pytest.mark.slow
def test_head_that_never_answers_fails_construction_within_the_timeout(proxied, px, tmp_path):
    _, urls, idx = proxied
    px.match, px.hang_next = "HEAD ", NEVER
    err = raises_within(ShardError, lambda: StreamingBatches(f"{idx}/streambatch.catalog.npz", BUDGET, CAP,
                                                            cache_dir=str(tmp_path), retry=FAST),
                        match=r"cannot stat shard http://127\.0\.0\.1:\d+/train-00000\d\.tar.*" + TIMEOUT_HINT)
    assert "re-index" not in str(err)  # not stale: unreachable
    # retried per the policy: retries=1 makes two HEADs of each shard
    px.reset_stats()
    raises_within(ShardError, lambda: StreamingBatches(f"{idx}/streambatch.catalog.npz", BUDGET, CAP,
                                                      cache_dir=str(tmp_path),
                                                      retry=RetryPolicy(timeout=2, retries=1, backoff=0.01)),
                  match="gave up after 2 attempts")
    heads = [r.target for r in px.requests if r.method == "HEAD"]
    assert sorted(heads) == sorted(f"/train-{i:06d}.tar" for i in range(len(SIZES)) for _ in range(2))


@pytest.mark.slow
def test_catalog_and_sidecar_reads_that_never_answer(corpus, proxied, px, tmp_path):
    _, urls, idx = proxied
    served = os.path.join(corpus[0], "served-idx")  # the index, served by nginx behind the proxy
    shutil.copytree(idx, served, dirs_exist_ok=True)
    try:
        px.match, px.hang_next = "GET /served-idx/streambatch.catalog.npz ", NEVER
        remote_catalog = f"{px.url}/served-idx/streambatch.catalog.npz"
        raises_within(OSError, lambda: read_catalog(remote_catalog, retry=FAST),
                      match=r"cannot read catalog http://127\.0\.0\.1:\d+/served-idx/streambatch\.catalog\.npz.*"
                            + TIMEOUT_HINT)
        raises_within(OSError, lambda: StreamingBatches(remote_catalog, BUDGET, CAP, cache_dir=str(tmp_path),
                                                        retry=FAST), match=TIMEOUT_HINT)
        # no catalog: each shard's sidecar is looked up in the remote index_dir
        px.match = "/served-idx/train-000001.tar.idx.npz "
        raises_within(ShardError, lambda: StreamingBatches(urls, BUDGET, CAP, index_dir=f"{px.url}/served-idx",
                                                           cache_dir=str(tmp_path), retry=FAST),
                      match=r"sidecar http://127\.0\.0\.1:\d+/served-idx/train-000001\.tar\.idx\.npz.*" + TIMEOUT_HINT)
        px.hang_next = 0  # the same reads answer: streaming works from there
        ds = StreamingBatches(urls, BUDGET, CAP, index_dir=f"{px.url}/served-idx", window_samples=WINDOW,
                              cache_dir=str(tmp_path), retry=FAST)
        assert keys(ds) == local_epoch(corpus)
    finally:
        shutil.rmtree(served)


@pytest.mark.slow
def test_index_shards_and_the_cli_on_a_stalled_head(proxied, px, tmp_path):
    from streambatch.cli.main import main

    _, urls, _ = proxied
    idx = str(tmp_path / "idx")
    px.match, px.hang_next = "HEAD ", NEVER
    raises_within(ShardError, lambda: index_shards(urls, frames_per_second=FPS, index_dir=idx, progress=False,
                                                   retry=FAST), match=r"cannot stat shard .*" + TIMEOUT_HINT)
    # --timeout reaches every request: one HEAD hangs, its retry 2 s later answers
    px.hang_next = 1
    px.reset_stats()
    t0 = time.monotonic()
    assert main(["index", *urls, "--fps", str(FPS), "--index-dir", idx, "--no-progress", "--timeout", "2"]) == 0
    assert time.monotonic() - t0 < BOUND
    assert px.faults_fired() == 1 and os.path.exists(os.path.join(idx, "streambatch.catalog.npz"))


@pytest.mark.slow
def test_http_download_stalled_before_its_headers_is_retried(corpus, proxied, px, tmp_path):
    _, _, idx = proxied
    px.match, px.hang_next = "GET /train-000001.tar ", 1
    t0 = time.monotonic()
    ds = StreamingBatches(f"{idx}/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW,
                          cache_dir=str(tmp_path), retry=RetryPolicy(timeout=2, retries=1, backoff=0.01))
    assert keys(ds) == local_epoch(corpus)
    assert time.monotonic() - t0 < BOUND and px.faults_fired() == 1


# ---------------------------------------------------------------- S3 (moto)


@pytest.fixture(scope="module")
def s3(corpus):
    with s3_server() as server:
        server.upload_dir("data", corpus[0])
        urls = [f"s3://data/train-{i:06d}.tar" for i in range(len(SIZES))]
        index_shards(urls, frames_per_second=FPS, storage_options=server.storage_options(), progress=False)
        yield server


@pytest.mark.slow
def test_s3_read_stalled_mid_body_gives_up_after_the_policy_timeout(corpus, s3, tmp_path):
    with FaultProxy(s3.port) as px:
        opts = s3.storage_options(px.url)
        # the shard's GET goes silent after its headers and ~1.5 KB of body: the attempt must end after ~2 s
        # (s3fs's own read timeout is 15 s), the retry resumes from the byte reached
        px.match, px.hang_next, px.hang_after = "GET /data/train-000001.tar ", 1, 2000
        t0 = time.monotonic()
        ds = StreamingBatches("s3://data/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW,
                              storage_options=opts, cache_dir=str(tmp_path),
                              retry=RetryPolicy(timeout=2, retries=1, backoff=0.01))
        assert keys(ds) == local_epoch(corpus)
        elapsed = time.monotonic() - t0
        assert px.faults_fired() == 1
        assert elapsed < 10, f"{elapsed:.1f} s: the stalled attempt did not end after RetryPolicy.timeout"
        resumed = [r.range for r in px.requests if r.target == "/data/train-000001.tar" and r.method == "GET"]
        assert len(resumed) == 2 and not resumed[1].startswith("bytes=0-")  # resumed after the bytes that came


@pytest.mark.slow
def test_s3_head_and_catalog_that_never_answer(s3, tmp_path):
    with FaultProxy(s3.port) as px:
        opts = s3.storage_options(px.url)
        px.match, px.hang_next = "HEAD /data/train-", NEVER
        raises_within(ShardError, lambda: StreamingBatches("s3://data/streambatch.catalog.npz", BUDGET, CAP,
                                                           storage_options=opts, cache_dir=str(tmp_path),
                                                           retry=FAST),
                      match=r"cannot stat shard s3://data/train-00000\d\.tar.*" + TIMEOUT_HINT)
        px.match = "GET /data/streambatch.catalog.npz"
        raises_within(OSError, lambda: StreamingBatches("s3://data/streambatch.catalog.npz", BUDGET, CAP,
                                                        storage_options=opts, cache_dir=str(tmp_path), retry=FAST),
                      match=r"cannot read catalog s3://data/streambatch\.catalog\.npz.*" + TIMEOUT_HINT)


# ---------------------------------------------------------------- a sync backend


@pytest.mark.slow
def test_sync_backend_call_is_abandoned_after_the_timeout():
    """fsspec's WebHDFS client (requests, no timeout of its own) against a
    server that accepts connections and never answers: the call runs in a
    thread that is left behind after the timeout, and is retried."""
    pytest.importorskip("requests")
    silent = socket.socket()
    silent.bind((HOST, 0))
    silent.listen(8)
    accepted = []
    threading.Thread(target=lambda: [accepted.append(silent.accept()[0]) for _ in range(8)], daemon=True).start()
    try:
        url = f"webhdfs://{HOST}:{silent.getsockname()[1]}/data/train-000000.tar"
        shard = RemoteShard(url, retry=RetryPolicy(timeout=1, retries=1, backoff=0.01))
        raises_within(ShardError, shard.info, match=r"cannot stat shard webhdfs://.*gave up after 2 attempts.*"
                                                    r"no answer within 1 s")
        assert len(accepted) == 2  # two attempts reached the server
    finally:
        for c in accepted:
            c.close()
        silent.close()


# ---------------------------------------------------------------- servers that ignore Range


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 3])
def test_indexing_from_a_server_that_ignores_range(corpus, tmp_path, caplog, workers):
    with nginx_server(corpus[0], ranges=False) as ng:
        urls = [f"{ng.url}/train-{i:06d}.tar" for i in range(len(SIZES))]
        idx = str(tmp_path / "idx")
        with caplog.at_level(logging.WARNING, logger="streambatch.streaming"):
            s = index_shards(urls, frames_per_second=FPS, index_dir=idx, workers=workers, progress=False)
        assert s.indexed == len(SIZES) and s.samples == sum(SIZES)
        notes = [r.getMessage() for r in caplog.records if "ignores Range requests" in r.getMessage()]
        assert len(notes) == 1, notes  # once per run, not per shard
        assert "streams each of its shards once" in notes[0]
        for u, p in zip(urls, corpus[2]):  # the same sidecars as indexing the local files
            assert arrays(sidecar_path(u, idx)) == arrays(p + ".idx.npz")
        log = ng.log()
        total = sum(os.path.getsize(p) for p in corpus[2])
        got = sum(e.body_bytes for e in log if e.method == "GET")
        assert got <= 2 * total, (got, total)  # a probe (cut at its headers) and one stream per shard, at most
        ds = StreamingBatches(f"{idx}/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW,
                              cache_dir=str(tmp_path / "cache"))
        assert keys(ds) == local_epoch(corpus)


# ---------------------------------------------------------------- a sync, chunked backend (fast tier)


def test_memory_backend_indexes_and_streams_like_local_files(corpus):
    """fsspec's in-memory filesystem: a sync backend (each call in a bounded
    thread) without a streaming body (ranged chunks). A shard-mode piece is
    a range of its shard, not a smaller shard (it was refused as changed)."""
    import fsspec

    mem = fsspec.filesystem("memory")
    root = f"/sb-{os.getpid()}"
    try:
        for i, p in enumerate(corpus[2]):
            with open(p, "rb") as f:
                mem.pipe_file(f"{root}/train-{i:06d}.tar", f.read())
        urls = [f"memory:/{root}/train-{i:06d}.tar" for i in range(len(SIZES))]
        s = index_shards(urls, frames_per_second=FPS, progress=False, retry=FAST)
        assert s.indexed == len(SIZES) and s.samples == sum(SIZES)
        for u, p in zip(urls, corpus[2]):  # next to the shards, in memory
            assert arrays(sidecar_path(u)) == arrays(p + ".idx.npz")
        ds = StreamingBatches(f"memory:/{root}/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW,
                              retry=FAST)
        assert keys(ds) == local_epoch(corpus)
    finally:
        mem.rm(root, recursive=True)
