"""Remote shards against real servers on 127.0.0.1 (nginx over HTTP, moto's
S3 server), with the fault proxy in between: indexing reads only headers,
streaming matches local files batch for batch, each shard is downloaded once
per rank per epoch whatever num_workers is, faults are retried with nothing
lost, exhausted retries name the shard on every rank without a hang, stale
shards are refused before training."""

from __future__ import annotations

import collections
import io
import json
import os

import numpy as np
import pytest
import soundfile
import torch.multiprocessing as mp
import webdataset as wds
from torch.utils.data import DataLoader

from streambatch.streaming import ShardError, StreamingBatches, index_shards
from streambatch.streaming.io.retry import RetryPolicy
from streambatch.streaming.shards.sidecar import read_arrays, sidecar_path
from tests.support.helpers import free_port
from tests.support.launch_remote import BUDGET, CAP, WINDOW, run_rank
from tests.support.servers import FaultProxy, nginx_server, s3_server
from tests.support.shards import FPS

pytestmark = pytest.mark.slow

SIZES = [21, 17, 0, 25, 19, 23, 14, 20]


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=5, name="shards")
    return c.directory, c.brace, c.paths, c.expected


@pytest.fixture(scope="module")
def nginx(corpus):
    with nginx_server(corpus[0]) as ng:
        yield ng


@pytest.fixture(scope="module")
def s3(corpus):
    with s3_server() as server:
        server.upload_dir("data", corpus[0])
        yield server


def keys(batches):
    return [[s["__key__"] for s in b] for b in batches]


def local_epochs(corpus, world, epoch=0, read_mode="shard"):
    """The batches of local files in the read mode remote URLs get by default."""
    out = []
    for r in range(world):
        ds = StreamingBatches(corpus[1], BUDGET, CAP, window_samples=WINDOW, rank=r, world_size=world,
                              read_mode=read_mode)
        ds.set_epoch(epoch)
        out.append(keys(ds))
    return out


def tar_gets(log):
    return collections.Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".tar"))


# ---------------------------------------------------------------- indexing


def speech_shards(directory, shards=3, per_shard=8, seconds=(3.0, 5.0), rate=16000):
    """Shards of noisy 16 kHz speech-length audio (FLAC and WAV, 3-5 s) and JSON."""
    rng = np.random.default_rng(0)
    os.makedirs(directory, exist_ok=True)
    lengths = {}
    for i in range(shards):
        with wds.TarWriter(os.path.join(directory, f"sp-{i:06d}.tar")) as sink:
            for j in range(per_shard):
                n = int(rng.uniform(*seconds) * rate)
                x = (0.2 * np.sin(np.arange(n) * 0.05) + 0.05 * rng.standard_normal(n)).astype(np.float32)
                fmt = "flac" if j % 2 else "wav"
                buf = io.BytesIO()
                soundfile.write(buf, x, rate, format=fmt.upper(), subtype="PCM_16")
                key = f"s{i}-{j}"
                sink.write({"__key__": key, fmt: buf.getvalue(), "json": json.dumps({"duration": n / rate}).encode()})
                lengths[key] = int(np.ceil(n / rate * FPS - 1e-6))
    return lengths


@pytest.mark.parametrize("length_from", ["json:duration", "audio"])
def test_remote_indexing_reads_only_headers(tmp_path, length_from):
    want = speech_shards(tmp_path / "sp")
    total = sum(os.path.getsize(tmp_path / "sp" / f) for f in os.listdir(tmp_path / "sp"))
    with nginx_server(tmp_path / "sp") as ng:
        urls = [f"{ng.url}/sp-{i:06d}.tar" for i in range(3)]
        idx = str(tmp_path / "idx")
        s = index_shards(urls, length_from=length_from, frames_per_second=FPS, index_dir=idx, workers=3,
                         progress=False)
        log = ng.log()
        assert s.indexed == 3 and s.samples == len(want)
        got = {}
        for u in urls:
            k, lengths = read_arrays(sidecar_path(u, idx), ("keys", "lengths"))
            got.update({a.decode(): int(b) for a, b in zip(k, lengths)})
        assert got == want
        read = sum(e.body_bytes for e in log if e.method == "GET")
        assert read <= 0.05 * total, f"indexing read {read} of {total} bytes ({read / total:.1%})"
        # pax header + record + header + 512 bytes for each of 2 members; the end-of-archive check reads
        # the zero blocks to the end of the file (tar pads to 10 KiB records)
        assert read <= 4608 * len(want) + 10240 * 3
        gets = sum(1 for e in log if e.method == "GET")
        assert gets <= 3 * len(want), gets  # a ranged GET per member's headers (pax: 2 KiB), at most
        assert os.path.exists(os.path.join(idx, "streambatch.catalog.npz"))
        ng.clear_log()
        again = index_shards(urls, length_from=length_from, frames_per_second=FPS, index_dir=idx, progress=False)
        assert again.indexed == 0 and again.current == 3  # current sidecars are skipped: HEADs only
        assert {e.method for e in ng.log()} == {"HEAD"}


def test_s3_sidecars_and_catalog_next_to_the_shards(corpus, s3):
    opts = s3.storage_options()
    urls = [f"s3://data/train-{i:06d}.tar" for i in range(len(SIZES))]
    s = index_shards(urls, frames_per_second=FPS, storage_options=opts, progress=False)
    assert s.indexed == len(SIZES) and s.samples == sum(SIZES)
    names = {o["Key"] for o in s3.client().list_objects_v2(Bucket="data")["Contents"]}
    assert {f"train-{i:06d}.tar.idx.npz" for i in range(len(SIZES))} <= names
    assert "streambatch.catalog.npz" in names
    ds = StreamingBatches("s3://data/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW,
                          storage_options=opts, cache_dir=str(corpus[0] + "-cache"))
    assert keys(ds) == local_epochs(corpus, 1)[0]


# ---------------------------------------------------------------- streaming


@pytest.fixture(scope="module")
def http_index(corpus, nginx, tmp_path_factory):
    idx = str(tmp_path_factory.mktemp("http-idx"))
    urls = [f"{nginx.url}/train-{i:06d}.tar" for i in range(len(SIZES))]
    index_shards(urls, frames_per_second=FPS, index_dir=idx, progress=False)
    return urls, idx


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("read_mode", ["shard", "sample"])
def test_http_streaming_matches_local_and_reads_each_byte_once(corpus, nginx, http_index, tmp_path, workers,
                                                               read_mode):
    urls, idx = http_index
    world = 3
    nginx.clear_log()
    got = []
    for r in range(world):
        ds = StreamingBatches(f"{idx}/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW, rank=r,
                              world_size=world, cache_dir=str(tmp_path), prefetch_shards=2, read_mode=read_mode)
        got.append(keys(DataLoader(ds, batch_size=None, num_workers=workers)))
    assert got == local_epochs(corpus, world, read_mode=read_mode)
    log = [e for e in nginx.log() if e.method == "GET" and e.path.endswith(".tar")]
    gets = tar_gets(nginx.log())
    total = sum(os.path.getsize(p) for p in corpus[2])
    if read_mode == "shard":  # each byte crosses the network once per epoch across the job, in few GETs
        assert sum(e.body_bytes for e in log) <= 1.05 * total and len(log) <= 2 * sum(1 for n in SIZES if n)
    else:  # the global plan: each rank downloads what it reads of a shard once, whatever num_workers is
        assert sum(e.body_bytes for e in log) <= world * total and max(gets.values()) <= 3 * world
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".data")]  # evicted


def test_faults_are_retried_and_nothing_is_lost(corpus, nginx, http_index, tmp_path):
    _, idx = http_index
    with FaultProxy(nginx.port) as px:
        px.match = ".tar "
        px.reset_every, px.reset_after, px.fail_every = 3, 20000, 5
        px.stall = 0.2  # the bytes before a reset reach the client first (aiohttp drops a buffer it failed on)
        urls = [f"{px.url}/train-{i:06d}.tar" for i in range(len(SIZES))]
        ds = StreamingBatches(urls, BUDGET, CAP, window_samples=WINDOW, index_dir=idx, cache_dir=str(tmp_path),
                              retry=RetryPolicy(retries=8, backoff=0.01))
        assert keys(DataLoader(ds, batch_size=None, num_workers=2)) == local_epochs(corpus, 1)[0]
        assert px.faults_fired() >= 3
        resumed = [r.range for r in px.requests if r.range]
        assert resumed and all(r.startswith("bytes=") for r in resumed)  # resumed from the byte reached


def test_exhausted_retries_raise_named_error_or_skip_with_equal_steps(corpus, nginx, http_index, tmp_path):
    _, idx = http_index
    with FaultProxy(nginx.port) as px:
        px.match, px.fail_every = "GET /train-000003.tar ", 1
        urls = [f"{px.url}/train-{i:06d}.tar" for i in range(len(SIZES))]
        kw = dict(window_samples=WINDOW, index_dir=idx, cache_dir=str(tmp_path),
                  retry=RetryPolicy(retries=2, backoff=0.01))
        with pytest.raises(ShardError, match=r"train-000003\.tar at byte 0: gave up after 3 attempts.*503"):
            list(StreamingBatches(urls, BUDGET, CAP, **kw))
        skip = StreamingBatches(urls, BUDGET, CAP, on_error="skip", **kw)
        batches = keys(skip)
        assert len(batches) == len(skip) and skip.num_skipped == SIZES[3]
        assert sum(map(len, batches)) == sum(SIZES) - SIZES[3]


def test_stale_remote_shard_is_refused_before_training(corpus, s3, tmp_path):
    opts = s3.storage_options()
    c = s3.client()
    c.create_bucket(Bucket="stale")
    for i in range(3):
        c.upload_file(corpus[2][i], "stale", f"train-{i:06d}.tar")
    urls = [f"s3://stale/train-{i:06d}.tar" for i in range(3)]
    index_shards(urls, frames_per_second=FPS, storage_options=opts, progress=False)
    StreamingBatches("s3://stale/streambatch.catalog.npz", BUDGET, CAP, storage_options=opts)  # current: fine
    c.upload_file(corpus[2][4], "stale", "train-000001.tar")  # replaced after indexing
    with pytest.raises(ShardError, match=r"changed since they were indexed.*train-000001\.tar"):
        StreamingBatches("s3://stale/streambatch.catalog.npz", BUDGET, CAP, storage_options=opts)


# ---------------------------------------------------------------- 4 ranks x 2 workers


def _spawned(rank, world, init_method, *args):
    run_rank(rank, world, init_method, *args)


def _run_world(out_dir, *args, world=4):
    port = free_port()
    mp.start_processes(_spawned, args=(world, f"tcp://127.0.0.1:{port}", *args, str(out_dir)), nprocs=world,
                       join=True, start_method="spawn")
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def _check_world(results, corpus, name):
    expected = corpus[3]
    assert len({len(r["epoch"]) for r in results}) == 1 and all(len(r["epoch"]) == r["len"] for r in results)
    counts = collections.Counter(k for r in results for b in r["epoch"] for k in b)
    assert set(counts) == set(expected) and sum(counts.values()) - len(expected) < len(results)
    assert [r["epoch"] for r in results] == local_epochs(corpus, len(results))
    for r in results:  # every rank names the broken shard; none hung (the barrier after it was reached)
        assert name in r["error"] and "byte" in r["error"], r["error"]


def test_four_ranks_two_workers_over_http(corpus, nginx, http_index, tmp_path):
    urls, idx = http_index
    nginx.clear_log()
    # the broken run reads from a second server, so the first one's log holds the good run only
    with nginx_server(corpus[0]) as other, FaultProxy(other.port) as px:
        px.match, px.fail_every = "GET /train-000005.tar ", 1
        broken = [f"{px.url}/train-{i:06d}.tar" for i in range(len(SIZES))]
        results = _run_world(tmp_path, f"{idx}/streambatch.catalog.npz", broken, None, None, idx)
    _check_world(results, corpus, "train-000005.tar")
    log = [e for e in nginx.log() if e.method == "GET" and e.path.endswith(".tar")]
    total = sum(os.path.getsize(p) for p in corpus[2])
    # shard mode, 4 ranks x 2 workers: each byte once across the job (plus the few samples another rank
    # trains on, one ranged read each), in few requests
    assert sum(e.body_bytes for e in log) <= 1.25 * total, (sum(e.body_bytes for e in log), total)
    assert len(log) <= 2 * sum(1 for n in SIZES if n) + 4 * 4, len(log)


def test_four_ranks_two_workers_over_s3(corpus, s3, tmp_path):
    opts = s3.storage_options()
    urls = [f"s3://data/train-{i:06d}.tar" for i in range(len(SIZES))]
    index_shards(urls, frames_per_second=FPS, storage_options=opts, progress=False)
    with FaultProxy(s3.port) as px:
        px.match, px.fail_every = "train-000005.tar ", 1  # GETs of the shard itself, not its sidecar
        results = _run_world(tmp_path, "s3://data/streambatch.catalog.npz", "s3://data/streambatch.catalog.npz",
                             opts, s3.storage_options(px.url), None)
        get_shards = [r for r in px.requests if r.method == "GET" and ".tar " in r.target + " "]
    _check_world(results, corpus, "train-000005.tar")
    assert get_shards  # the broken run went through the proxy
