"""Remote-shard I/O, the parts that need no server: secrets scrubbed from
messages, retry classification, the shard cache and StreamingBatches over
``pipe:`` shards (which go through the same cache as s3/http shards).
Server-backed tests: test_remote_servers.py."""

from __future__ import annotations

import collections
import io
import os
import sys

import numpy as np
import pytest
from torch.utils.data import DataLoader

from streambatch.core.redact import scrub, scrub_options, scrub_url
from streambatch.epoch.windows import worker_steps
from streambatch.streaming import ShardError, StreamingBatches, index_shards
from streambatch.streaming.io.cache import ShardCache, ShardRef
from streambatch.streaming.io.disk import run_dir, sweep_dead_runs
from streambatch.streaming.io.objects import filesystem, is_remote, object_identity
from streambatch.streaming.io.remote import RemoteShard
from streambatch.streaming.io.retry import HTTPStatusError, RetryPolicy, ShortRead, is_transient
from streambatch.streaming.pipeline.steps import lookahead
from tests.support.corpus import index_corpus
from tests.support.shards import FPS, write_corpus

SIZES = [21, 17, 0, 25, 19, 23, 14]
BUDGET, CAP = 400, 12


@pytest.fixture(scope="module")
def corpus(make_corpus):
    c = make_corpus(SIZES, seed=3, name="remote", pipes=True)
    brace, paths, expected, pipes, idx = c.brace, c.paths, c.expected, c.pipes, c.index_dir
    return brace, paths, pipes, idx, expected


def keys(batches):
    return [tuple(s["__key__"] for s in b) for b in batches]


# ---------------------------------------------------------------- secrets


def test_secrets_never_reach_messages():
    url = "https://alice:hunter2@host/x.tar?X-Amz-Signature=abc123&X-Amz-Credential=AKIA9&part=1"
    for text in (scrub(url), scrub_url(url), scrub(f"error fetching {url}: reset")):
        assert "hunter2" not in text and "abc123" not in text and "AKIA9" not in text
        assert "host/x.tar" in text
    assert "part=1" in scrub(url)
    opts = {"key": "AKIA9", "secret": "s3cr3t", "token": None, "anon": False,
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_session_token": "SESSXYZ"}}
    masked = scrub_options(opts)
    assert "AKIA9" not in repr(masked) and "s3cr3t" not in repr(masked) and "SESSXYZ" not in repr(masked)
    assert masked["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:9000" and masked["anon"] is False


def test_remote_url_classes_and_missing_backend(monkeypatch):
    assert [is_remote(u) for u in ("a.tar", "/x/a.tar", "file:///x/a.tar", "pipe:cat a.tar", "s3://b/a.tar",
                                    "https://h/a.tar", "hf://datasets/o/n/a.tar", "az://c/a.tar")] == [
        False, False, False, False, True, True, True, True]
    import fsspec  # noqa: F401

    registry = sys.modules["fsspec.registry"]._registry  # (fsspec.registry is a read-only view of it)
    # the backends are dev dependencies here: make them missing (None in sys.modules fails their import)
    for proto, package, extra in (("gs", "gcsfs", "gcs"), ("az", "adlfs", "azure")):
        monkeypatch.setitem(sys.modules, package, None)
        monkeypatch.delitem(registry, proto, raising=False)  # forget a class already imported
        with pytest.raises(ImportError, match=rf"needs {package}: pip install 'streambatch\[{extra}\]'"):
            filesystem(f"{proto}://bucket/a.tar")
    with pytest.raises(ValueError, match="no fsspec backend reads"):
        filesystem("nosuchproto://bucket/a.tar")


def test_transient_errors_are_retried_and_others_are_not():
    assert is_transient(ConnectionResetError()) and is_transient(TimeoutError()) and is_transient(ShortRead("x"))
    assert is_transient(HTTPStatusError(503, "u")) and is_transient(HTTPStatusError(429, "u"))
    assert not is_transient(HTTPStatusError(416, "u"))
    assert not is_transient(FileNotFoundError()) and not is_transient(PermissionError())
    assert not is_transient(TypeError("a bug"))
    with pytest.raises(ValueError, match="retries"):
        RetryPolicy(retries=-1)
    assert object_identity({"size": 10, "ETag": '"abc"'}) == (10, "abc")
    assert object_identity({"size": 10, "lfs": {"sha256": "f00"}}) == (10, "f00")


def test_lookahead_and_worker_steps():
    assert list(lookahead([1, 2, 3])) == [(1, 2), (2, 3), (3, None)]
    assert list(lookahead([], True)) == []
    assert list(lookahead(iter([1, 2]), False)) == [(1, None), (2, None)]
    assert list(worker_steps(10, 20, 1, 4)) == [13, 17]
    assert list(worker_steps(10, 20, 14, 4)) == [14, 18]


# ---------------------------------------------------------------- cache


def test_shard_download_and_cache_release(corpus, tmp_path):
    _, paths, pipes, _, _ = corpus
    size = os.path.getsize(paths[0])
    out = io.BytesIO()
    assert RemoteShard(pipes[0], size=size).download(out) == size
    with open(paths[0], "rb") as f:
        original = f.read()
    assert out.getvalue() == original
    with pytest.raises(ShardError, match=r"changed since it was indexed.*\d+ bytes"):
        RemoteShard(pipes[0], size=size - 512, retry=RetryPolicy(backoff=0)).download(io.BytesIO())

    cache = ShardCache(str(tmp_path / "c"), prefetch_shards=2)
    ref = ShardRef(pipes[0], size)
    cache.schedule([ref, ShardRef(pipes[1])])
    path = cache.get(ref)
    with open(path, "rb") as f:
        assert f.read() == original
    assert cache.fetch(ref) == path  # already there: no second download
    cache.release(ref, "e0w0", consumers=2)
    assert os.path.exists(path)  # one of two readers done
    cache.release(ref, "e0w0", consumers=2)
    assert not os.path.exists(path)
    cache.close()

    bad = ShardCache(str(tmp_path / "c2"), retry=RetryPolicy(retries=1, backoff=0))
    missing = ShardRef(f"pipe:cat {tmp_path}/missing.tar", 1024)
    for _ in range(2):  # every sample of a failed shard gets the same named error
        with pytest.raises(ShardError, match=r"missing\.tar.*byte 0"):
            bad.get(missing)
    bad.close()


def test_dead_runs_are_swept(tmp_path):
    root = str(tmp_path)
    mine = run_dir(root, os.getpid(), 0)
    os.makedirs(mine)
    dead = run_dir(root, 2**22 + 12345, 1)  # above the default pid_max: never a live process
    os.makedirs(dead)
    assert sweep_dead_runs(root) == 1
    assert os.path.isdir(mine) and not os.path.exists(dead)


# ---------------------------------------------------------------- StreamingBatches over pipe: shards


@pytest.mark.parametrize("workers", [0, 2])
def test_pipe_shards_stream_like_local_files(corpus, tmp_path, workers):
    brace, _, pipes, idx, expected = corpus
    world = 2
    got, want = [], []
    for r in range(world):
        local = StreamingBatches(brace, BUDGET, CAP, window_samples=40, rank=r, world_size=world, read_mode="shard")
        remote = StreamingBatches(pipes, BUDGET, CAP, window_samples=40, rank=r, world_size=world, index_dir=idx,
                                  cache_dir=str(tmp_path), prefetch_shards=2)  # pipe: -> shard mode by default
        assert len(local) == len(remote)
        want.append(keys(local))
        loader = DataLoader(remote, batch_size=None, num_workers=workers)
        got.append(keys(loader))
    assert got == want
    counts = collections.Counter(k for r in got for b in r for k in b)
    assert set(counts) == set(expected)
    # every window's shards were deleted once all of the rank's workers were done with them
    left = [f for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".data")]
    assert left == []


def test_pipe_shard_failure_raises_or_skips_with_equal_steps(corpus, tmp_path):
    _, paths, pipes, idx, _ = corpus
    broken = list(pipes)
    broken[3] = f"pipe:head -c 2000 {paths[3]}"  # the stream ends early; same sidecar name (last word)
    broken_idx = str(tmp_path / "idx")
    os.makedirs(broken_idx)
    for p in paths:
        name = os.path.basename(p) + ".idx.npz"
        os.symlink(os.path.join(idx, name), os.path.join(broken_idx, name))
    ok = StreamingBatches(pipes, BUDGET, CAP, window_samples=40, index_dir=idx, cache_dir=str(tmp_path))
    kw = dict(window_samples=40, index_dir=broken_idx, cache_dir=str(tmp_path), retry=RetryPolicy(1, backoff=0),
              verify=False)
    with pytest.raises(ShardError, match=r"train-000003\.tar.*byte"):
        list(StreamingBatches(broken, BUDGET, CAP, **kw))
    skip = StreamingBatches(broken, BUDGET, CAP, on_error="skip", **kw)
    batches = keys(skip)
    assert len(batches) == len(ok) and skip.num_skipped == SIZES[3]
    assert sum(map(len, batches)) == sum(SIZES) - SIZES[3]
    assert np.all([not k.startswith("x") for b in batches for k in b])


# ---------------------------------------------------------------- catalog, parts, command line


def test_parts_merge_into_the_catalog_and_reruns_skip_current_sidecars(tmp_path):
    from streambatch.streaming.shards.catalog_file import read_catalog
    from streambatch.streaming.shards.indexer import merge_catalog

    brace, paths, expected = write_corpus(tmp_path / "d", SIZES, seed=9)
    one = str(tmp_path / "one.catalog.npz")
    index_corpus(brace, catalog=one)
    parted = str(tmp_path / "parted.catalog.npz")
    for i in range(3):
        s = index_corpus(brace, part=f"{i}/3", catalog=parted)
        assert s.shards == len(range(i, len(SIZES), 3)) and s.indexed == 0  # sidecars already current
    with pytest.raises(FileNotFoundError, match="part"):
        merge_catalog(brace, 4, catalog=parted)
    merge_catalog(brace, 3, catalog=parted)
    a, b = read_catalog(one), read_catalog(parted)
    assert a["urls"] == b["urls"] == paths and a["digests"] == b["digests"]
    assert np.array_equal(a["counts"], b["counts"]) and np.array_equal(a["lengths"], b["lengths"])
    ds_a = StreamingBatches(parted, BUDGET, CAP, window_samples=40, world_size=2, rank=1)
    ds_b = StreamingBatches(brace, BUDGET, CAP, window_samples=40, world_size=2, rank=1)
    assert ds_a.fingerprint == ds_b.fingerprint and keys(ds_a) == keys(ds_b)
    with pytest.raises(ValueError, match="part must look like I/N"):
        index_shards(brace, part="1:3")
    with pytest.raises(ValueError, match="out of range"):
        index_shards(brace, part=(3, 3))


def test_cli_storage_options_parts_and_merge(tmp_path, capsys):
    from streambatch.cli.index import storage_options
    from streambatch.cli.main import main

    assert storage_options(["anon=true", "client_kwargs.endpoint_url=http://h:9", "key=abc", "n=3"]) == {
        "anon": True, "client_kwargs": {"endpoint_url": "http://h:9"}, "key": "abc", "n": 3}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        storage_options(["anon"])
    brace, _, _ = write_corpus(tmp_path / "d", SIZES[:4], seed=2)
    cat = str(tmp_path / "x.catalog.npz")
    for i in range(2):
        assert main(["index", brace, "--fps", str(FPS), "--workers", "1", "--no-progress", "--part", f"{i}/2",
                     "--catalog", cat]) == 0
    assert "--merge 2" in capsys.readouterr().out
    assert main(["index", brace, "--merge", "2", "--catalog", cat]) == 0
    assert f"catalog of 4 shards, {sum(SIZES[:4])} samples" in capsys.readouterr().out
    assert len(StreamingBatches(cat, BUDGET, CAP)) > 0


@pytest.mark.slow
def test_index_split_and_merged_under_torchrun(tmp_path):
    import subprocess
    import sys

    from streambatch.streaming.shards.catalog_file import read_catalog
    from tests.support.helpers import ROOT, free_port

    brace, paths, _ = write_corpus(tmp_path / "d", SIZES, seed=4)
    cat = str(tmp_path / "t.catalog.npz")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "streambatch.cli",
                          "index", brace, "--fps", str(FPS), "--workers", "1", "--catalog", cat],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "(part 0 of 2)" in out.stdout and "(part 1 of 2)" in out.stdout
    c = read_catalog(cat)
    assert c["urls"] == paths and c["counts"].tolist() == SIZES


def test_refusals_are_not_retried_through_any_cause_chain():
    from streambatch.streaming.io.retry import http_status, is_refusal

    class Status(Exception):
        def __init__(self, **kw):
            super().__init__("x")
            self.__dict__.update(kw)

    for code in (401, 403, 404, 410):
        assert is_refusal(HTTPStatusError(code, "u")) and not is_transient(HTTPStatusError(code, "u"))
    botocore_403 = Status(response={"ResponseMetadata": {"HTTPStatusCode": 403}})
    for err in (Status(status_code=403), botocore_403):
        assert http_status(err) == 403 and not is_transient(err)
    gcs_404 = type("HttpError", (Exception,), {"__module__": "gcsfs.retry"})("missing")
    gcs_404.code = 404
    assert http_status(gcs_404) == 404 and is_refusal(gcs_404) and not is_transient(gcs_404)
    # aiohttp's payload errors carry code=400 for a response cut short: a network fault, retried
    from aiohttp.client_exceptions import ClientPayloadError
    from aiohttp.http_exceptions import ContentLengthError

    try:
        try:
            raise ContentLengthError("Not enough data to satisfy content length header")
        except ContentLengthError as inner:
            raise ClientPayloadError("Response payload is not completed") from inner
    except ClientPayloadError as cut:
        assert http_status(cut) is None and not is_refusal(cut) and is_transient(cut)
    # fsspec wraps the cause in a FileNotFoundError: a 503 inside stays transient, a 401 inside does not
    for inner, transient in ((HTTPStatusError(503, "u"), True), (HTTPStatusError(401, "u"), False)):
        try:
            try:
                raise inner
            except HTTPStatusError as exc:
                raise FileNotFoundError("u") from exc
        except FileNotFoundError as outer:
            assert is_transient(outer) is transient and is_refusal(outer) is not transient
    # `raise ... from None` hides its context: a ShortRead raised while handling a 404 is not a refusal
    try:
        try:
            raise HTTPStatusError(404, "u")
        except HTTPStatusError:
            raise ShortRead("cut") from None
    except ShortRead as exc:
        assert not is_refusal(exc) and is_transient(exc)
    assert is_transient(HTTPStatusError(500, "u")) and not is_refusal(HTTPStatusError(500, "u"))


@pytest.mark.parametrize("module, name", [
    ("huggingface_hub.errors", "RepositoryNotFoundError"), ("huggingface_hub.errors", "GatedRepoError"),
    ("huggingface_hub.errors", "RevisionNotFoundError"), ("huggingface_hub.errors", "EntryNotFoundError"),
    ("azure.core.exceptions", "ClientAuthenticationError"), ("azure.core.exceptions", "ResourceNotFoundError"),
    ("google.auth.exceptions", "RefreshError"), ("google.auth.exceptions", "DefaultCredentialsError"),
])
def test_backend_refusal_classes_are_refusals(module, name):
    import importlib

    mod = pytest.importorskip(module)
    cls = getattr(mod, name)
    try:
        exc = cls("refused")
    except TypeError:  # huggingface_hub's HTTP errors want a response
        exc = cls.__new__(cls)
        Exception.__init__(exc, "refused")
    assert importlib.import_module(module) is mod
    from streambatch.streaming.io.retry import is_refusal

    assert is_refusal(exc) and not is_transient(exc)
    try:  # HfFileSystem raises FileNotFoundError from RepositoryNotFoundError: still a refusal
        raise FileNotFoundError("hf://datasets/o/n/a.tar") from exc
    except FileNotFoundError as outer:
        assert is_refusal(outer) and not is_transient(outer)


def test_refusal_hints_name_each_backends_credentials():
    from streambatch.streaming.io.retry import refusal_hint

    assert "HF_TOKEN" in refusal_hint("hf://datasets/o/n/a.tar")
    assert "HF_TOKEN" in refusal_hint("https://huggingface.co/datasets/o/n/resolve/main/a.tar")
    assert "'token'" in refusal_hint("gs://b/a.tar") and "sas_token" in refusal_hint("az://c/a.tar")
    assert "'secret'" in refusal_hint("s3://b/a.tar") and "Authorization" in refusal_hint("https://h/a.tar")


def test_hub_token_goes_to_hub_hosts_only(monkeypatch):
    from streambatch.streaming.io.objects import hub_token_options

    monkeypatch.setenv("HF_TOKEN", "hf_SECRET")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9999")
    # plain http gets the token only when the origin is named (issue 32; test_credentials_origin.py)
    monkeypatch.setenv("STREAMBATCH_INSECURE_HTTP", "http://127.0.0.1:9999")
    bearer = {"Authorization": "Bearer hf_SECRET"}
    for url in ("https://huggingface.co/datasets/o/n/resolve/main/a.tar", "https://hf.co/x/a.tar",
                "http://127.0.0.1:9999/datasets/o/n/resolve/main/a.tar"):
        assert hub_token_options(url, None)["headers"] == bearer
    for url in ("https://example.com/a.tar", "https://huggingface.co.evil.com/a.tar", "s3://b/a.tar",
                "http://127.0.0.2:9999/a.tar"):
        assert "headers" not in hub_token_options(url, {"x": 1})
    own = {"headers": {"authorization": "Bearer mine"}}
    assert hub_token_options("https://hf.co/a.tar", own) == own  # a header of the user's own wins
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN_PATH", os.devnull)  # no saved login either
    assert "headers" not in hub_token_options("https://hf.co/a.tar", None)


def test_read_only_shards_index_into_a_local_directory(tmp_path, monkeypatch):
    from streambatch.streaming.shards.catalog_file import default_catalog_path
    from streambatch.streaming.shards.sidecar import default_index_dir, sidecar_path

    monkeypatch.setenv("STREAMBATCH_INDEX_DIR", str(tmp_path))
    a, b = "https://user:pw@h/data/a.tar", "https://h/data/b.tar?sig=1"
    home = default_index_dir(a)
    assert home == default_index_dir(b) and home.startswith(str(tmp_path))  # one directory per remote directory
    assert default_index_dir("https://h/other/a.tar") != home
    assert default_index_dir("s3://b/data/a.tar") is None and default_index_dir("/x/a.tar") is None
    assert sidecar_path(a, for_write=True) == os.path.join(home, "a.tar.idx.npz")
    assert sidecar_path(a) == "https://user:pw@h/data/a.tar.idx.npz"  # nothing indexed here yet: next to it
    os.makedirs(home)
    open(os.path.join(home, "a.tar.idx.npz"), "wb").close()
    assert sidecar_path(a) == os.path.join(home, "a.tar.idx.npz")
    assert sidecar_path("hf://datasets/o/n/a.tar", for_write=True).startswith(str(tmp_path))
    assert sidecar_path("s3://b/a.tar", for_write=True) == "s3://b/a.tar.idx.npz"
    assert default_catalog_path([a], None) == os.path.join(home, "streambatch.catalog.npz")
    assert sidecar_path(a, "/idx") == "/idx/a.tar.idx.npz"
