"""Credentials stay with their origin (issue 32, items 8 and 9).

- A remote catalog lists only URLs of its own origin (scheme, host, port; for object stores, the bucket) unless
  the user widens trust (``trust_catalog={"https://mirror:8443"}``, or a whole scheme, or True): whoever can
  write a served catalog could otherwise point every rank, and the ``Authorization`` header of
  ``storage_options``, at a server of theirs.
- ``storage_options`` credentials (headers such as ``Authorization``, ``auth``, tokens) go over ``https`` only;
  a plain-``http`` origin gets them only when named in ``STREAMBATCH_INSECURE_HTTP`` (for test servers and
  trusted private networks); the files of every corpus format (Parquet, Shar, NeMo) alike. ``HF_TOKEN`` goes
  only to the Hub's own origins over https (``huggingface.co``, ``hf.co`` on port 443; ``HF_ENDPOINT`` at its
  own scheme, host and port), never over plain http unless that origin is named the same way; for ``hf://``
  URLs, whose client sends the token itself, the Hub endpoint it talks to is that origin.

The rules here without a network; the same against real nginx servers on 127.0.0.1 (one requiring a bearer
token, as a private Hub mirror does) in the slow tests at the end: each refusal is checked to send nothing.
"""

from __future__ import annotations

import logging
import os

import pytest

from streambatch.streaming import StreamingBatches, index_shards
from streambatch.streaming.io.objects import check_transport, filesystem, hub_token_options, origin
from streambatch.streaming.shards.catalog_trust import UntrustedCatalogError, check_trust, refusal
from tests.support.corpus import index_corpus
from tests.support.shards import FPS, write_corpus

INSECURE = "STREAMBATCH_INSECURE_HTTP"
BEARER = {"headers": {"Authorization": "Bearer s3cr3tT0ken"}}


@pytest.fixture(autouse=True)
def no_opt_in(monkeypatch):
    monkeypatch.delenv(INSECURE, raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


# ---------------------------------------------------------------- what a remote catalog may list


@pytest.mark.parametrize(("catalog", "entry", "refused"), [
    ("https://h/d/c.catalog.npz", "https://h/d/a.tar", None),
    ("https://h/d/c.catalog.npz", "https://h:443/e/a.tar", None),  # the default port is the same origin
    ("https://H/d/c.catalog.npz", "https://h/a.tar", None),  # host names compare without case
    ("https://h/d/c.catalog.npz", "https://evil.example/a.tar", "https://evil.example:443"),
    ("https://h/d/c.catalog.npz", "https://h:8443/a.tar", "https://h:8443"),
    ("https://h/d/c.catalog.npz", "http://h/a.tar", "http://h:80"),  # a downgrade to plain http
    ("http://127.0.0.1:8000/c.catalog.npz", "http://127.0.0.1:8001/a.tar", "http://127.0.0.1:8001"),
    ("s3://b/d/c.catalog.npz", "s3://other-bucket/a.tar", "s3://other-bucket"),
    ("s3://b/d/c.catalog.npz", "s3a://b/e/a.tar", None),  # the same bucket through s3fs's other scheme
    ("gs://b/c.catalog.npz", "gcs://b/a.tar", None),
])
def test_a_remote_catalog_lists_only_its_own_origin(catalog, entry, refused):
    why = refusal(catalog, entry, False)
    if refused is None:
        assert why is None, why
    else:
        assert why is not None and refused in why and "origin" in why, why


def test_trust_widens_by_origin_or_by_scheme():
    cat = "https://h/d/c.catalog.npz"
    assert refusal(cat, "https://mirror:8443/a.tar", check_trust({"https://mirror:8443"})) is None
    assert refusal(cat, "https://mirror:8443/a.tar", check_trust({"https://Mirror:8443/"})) is None
    assert refusal(cat, "https://mirror:9443/a.tar", check_trust({"https://mirror:8443"})) is not None
    assert refusal(cat, "https://mirror/a.tar", check_trust({"https"})) is None  # any https origin
    assert refusal(cat, "https://mirror/a.tar", True) is None
    assert refusal("s3://b/c.catalog.npz", "s3://o/a.tar", check_trust({"s3://o"})) is None
    assert refusal("/data/c.catalog.npz", "https://anywhere/a.tar", False) is None  # a catalog you wrote


def test_an_untrusted_origin_names_the_widening_that_allows_it(tmp_path):
    from streambatch.streaming.shards.catalog_trust import resolve_entries

    with pytest.raises(UntrustedCatalogError, match=r"trust_catalog=\{'https://evil.example:443'\}"):
        resolve_entries("https://h/c.catalog.npz", ["https://evil.example/a.tar"], version=2, trust=False,
                        what="shard")


# ---------------------------------------------------------------- credentials over plain http


def test_origin_fills_default_ports():
    assert origin("https://H.example/a.tar?x=1") == "https://h.example:443"
    assert origin("http://127.0.0.1:8080/a") == "http://127.0.0.1:8080"
    assert origin("http://u:p@h/a") == "http://h:80"
    assert origin("s3://bucket/key") == "s3://bucket"


@pytest.mark.parametrize("options", [
    BEARER, {"client_kwargs": {"headers": {"X-JFrog-Art-Api": "k"}}}, {"headers": {"Cookie": "session=1"}},
    {"client_kwargs": {"auth": ("alice", "pw")}}, {"token": "abc"}, {"password": "pw"},
])
def test_credentials_are_refused_over_plain_http(options, monkeypatch):
    with pytest.raises(ValueError, match=rf"plain http.*http://127.0.0.1:9.*{INSECURE}=http://127.0.0.1:9"):
        check_transport("http://127.0.0.1:9/a.tar", options)
    check_transport("https://127.0.0.1:9/a.tar", options)  # https: fine
    monkeypatch.setenv(INSECURE, "http://127.0.0.1:9, http://other:80")
    check_transport("http://127.0.0.1:9/a.tar", options)  # named: allowed
    with pytest.raises(ValueError, match="plain http"):
        check_transport("http://127.0.0.1:10/a.tar", options)  # another port is another origin


def test_options_without_credentials_go_anywhere():
    for options in (None, {}, {"block_size": 0}, {"headers": {"User-Agent": "x", "Accept": "*/*"}},
                    {"client_kwargs": {"trust_env": True}}, {"token": None}):
        check_transport("http://127.0.0.1:9/a.tar", options)


def test_filesystem_applies_the_rule_before_any_request():
    with pytest.raises(ValueError, match="plain http"):
        filesystem("http://127.0.0.1:9/a.tar", BEARER)


# ---------------------------------------------------------------- HF_TOKEN


def test_hub_token_goes_over_https_to_the_hub_only(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRETSECRETSECRET")
    bearer = {"Authorization": "Bearer hf_SECRETSECRETSECRETSECRET"}
    for url in ("https://huggingface.co/datasets/o/n/resolve/main/a.tar", "https://hf.co/x/a.tar",
                "https://cdn-lfs.huggingface.co/x/a.tar", "https://huggingface.co:443/x/a.tar"):
        assert hub_token_options(url, None)["headers"] == bearer, url
    for url in ("http://huggingface.co/x/a.tar", "https://huggingface.co:8443/x/a.tar",
                "https://huggingface.co.evil.com/a.tar", "https://example.com/a.tar"):
        assert "headers" not in hub_token_options(url, None), url


def test_hub_token_goes_to_hf_endpoint_at_its_own_origin_only(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRETSECRETSECRET")
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.internal:8443")
    assert "headers" in hub_token_options("https://hub.internal:8443/d/a.tar", None)
    for url in ("https://hub.internal/d/a.tar", "https://hub.internal:9443/d/a.tar", "http://hub.internal:8443/a"):
        assert "headers" not in hub_token_options(url, None), url


def test_hub_token_over_plain_http_only_when_named(monkeypatch, caplog):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRETSECRETSECRET")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9999")
    url = "http://127.0.0.1:9999/datasets/o/n/resolve/main/a.tar"
    with caplog.at_level(logging.WARNING, logger="streambatch"):
        assert "headers" not in hub_token_options(url, None)
    assert "HF_TOKEN" in caplog.text and INSECURE in caplog.text and "SECRET" not in caplog.text
    monkeypatch.setenv(INSECURE, "http://127.0.0.1:9999")
    assert hub_token_options(url, None)["headers"]["Authorization"].endswith("SECRET")


# ---------------------------------------------------------------- hf:// and the other corpus formats


def test_hf_urls_send_no_token_to_a_plain_http_hub_endpoint(monkeypatch, caplog):
    # hf:// requests go to the Hub endpoint huggingface_hub talks to, which sends HF_TOKEN itself: to a
    # plain-http endpoint (storage_options' endpoint, or HF_ENDPOINT) only when that origin is named
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRETSECRETSECRET")
    url, mirror = "hf://datasets/o/n/train-00000.parquet", {"endpoint": "http://127.0.0.1:9998"}
    with caplog.at_level(logging.WARNING, logger="streambatch"):
        assert hub_token_options(url, mirror) == {**mirror, "token": False}
    assert "HF_TOKEN" in caplog.text and f"{INSECURE}=http://127.0.0.1:9998" in caplog.text
    assert "SECRET" not in caplog.text
    assert hub_token_options(url, {"endpoint": "https://hub.internal"}) == {"endpoint": "https://hub.internal"}
    monkeypatch.setenv(INSECURE, "http://127.0.0.1:9998")
    assert hub_token_options(url, mirror) == mirror  # named: huggingface_hub sends its token
    monkeypatch.delenv(INSECURE)
    with pytest.raises(ValueError, match=rf"plain http.*http://127.0.0.1:9998.*{INSECURE}=http://127.0.0.1:9998"):
        check_transport(url, {**mirror, "token": "hf_given"})  # a token given for a plain-http endpoint
    check_transport(url, {"endpoint": "https://hub.internal", "token": "hf_given"})


def test_the_hf_filesystem_gets_no_token_for_a_plain_http_endpoint(monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_TOKEN", "hf_SECRETSECRETSECRETSECRET")
    fs, _ = filesystem("hf://datasets/o/n/train-00000.parquet", {"endpoint": "http://127.0.0.1:9997"})
    assert fs.token is False and fs.endpoint == "http://127.0.0.1:9997"  # no request made: construction only
    fs, _ = filesystem("hf://datasets/o/n/train-00000.parquet", {"endpoint": "https://hub.internal"})
    assert fs.token is None  # huggingface_hub's own default: HF_TOKEN, over https


def test_parquet_over_plain_http_refuses_a_bearer_header_before_any_request():
    # Parquet files (and Shar, NeMo) are read through the same remote layer as tar shards
    with pytest.raises(ValueError, match=rf"plain http.*{INSECURE}=http://127.0.0.1:9"):
        StreamingBatches("http://127.0.0.1:9/d/train-00000-of-00001.parquet", 800, 8, format="parquet",
                         storage_options=BEARER, retry=0, rank=0, world_size=1)


# ---------------------------------------------------------------- against real servers (slow tier)

SIZES = [8, 6]
TOKEN = "s3cr3tT0kenValue42"


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    from tests.support.servers import nginx_server

    root = tmp_path_factory.mktemp("www")
    _, paths, expected = write_corpus(root, SIZES, seed=8)
    index_corpus(paths, catalog=False)
    with nginx_server(root) as a, nginx_server(root, bearer=TOKEN) as b:
        yield root, a, b, paths, expected


@pytest.mark.slow
def test_a_served_catalog_cannot_send_ranks_to_another_server(two_servers, tmp_path):
    root, a, b, paths, expected = two_servers
    names = [os.path.basename(p) for p in paths]
    os.environ[INSECURE] = f"{a.url},{b.url}"  # the bearer header may go over plain http to these two
    try:
        index_shards([f"{b.url}/{n}" for n in names], frames_per_second=FPS, index_dir=str(root / "idx-b"),
                     workers=1, progress=False, catalog=str(root / "elsewhere.catalog.npz"),
                     storage_options={"headers": {"Authorization": f"Bearer {TOKEN}"}})
        b.clear_log()
        with pytest.raises(UntrustedCatalogError, match=rf"{b.url}.*origin.*trust_catalog="):
            StreamingBatches(f"{a.url}/elsewhere.catalog.npz", 400, 8, cache_dir=str(tmp_path / "c"),
                             storage_options={"headers": {"Authorization": f"Bearer {TOKEN}"}})
        assert b.log(expect=0, timeout=1) == []  # nothing reached the other server: no token either
        ds = StreamingBatches(f"{a.url}/elsewhere.catalog.npz", 400, 8, cache_dir=str(tmp_path / "c"),
                              storage_options={"headers": {"Authorization": f"Bearer {TOKEN}"}},
                              trust_catalog={b.url, "file"})  # (its sidecars are local: http takes no uploads)
        assert sorted(k for batch in ds for k in (s["__key__"] for s in batch)) == sorted(expected)
    finally:
        os.environ.pop(INSECURE, None)


@pytest.mark.slow
def test_a_bearer_header_goes_over_plain_http_only_when_named(two_servers, tmp_path, monkeypatch):
    root, _, b, paths, expected = two_servers
    urls = [f"{b.url}/{os.path.basename(p)}" for p in paths]
    opts = {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    b.clear_log()
    with pytest.raises(ValueError, match=rf"plain http.*{INSECURE}={b.url}"):
        index_shards(urls, frames_per_second=FPS, index_dir=str(tmp_path / "idx"), workers=1, progress=False,
                     storage_options=opts)
    assert b.log(expect=0, timeout=1) == []
    monkeypatch.setenv(INSECURE, b.url)
    index_shards(urls, frames_per_second=FPS, index_dir=str(tmp_path / "idx"), workers=1, progress=False,
                 storage_options=opts)
    ds = StreamingBatches(urls, 400, 8, index_dir=str(tmp_path / "idx"), cache_dir=str(tmp_path / "c"),
                          storage_options=opts)
    assert sorted(k for batch in ds for k in (s["__key__"] for s in batch)) == sorted(expected)


@pytest.mark.slow
def test_hf_token_reaches_an_http_hub_mirror_only_when_named(two_servers, tmp_path, monkeypatch):
    root, _, b, paths, expected = two_servers
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", b.url)  # a private Hub mirror on plain http that wants the token
    urls = [f"{b.url}/{os.path.basename(p)}" for p in paths]
    b.clear_log()
    with pytest.raises(Exception, match=r"401|refused") as info:
        index_shards(urls, frames_per_second=FPS, index_dir=str(tmp_path / "idx"), workers=1, progress=False,
                     retry=0)
    assert TOKEN not in str(info.value)
    seen = b.log()
    assert seen and all(e.status == 401 for e in seen)  # asked without the token: refused, nothing leaked
    monkeypatch.setenv(INSECURE, b.url)
    index_shards(urls, frames_per_second=FPS, index_dir=str(tmp_path / "idx"), workers=1, progress=False)
    ds = StreamingBatches(urls, 400, 8, index_dir=str(tmp_path / "idx"), cache_dir=str(tmp_path / "c"))
    assert sum(len(batch) for batch in ds) == sum(SIZES)
