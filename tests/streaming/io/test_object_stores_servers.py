"""GCS, Azure Blob and the Hugging Face Hub against real servers on
127.0.0.1: fake-gcs-server (gcsfs), Azurite (adlfs), and nginx laid out like
the Hub's ``resolve`` URLs and demanding a bearer token; the fault proxy sits
in front of each. What holds for S3 and HTTP (test_remote_servers.py) holds
here: indexing reads only headers, streaming matches local files batch for
batch with at most 2 data GETs per shard in shard mode, faults are retried
with nothing lost, refusals (missing objects, bad or missing credentials)
fail at once on every rank, 4 ranks x 2 workers give equal steps."""

from __future__ import annotations

import collections
import os
import shutil
import time

import pytest
from torch.utils.data import DataLoader

from streambatch.streaming import ShardError, StreamingBatches, index_shards
from streambatch.streaming.io.remote import RemoteShard
from streambatch.streaming.io.retry import RetryPolicy
from streambatch.streaming.shards.sidecar import read_arrays, sidecar_path
from tests.streaming.io.test_remote_servers import _check_world, _run_world, keys, local_epochs, speech_shards
from tests.support.cloud_servers import azurite_server, gcs_server
from tests.support.launch_remote import BUDGET, CAP, WINDOW
from tests.support.servers import FaultProxy, nginx_server
from tests.support.shards import FPS

pytestmark = pytest.mark.slow

SIZES = [21, 17, 0, 25, 19, 23, 14, 20]
NONEMPTY = sum(1 for n in SIZES if n)
BACKENDS = ["gs", "az"]


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=5, name="shards")
    return c.directory, c.brace, c.paths, c.expected


class Store:
    """One running server with the corpus uploaded to bucket/container 'data'."""

    def __init__(self, scheme, server, corpus):
        self.scheme, self.server = scheme, server
        self.urls = server.upload_dir("data", corpus[0])
        index_shards(self.urls, frames_per_second=FPS, storage_options=self.options(), progress=False)

    def options(self, proxy: FaultProxy | None = None) -> dict:
        if proxy is None:
            return self.server.storage_options()
        if self.scheme == "az":
            return self.server.storage_options(f"{proxy.url}/devstoreaccount1")
        return self.server.storage_options(proxy.url)

    @property
    def catalog(self) -> str:
        return f"{self.scheme}://data/streambatch.catalog.npz"


@pytest.fixture(scope="module", params=BACKENDS)
def store(request, corpus):
    server = gcs_server if request.param == "gs" else azurite_server
    with server() as s:
        yield Store(request.param, s, corpus)


def data_gets(proxy: FaultProxy) -> collections.Counter:
    """Data GETs per shard name seen by the proxy (GCS: ``alt=media`` downloads;
    Azure: ranged blob GETs); metadata requests are not counted."""
    out: collections.Counter = collections.Counter()
    for r in proxy.requests:
        if r.method != "GET" or ".tar" not in r.target or ".idx.npz" in r.target or ".catalog" in r.target:
            continue
        if "alt=media" in r.target or r.range:
            name = r.target.split("?", 1)[0].rsplit("/", 1)[-1].replace("%2F", "/").rsplit("/", 1)[-1]
            out[name] += 1
    return out


# ---------------------------------------------------------------- indexing


@pytest.mark.parametrize("scheme", BACKENDS)
def test_indexing_reads_only_headers(tmp_path, scheme):
    speech_shards(tmp_path / "sp", seconds=(2.0, 6.0))
    total = sum(os.path.getsize(tmp_path / "sp" / f) for f in os.listdir(tmp_path / "sp"))
    with (gcs_server if scheme == "gs" else azurite_server)() as server:
        urls = server.upload_dir("speech", str(tmp_path / "sp"))
        with FaultProxy(server.port) as px:
            opts = Store.options(type("S", (), {"scheme": scheme, "server": server})(), px)
            s = index_shards(urls, length_from="audio", frames_per_second=FPS, storage_options=opts, progress=False)
            down = px.bytes_down
        assert s.indexed == 3 and s.samples == 24
        # headers of each member, metadata requests and the writes' answers: a small part of the audio
        assert down <= 0.15 * total, f"indexing read {down} of {total} bytes ({down / total:.1%})"
        keys_, lengths = read_arrays(sidecar_path(urls[0]), ("keys", "lengths"), server.storage_options())
        assert len(keys_) == 8 and (lengths > 0).all()  # the sidecar sits next to the shard in the bucket


# ---------------------------------------------------------------- streaming


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("read_mode", ["shard", "sample"])
def test_streaming_matches_local(corpus, store, tmp_path, workers, read_mode):
    world = 3
    with FaultProxy(store.server.port) as px:
        got = []
        for r in range(world):
            ds = StreamingBatches(store.catalog, BUDGET, CAP, window_samples=WINDOW, rank=r, world_size=world,
                                  storage_options=store.options(px), cache_dir=str(tmp_path), prefetch_shards=2,
                                  read_mode=read_mode)
            got.append(keys(DataLoader(ds, batch_size=None, num_workers=workers)))
        gets = data_gets(px)
    assert got == local_epochs(corpus, world, read_mode=read_mode)
    if read_mode == "shard":  # each shard in at most 2 pieces across the job
        assert sum(gets.values()) <= 2 * NONEMPTY, gets
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".data")]  # evicted


def test_faults_are_retried_and_nothing_is_lost(corpus, store, tmp_path):
    with FaultProxy(store.server.port) as px:
        px.match = ".tar"
        px.reset_every, px.reset_after, px.stall = 3, 20000, 0.2
        if store.scheme == "gs":
            # gcsfs retries a 503 itself; Azure's SDK waits 15 s+ before its own retry of one, so resets only
            px.fail_every = 5
        ds = StreamingBatches(store.catalog, BUDGET, CAP, window_samples=WINDOW, storage_options=store.options(px),
                              cache_dir=str(tmp_path), retry=RetryPolicy(retries=8, backoff=0.01))
        assert keys(DataLoader(ds, batch_size=None, num_workers=2)) == local_epochs(corpus, 1)[0]
        assert px.faults_fired() >= 2


def test_refusals_fail_at_once_naming_what_to_check(corpus, store, tmp_path):
    missing = f"{store.scheme}://data/no-such-shard.tar"
    hint = "'token'" if store.scheme == "gs" else "sas_token"
    t = time.monotonic()
    with pytest.raises(ShardError, match=rf"no-such-shard\.tar.*{hint}"):
        RemoteShard(missing, store.options(), retry=RetryPolicy(retries=5, backoff=1.0)).info()
    assert time.monotonic() - t < 5  # a 404 is not retried (5 retries from 1 s backoff would take 30 s+)
    # a shard deleted after indexing: the epoch stops at it, naming it, within seconds
    bucket = f"gone{store.scheme}"
    urls = store.server.upload_dir(bucket, corpus[0])
    index_shards(urls, frames_per_second=FPS, storage_options=store.options(), progress=False)
    store.server.fs().rm(f"{bucket}/train-000003.tar")
    ds = StreamingBatches(f"{store.scheme}://{bucket}/streambatch.catalog.npz", BUDGET, CAP, window_samples=WINDOW,
                          storage_options=store.options(), cache_dir=str(tmp_path), verify=False,
                          retry=RetryPolicy(retries=5, backoff=1.0))
    t = time.monotonic()
    with pytest.raises(ShardError, match=r"train-000003\.tar at byte"):
        list(ds)
    assert time.monotonic() - t < 10
    if store.scheme == "az":  # a wrong account key: 403, not retried
        bad = {"connection_string": store.options()["connection_string"].replace("AccountKey=Eby8", "AccountKey=Xby8")}
        t = time.monotonic()
        with pytest.raises(ShardError, match="sas_token"):
            RemoteShard(store.urls[0], bad, retry=RetryPolicy(retries=5, backoff=1.0)).info()
        assert time.monotonic() - t < 5


def test_four_ranks_two_workers(corpus, store, tmp_path):
    """Equal steps, exactly-once, local batches; a shard missing on the store
    is reported by every rank (none hangs)."""
    bucket = f"broken{store.scheme}"
    urls = store.server.upload_dir(bucket, corpus[0])
    index_shards(urls, frames_per_second=FPS, storage_options=store.options(), progress=False)
    store.server.fs().rm(f"{bucket}/train-000005.tar")
    results = _run_world(tmp_path, store.catalog, f"{store.scheme}://{bucket}/streambatch.catalog.npz",
                         store.options(), store.options(), None)
    _check_world(results, corpus, "train-000005.tar")


# ---------------------------------------------------------------- the Hub


TOKEN = "hf_localtesttoken"
REPO_PATH = "datasets/org/speech/resolve/main"


@pytest.fixture(scope="module")
def hub(corpus, tmp_path_factory):
    """nginx laid out like the Hub (``/datasets/org/name/resolve/main/<file>``), answering 401 without the token."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / REPO_PATH
    repo.mkdir(parents=True)
    for p in corpus[2]:
        shutil.copy(p, repo)
    with nginx_server(root, bearer=TOKEN) as ng:
        yield ng


def hub_urls(hub):
    return [f"{hub.url}/{REPO_PATH}/train-{i:06d}.tar" for i in range(len(SIZES))]


def test_hub_urls_index_locally_and_stream_with_the_token(corpus, hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # the Hub's host gets HF_TOKEN; no other host does
    monkeypatch.setenv("STREAMBATCH_INSECURE_HTTP", hub.url)  # a plain-http test server: named to get the token
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("STREAMBATCH_INDEX_DIR", str(tmp_path / "home"))
    urls = hub_urls(hub)
    s = index_shards(urls, frames_per_second=FPS, progress=False)  # no index_dir: nothing is uploaded
    assert s.indexed == len(SIZES)
    log = hub.log()
    assert {e.method for e in log} <= {"GET", "HEAD"} and all(e.status in (200, 206) for e in log)
    made = [f for _, _, fs in os.walk(tmp_path / "home") for f in fs]
    assert "streambatch.catalog.npz" in made and sum(f.endswith(".idx.npz") for f in made) == len(SIZES)
    for r, want in enumerate(local_epochs(corpus, 2)):
        ds = StreamingBatches(urls, BUDGET, CAP, window_samples=WINDOW, rank=r, world_size=2,
                              cache_dir=str(tmp_path / "cache"))
        assert keys(DataLoader(ds, batch_size=None, num_workers=2)) == want
    # without the token: 401 on every request, not retried, and the message says what to set
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN_PATH", os.devnull)
    t = time.monotonic()
    with pytest.raises(ShardError, match=r"cannot be read before training.*401.*set HF_TOKEN"):
        StreamingBatches(urls, BUDGET, CAP, window_samples=WINDOW, cache_dir=str(tmp_path / "cache"),
                         retry=RetryPolicy(retries=5, backoff=1.0))
    assert time.monotonic() - t < 5  # checked before training, not retried


def test_hub_index_write_refused_names_index_dir(corpus, hub, monkeypatch):
    # a write next to a read-only shard (asked for explicitly) is one clear error naming index_dir
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("STREAMBATCH_INSECURE_HTTP", hub.url)  # a plain-http test server: named to get the token
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(ShardError, match=r"index_dir=DIR"):
        index_shards(hub_urls(hub)[:1], frames_per_second=FPS, index_dir=f"{hub.url}/{REPO_PATH}", progress=False)


def test_hf_paths_refused_by_the_hub_are_not_retried(hub, tmp_path, monkeypatch):
    """hf:// through HfFileSystem against a local endpoint that refuses (401:
    a private or gated repo): one error naming HF_TOKEN within seconds."""
    pytest.importorskip("huggingface_hub")
    opts = {"endpoint": hub.url, "token": "hf_wrong"}
    hub.clear_log()
    with pytest.raises(ValueError, match=rf"plain http.*STREAMBATCH_INSECURE_HTTP={hub.url}"):
        RemoteShard("hf://datasets/org/speech/train-000000.tar", opts).info()  # a token for a plain-http endpoint
    assert hub.log(expect=0, timeout=1) == []  # refused before any request
    monkeypatch.setenv("STREAMBATCH_INSECURE_HTTP", hub.url)  # a plain-http test server: named to get the token
    t = time.monotonic()
    with pytest.raises(ShardError, match="HF_TOKEN"):
        RemoteShard("hf://datasets/org/speech/train-000000.tar", opts,
                    retry=RetryPolicy(retries=5, backoff=1.0)).info()
    assert time.monotonic() - t < 5
    with pytest.raises((ShardError, FileNotFoundError), match="HF_TOKEN|no usable sidecar|hf://"):
        StreamingBatches("hf://datasets/org/speech/train-{000000..000001}.tar", BUDGET, CAP, storage_options=opts,
                         index_dir=str(tmp_path), retry=RetryPolicy(retries=5, backoff=1.0))


def test_replaced_object_is_refused_before_and_during_training(corpus, store, tmp_path):
    bucket = f"stale{store.scheme}"
    urls = store.server.upload_dir(bucket, corpus[0])
    index_shards(urls, frames_per_second=FPS, storage_options=store.options(), progress=False)
    catalog = f"{store.scheme}://{bucket}/streambatch.catalog.npz"
    StreamingBatches(catalog, BUDGET, CAP, storage_options=store.options())  # current: fine
    with open(corpus[2][1], "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 1  # the same size: only the ETag / generation tells
    store.server.fs().pipe_file(f"{bucket}/train-000001.tar", bytes(data))  # replaced after indexing
    with pytest.raises(ShardError, match=r"changed since they were indexed.*train-000001\.tar"):
        StreamingBatches(catalog, BUDGET, CAP, storage_options=store.options())
    # not checked up front: the ranged reads compare size and ETag/generation with the index
    ds = StreamingBatches(catalog, BUDGET, CAP, window_samples=WINDOW, storage_options=store.options(), verify=False,
                          cache_dir=str(tmp_path))
    with pytest.raises(ShardError, match=r"train-000001\.tar changed since it was indexed"):
        list(ds)


def test_hub_four_ranks_two_workers_behind_faults_and_a_refused_token(corpus, hub, tmp_path, monkeypatch):
    """4 ranks x 2 workers over the token-guarded Hub layout through the fault
    proxy (resets retried, nothing lost, equal steps); then a wrong token of
    the user's own: every rank raises the 401 within seconds, none hangs."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # inherited by the spawned ranks
    monkeypatch.setenv("STREAMBATCH_INDEX_DIR", str(tmp_path / "home"))
    with FaultProxy(hub.port) as px:
        monkeypatch.setenv("HF_ENDPOINT", px.url)
        monkeypatch.setenv("STREAMBATCH_INSECURE_HTTP", px.url)  # plain http: named to get the token (and header)
        urls = [f"{px.url}/{REPO_PATH}/train-{i:06d}.tar" for i in range(len(SIZES))]
        index_shards(urls, frames_per_second=FPS, progress=False)
        catalog = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "home") for f in fs
                   if f == "streambatch.catalog.npz"][0]
        px.match, px.reset_every, px.reset_after, px.stall = ".tar ", 4, 3000, 0.2
        wrong = {"headers": {"Authorization": "Bearer hf_wrong"}}
        results = _run_world(tmp_path / "out", catalog, catalog, None, wrong, None)
        assert px.faults_fired() >= 1
    expected = corpus[3]
    assert len({len(r["epoch"]) for r in results}) == 1 and all(len(r["epoch"]) == r["len"] for r in results)
    counts = collections.Counter(k for r in results for b in r["epoch"] for k in b)
    assert set(counts) == set(expected)
    assert [r["epoch"] for r in results] == local_epochs(corpus, 4)
    for r in results:
        assert "401" in r["error"] and "HF_TOKEN" in r["error"], r["error"]
