"""Shard mode's newer paths against real servers on 127.0.0.1: mixed sources
streamed from nginx (quotas delivered once, equal steps, the same batches as
the mix over local files, few GETs per shard), elastic resume at another
world size from moto's S3 server (every sample once across both worlds, the
same batches as the same resize over local files), and a mix whose second
source sits behind the fault proxy (nothing lost, batches unchanged). Ranks
are simulated in one process, each with its own cache directory (as on
separate nodes)."""

from __future__ import annotations

import collections
import os

import pytest
from torch.utils.data import DataLoader

from streambatch.streaming import Source, StreamingBatches, index_shards
from streambatch.streaming.io.retry import RetryPolicy
from tests.support.corpus import index_corpus
from tests.support.servers import FaultProxy, nginx_server, s3_server
from tests.support.shards import FPS, write_corpus

pytestmark = pytest.mark.slow

BUDGET, CAP = 400, 6
# Two corpora with different lengths: short clips, and long ones (median 0.4 s, some above a fifth of the
# budget: pooled outliers). A is down-sampled by the 0.7 / 0.3 mix, B up-sampled (its cycle wraps).
A_SIZES = [30, 25, 0, 35, 20, 28, 31, 22]
B_SIZES = [12, 14, 9, 16, 11, 13]
WEIGHTS = (0.7, 0.3)
MIX_WINDOW = 50


def keys(batches):
    return [[s["__key__"] for s in b] for b in batches]


def tar_gets(log):
    return collections.Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".tar"))


# ---------------------------------------------------------------- mixed sources over HTTP


@pytest.fixture(scope="module")
def mix_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    a, pa, ka = write_corpus(root / "a", A_SIZES, seed=21, prefix="a")
    b, pb, kb = write_corpus(root / "b", B_SIZES, seed=22, prefix="b", median=0.4, longest=1.2)
    for brace in (a, b):  # sidecars next to the local shards, for the local reference
        index_corpus(brace)
    return str(root), (a, b), (pa, pb), (ka, kb)


@pytest.fixture(scope="module")
def mix_nginx(mix_corpus):
    with nginx_server(mix_corpus[0]) as ng:
        yield ng


@pytest.fixture(scope="module")
def mix_http(mix_corpus, mix_nginx, tmp_path_factory):
    """Each source's shard URLs on nginx and its own index directory."""
    urls, idxs = [], []
    for name, paths in zip("ab", mix_corpus[2]):
        u = [f"{mix_nginx.url}/{name}/{os.path.basename(p)}" for p in paths]
        idx = str(tmp_path_factory.mktemp(f"idx-{name}"))
        index_shards(u, frames_per_second=FPS, index_dir=idx, progress=False)
        urls.append(u)
        idxs.append(idx)
    return urls, idxs


def mixed(urls, idxs, rank, world, **kw):
    sources = [Source(u, weight=w, index_dir=i) for u, w, i in zip(urls, WEIGHTS, idxs)]
    return StreamingBatches(sources, BUDGET, CAP, window_samples=MIX_WINDOW, rank=rank, world_size=world, **kw)


def mix_epoch(urls, idxs, world, epoch, tmp=None, workers=0, **kw):
    """Every rank's batches of ``epoch`` (ranks simulated in this process) and rank 0's dataset."""
    out, first = [], None
    for r in range(world):
        if tmp is not None:
            kw["cache_dir"] = os.path.join(tmp, f"cache{r}")
        ds = mixed(urls, idxs, r, world, **kw)
        ds.set_epoch(epoch)
        out.append(keys(DataLoader(ds, batch_size=None, num_workers=workers)))
        assert len(out[-1]) == len(ds)  # every rank: the same number of steps, len() exact
        first = first or ds
    return out, first


def local_mix(mix_corpus, world, epoch):
    return mix_epoch(mix_corpus[1], (None, None), world, epoch, read_mode="shard")[0]


def check_quotas(ranks, ds, mix_corpus, epoch):
    """Epoch 0 of the mix: A's quota (< its size) is that many distinct samples, B's (> its size) all of B
    and the start of its second cycle; repeats beyond that are the final step's padding."""
    ka, kb = mix_corpus[3]
    qa, qb = ds.sources.mix.counts
    assert qa < len(ka) and qb > len(kb)  # the mix down-samples A and up-samples B
    got = collections.Counter(k for r in ranks for b in r for k in b)
    a = {k: v for k, v in got.items() if k in ka}
    b = {k: v for k, v in got.items() if k in kb}
    assert len(a) + len(b) == len(got)
    padded = ds.epoch_summary(epoch).padded
    assert len(a) == qa and set(b) == set(kb)
    repeats = sum(v - 1 for v in a.values()) + sum(v - 1 for v in b.values()) - (qb - len(kb))
    assert repeats == padded and padded <= len(ranks) - 1
    assert sum(got.values()) == qa + qb + padded


@pytest.mark.parametrize("world, workers", [(2, 2), (3, 0)])
def test_mixed_sources_over_http(mix_corpus, mix_nginx, mix_http, tmp_path, world, workers, caplog):
    urls, idxs = mix_http
    mix_nginx.clear_log()
    with caplog.at_level("WARNING", logger="streambatch.streaming"):
        got, ds = mix_epoch(urls, idxs, world, 0, str(tmp_path), workers=workers, prefetch_shards=2)
    # a retry (a socket timeout on a loaded machine: seen once in CI) is one more GET, resuming at the byte
    # reached; counted here when this process reads (workers=0: their log records reach caplog)
    retries = sum("retrying shard" in r.getMessage() for r in caplog.records)
    assert ds.config.read_mode == "shard"  # the default for remote sources
    assert len({len(r) for r in got}) == 1
    assert got == local_mix(mix_corpus, world, 0)
    check_quotas(got, ds, mix_corpus, 0)
    # Each rank streams its piece of every source in a window: per window at most
    # shards + S x (W - 1) ranged reads (README, "Mixing corpora"), here the library's own rank_reads.
    gets = tar_gets(mix_nginx.log())
    planned = bound = 0
    for win in ds.plan.windows(0):
        rows = {(r, s) for r in range(world) for s, _, _ in win.rank_reads(r)}
        planned += len(rows)
        new = win.shard_ids[win.n_carried:]
        bound += len(set(new.tolist())) + len(WEIGHTS) * (world - 1)
    assert sum(gets.values()) <= min(planned, bound) + retries, (sum(gets.values()), planned, bound, retries)
    windows = len(list(ds.plan.windows(0)))
    assert max(gets.values()) <= world * 2 + windows + retries, gets  # few GETs per shard
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".data")]  # evicted


def test_mixed_sources_behind_faults(mix_corpus, mix_nginx, mix_http, tmp_path):
    urls, idxs = mix_http
    world = 2
    clean = local_mix(mix_corpus, world, 1)
    with FaultProxy(mix_nginx.port) as px:
        px.match = ".tar "
        px.reset_every, px.reset_after, px.fail_every = 3, 6000, 5
        px.stall = 0.2  # the bytes before a reset reach the client first
        faulty = [urls[0], [u.replace(mix_nginx.url, px.url) for u in urls[1]]]  # source B only
        got, ds = mix_epoch(faulty, idxs, world, 1, str(tmp_path), workers=2,
                            retry=RetryPolicy(retries=8, backoff=0.01))
        assert got == clean  # nothing lost or repeated, the same batches
        assert ds.num_skipped == 0
        assert px.faults_fired() >= 3
        assert {r.fault for r in px.requests} >= {"503", "reset"}
        resumed = [r.range for r in px.requests if r.range]
        assert resumed and all(r.startswith("bytes=") for r in resumed)
        assert all("/b/" in r.target for r in px.requests if r.method == "GET")


# ---------------------------------------------------------------- elastic resume over S3

SIZES = [21, 17, 0, 25, 19, 23, 14, 22, 18, 20, 16, 24, 15, 21, 19, 13]
WINDOW = 60


@pytest.fixture(scope="module")
def s3_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("elastic")
    brace, _, expected = write_corpus(d, SIZES, seed=17)
    index_corpus(brace)
    with s3_server() as server:
        urls = server.upload_dir("elastic", str(d))
        opts = server.storage_options()
        index_shards(urls, frames_per_second=FPS, storage_options=opts, progress=False)  # sidecars in the bucket
        yield brace, expected, server


def run(src, world, state=None, steps=None, tmp=None, **kw):
    """Every rank of a world in this process: resume from ``state`` (else start epoch 1), take ``steps``
    batches (default: all); returns the batches, len() and rank 0's state after."""
    out, states = [], []
    for r in range(world):
        if tmp is not None:
            kw["cache_dir"] = os.path.join(tmp, f"w{world}-cache{r}")
        ds = StreamingBatches(src, BUDGET, CAP, window_samples=WINDOW, rank=r, world_size=world, **kw)
        ds.set_epoch(1)
        if state is not None:
            ds.load_state_dict(state)
        it = iter(ds)
        out.append(keys(b for _, b in zip(range(steps if steps is not None else 10**9), it)))
        states.append(ds.state_dict())
    assert all(s == states[0] for s in states)
    return out, len(ds), states[0]


@pytest.mark.parametrize("frac", [0.45, "boundary"])
def test_elastic_resume_over_s3(s3_corpus, tmp_path, frac):
    brace, expected, server = s3_corpus
    local = dict(read_mode="shard")
    full, n0, _ = run(brace, 4, **local)
    if frac == "boundary":
        ds = StreamingBatches(brace, BUDGET, CAP, window_samples=WINDOW, rank=0, world_size=4, **local)
        starts = [w.first_step for w in ds.plan.windows(1)]
        k = starts[len(starts) // 2]
    else:
        k = int(frac * n0)
    local_head, _, local_state = run(brace, 4, steps=k, **local)
    local_tail, _, _ = run(brace, 3, local_state, **local)

    opts = server.storage_options()
    src = "s3://elastic/streambatch.catalog.npz"
    remote = dict(storage_options=opts, tmp=str(tmp_path), prefetch_shards=2)
    head, m0, state = run(src, 4, steps=k, **remote)
    assert head == local_head and m0 == n0  # shard mode, by default for s3://
    assert {**state, "fingerprint": 0} == {**local_state, "fingerprint": 0}  # the fingerprint covers the URLs
    assert state["step"] == k
    with FaultProxy(server.port) as px:  # no faults: counts the new world's requests
        tail, n1, end = run(src, 3, state, **{**remote, "storage_options": server.storage_options(px.url)})
        gets = [r for r in px.requests if r.method == "GET" and r.target.split("?")[0].endswith(".tar")]
    assert end["segments"] == [[4, k]] and end["step"] == n1
    # the new world's reads: a ranged GET per (rank, shard) of what it streams or trains in a window, at most
    # (the interrupted window finished in sample mode, one small read per sample; later windows shard-affine)
    ds = StreamingBatches(src, BUDGET, CAP, window_samples=WINDOW, rank=0, world_size=3, storage_options=opts)
    planned = 0
    for win in ds.plan.windows(1, ((4, k),)):
        if win.plan.world_size != 3 or win.first_step + win.num_steps <= k:
            continue
        for r in range(3):
            trained = [win.plan.batch(t, r) for t in range(max(0, k - win.first_step), win.num_steps)]
            shards = {int(win.shard_ids[i]) for b in trained for i in b}
            planned += len(shards | {s for s, _, _ in (win.rank_reads(r) if win.reads is not None else ())})
    assert gets and len(gets) <= planned, (len(gets), planned)
    assert len({len(t) for t in tail}) == 1 and n1 == k + len(tail[0])  # equal steps among the new ranks
    assert tail == local_tail  # the same batches as the same resize over local files
    got = collections.Counter(x for part in (head, tail) for rank in part for b in rank for x in b)
    assert set(got) == set(expected)  # every sample, once but for each world's final-step padding
    assert sum(got.values()) - len(got) <= (4 - 1) + (3 - 1)
    new_caches = [os.path.join(tmp_path, f"w3-cache{r}") for r in range(3)]  # (the old world was cut short)
    assert not [f for d in new_caches for _, _, fs in os.walk(d) for f in fs if f.endswith(".data")]  # evicted
