"""No secret in any message: the scrubber (``core/redact.py``), every raise
and log site that formats a URL (found by walking the source), and the
places that leaked before: a missing sidecar's error and its suggested
command, ``repr`` of a catalog, a decode failure, the ``on_error="skip"``
warning, ``long_samples="raise"``, the failure channel and the CLI.

Shard URLs here carry credentials the way users' do: ``pipe:`` commands with
an ``Authorization: Bearer`` header (local, no server needed) and HTTP URLs
with user-info and a signed query (to a closed port: the sidecar lookup
fails at once)."""

from __future__ import annotations

import ast
import glob
import logging
import os
import pathlib
import re
import subprocess
import sys
import traceback

import numpy as np
import pytest
from torch.distributed import TCPStore

import streambatch
from streambatch.core.redact import ScrubFilter, scrub, scrub_exception, scrub_options, scrub_url
from streambatch.streaming import CacheError, ShardError, StreamingBatches, index_shards
from streambatch.streaming.runtime.failures import FailureChannel
from streambatch.streaming.shards.catalog import Catalog
from tests.support.shards import FPS, write_corpus

TOKEN = "s3cr3tT0kenValue42"
SIGNATURE = "a1b2c3d4e5f6SIGNATUREdeadbeef"
SECRETS = (TOKEN, SIGNATURE)
HTTP_URL = f"https://alice:{TOKEN}@127.0.0.1:9/bucket/train-{{000..001}}.tar?X-Amz-Signature={SIGNATURE}&part=1"

PACKAGE = pathlib.Path(streambatch.__file__).parent


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"secret {secret!r} in: {text[:2000]}"


def full_text(exc: BaseException) -> str:
    """What a traceback shows of ``exc``, chained causes included."""
    return "".join(traceback.format_exception(exc))


# ---------------------------------------------------------------- the scrubber


@pytest.mark.parametrize("text", [
    f"https://user:{TOKEN}@host/a.tar",
    f"s3://b/a.tar?X-Amz-Credential={TOKEN}&X-Amz-Signature={SIGNATURE}",
    f"s3://b/a.tar?X-Amz-Security-Token={TOKEN}",
    f"https://storage.googleapis.com/b/a.tar?X-Goog-Signature={SIGNATURE}",
    f"https://acct.blob.core.windows.net/c/a.tar?sv=2022-11-02&sp=r&sig={SIGNATURE}",
    f"pipe:curl -s -H 'Authorization: Bearer {TOKEN}' https://host/a.tar",
    f"pipe:curl -s -H \"x-api-key: {TOKEN}\" https://host/a.tar",
    f"Authorization: Basic {TOKEN}",
    "hf_abcdefghijklmnopqrstuvwxyz0123 and AKIAABCDEFGHIJKLMNOP",
])
def test_scrub_masks_every_secret_form(text):
    out = scrub(text)
    assert_clean(out)
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in out and "AKIAABCDEFGHIJKLMNOP" not in out
    assert "***" in out
    assert_clean(scrub_url(text) if "://" in text and not text.startswith("pipe:") else out)


def test_scrub_keeps_ordinary_text():
    for text in ("max_batch_tokens=16000 is a token budget of 16,000 frames per batch",
                 "shard /data/train-000001.tar at byte 10240: 3 samples", "https://host/a.tar?part=1&shard=2",
                 "cost: quadratic (B*L^2), bearer of bad news"):
        assert scrub(text) == text


def test_scrub_options_and_exception_chain():
    opts = {"key": "AK", "secret": TOKEN, "client_kwargs": {"headers": {"Authorization": f"Bearer {TOKEN}"}},
            "endpoint_url": f"https://u:{TOKEN}@minio:9000"}
    assert_clean(repr(scrub_options(opts)))
    try:
        try:
            raise OSError(2, f"cannot open {HTTP_URL}", HTTP_URL)
        except OSError as inner:
            raise RuntimeError(f"while reading {HTTP_URL}") from inner
    except RuntimeError as exc:
        caught = exc
    assert TOKEN in full_text(caught)
    assert_clean(full_text(scrub_exception(caught)))
    assert_clean(str(ShardError(f"shard {HTTP_URL} is bad")) + str(CacheError(28, f"no room for {HTTP_URL}")))


def test_every_streambatch_logger_scrubs(caplog):
    for module in ("dataset", "pipeline.samples", "runtime.failures", "io.retry", "io.disk", "io.cache"):
        __import__(f"streambatch.streaming.{module}")
    __import__("streambatch.epoch.epoch_plan")
    __import__("streambatch.torch_glue.sampler")
    loggers = [logging.getLogger(n) for n in logging.root.manager.loggerDict if n.startswith("streambatch")]
    assert loggers
    for lg in loggers:
        if lg.handlers or lg.filters or any(m.__dict__.get("log") is lg for m in list(sys.modules.values())
                                             if getattr(m, "__name__", "").startswith("streambatch")):
            assert any(isinstance(f, ScrubFilter) for f in lg.filters), lg.name
    with caplog.at_level(logging.WARNING, logger="streambatch.streaming"):
        logging.getLogger("streambatch.streaming").warning("retrying %s: %s", HTTP_URL, f"from {HTTP_URL}")
    assert caplog.records and "***" in caplog.text
    assert_clean(caplog.text)


# ---------------------------------------------------------------- every site that formats a URL

# Names that hold URLs, paths or text built from them.
_URLISH = re.compile(r"(?i)(url|path|sidecar|catalog|target|where|directory|cache_dir|index_dir|^shard$|"
                     r"src\b|pattern)")
# ``where`` (the shard and sample a length error is about) is built scrubbed: every assignment or keyword
# argument that builds one is itself a site below, and must scrub what it formats.
_PRESCRUBBED = {"where"}
# Calls whose result is scrubbed text (RemoteShard.name is scrub_url(url)).
_SCRUBBERS = {"scrub", "scrub_url", "scrub_options", "name"}
# Functions that build a ShardError (which scrubs its own message).
_SHARD_ERROR_MAKERS = {"_bad", "_truncated", "_with_partial"}
_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}


def _is_scrubbed(node: ast.AST) -> bool:
    """Is the formatted value ``node`` scrubbed (a scrubbing call, the scrubbed
    ``.name``, a pre-scrubbed ``where``) or no URL at all (``len(...)``, a type's name)?"""
    if isinstance(node, ast.Call):
        fn = node.func
        called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        return called in _SCRUBBERS or called == "len"
    if isinstance(node, ast.Name):
        return node.id in _PRESCRUBBED
    return isinstance(node, ast.Attribute) and node.attr in ("name", "__name__")


def _unscrubbed_urls(arg: ast.AST) -> list[str]:
    """Source of URL-ish values an f-string argument formats without scrubbing."""
    if isinstance(arg, ast.Call) and _is_scrubbed(arg):
        return []  # the whole message is scrubbed
    out = []
    for node in ast.walk(arg):
        if isinstance(node, ast.FormattedValue) and not _is_scrubbed(node.value):
            text = ast.unparse(node.value)
            if any(_URLISH.search(part) for part in re.split(r"\W+", text) if part):
                out.append(text)
    return out


def _shard_error_classes() -> set[str]:
    """Names of the exception classes that scrub their own message: ShardError, CacheError and subclasses."""
    import streambatch.streaming.runtime.failures  # noqa: F401  (ForeignFailure)

    found, todo = set(), [ShardError, CacheError]
    while todo:
        c = todo.pop()
        found.add(c.__name__)
        todo += c.__subclasses__()
    return found


def _sites() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, kind, unscrubbed URL-ish values) of every raise (or
    ShardError/CacheError built to be raised later), log and print site under
    streaming/ and cli/ that formats something URL-ish."""
    sites = []
    files = sorted(glob.glob(str(PACKAGE / "streaming" / "**" / "*.py"), recursive=True)
                   + glob.glob(str(PACKAGE / "cli" / "*.py")) + [str(PACKAGE / "core" / "long_samples.py")])
    errors = _shard_error_classes()
    for path in files:
        tree = ast.parse(pathlib.Path(path).read_text())
        raised = {id(n.exc) for n in ast.walk(tree) if isinstance(n, ast.Raise)}
        for node in ast.walk(tree):
            call, kind = None, None
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                call, kind = node.exc, "raise"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in errors \
                    and id(node) not in raised:
                call, kind = node, "raise"  # an error built to be raised later (a pipeline stage passes it on)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _LOG_METHODS and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in ("log", "logger"):
                call, kind = node, "log"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                call, kind = node, "print"
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in _PRESCRUBBED
                                                      for t in node.targets):
                call, kind = ast.Call(func=ast.Name(id="where"), args=[node.value], keywords=[]), "build"
            elif isinstance(node, ast.Call) and any(k.arg in _PRESCRUBBED for k in node.keywords):
                call = ast.Call(func=ast.Name(id="where"), args=[k.value for k in node.keywords
                                                                 if k.arg in _PRESCRUBBED], keywords=[])
                kind = "build"
            if call is None:
                continue
            values = [v for a in call.args for v in _unscrubbed_urls(a)]
            if values:
                fn = call.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else "?"
                sites.append((os.path.relpath(path, PACKAGE), node.lineno, f"{kind}:{name}", values))
    return sites


SITES = _sites()


def test_the_site_walk_finds_sites():
    # the walk must see the known URL-formatting raises, or the parametrized check below proves nothing
    assert len(SITES) >= 30
    assert any(f.endswith("reader.py") and k == "raise:ShardError" for f, _, k, _ in SITES)


@pytest.mark.parametrize("site", SITES, ids=[f"{f}:{line}" for f, line, _, _ in SITES])
def test_every_site_that_formats_a_url_scrubs_it(site):
    path, line, kind, values = site
    what, name = kind.split(":", 1)
    if what == "log":
        return  # every streambatch logger carries ScrubFilter (test_every_streambatch_logger_scrubs)
    if what == "raise" and (name in _shard_error_classes() or name in _SHARD_ERROR_MAKERS):
        return  # ShardError and CacheError scrub their own message
    if what == "raise" and path.startswith("cli" + os.sep):
        return  # the command line's main() scrubs every error before it prints or re-raises it (test below)
    pytest.fail(f"{path}:{line} {kind} formats {values} without scrub()/scrub_url(); wrap them (or the whole "
                "message) so that no credential in a URL reaches the user, a log or another rank")


# ---------------------------------------------------------------- the places that leaked


@pytest.fixture(scope="module")
def secret_pipes(tmp_path_factory):
    """pipe: shards whose command carries a bearer token, indexed into index_dir."""
    d = tmp_path_factory.mktemp("secret")
    _, paths, _ = write_corpus(d / "shards", [12, 9, 11], seed=4)
    pipes = [f"pipe:echo 'Authorization: Bearer {TOKEN}' > /dev/null; cat {p}" for p in paths]
    idx = str(d / "idx")
    index_shards(pipes, frames_per_second=FPS, index_dir=idx, workers=1, progress=False, catalog=False)
    return pipes, idx, d


def test_missing_sidecar_of_a_remote_shard_names_no_secret():
    with pytest.raises(FileNotFoundError) as info:
        StreamingBatches(HTTP_URL, 400, 8, verify=False)
    text = full_text(info.value)
    assert "no usable sidecar" in text and "streambatch index" in text and "***" in text
    assert_clean(text)


def test_catalog_repr_names_no_secret():
    urls = (HTTP_URL.replace("{000..001}", "000"), HTTP_URL.replace("{000..001}", "001"))
    cat = Catalog(urls, tuple(u + ".idx.npz" for u in urls), np.array([1, 1]), ("a", "b"),
                  np.array([3, 4], np.uint16), np.array([0, 1, 2]))
    assert "shards=2" in repr(cat) and "***" in repr(cat)
    assert_clean(repr(cat))


class Broken:
    def __call__(self, sample):
        raise RuntimeError(f"cannot decode {sample['__url__']}")


def test_decode_failure_names_no_secret(secret_pipes, tmp_path):
    pipes, idx, _ = secret_pipes
    ds = StreamingBatches(pipes, 400, 8, index_dir=idx, decode=Broken(), cache_dir=str(tmp_path))
    with pytest.raises(ShardError, match="decoding sample") as info:
        next(iter(ds))
    assert "Authorization: ***" in str(info.value)
    assert_clean(full_text(info.value))


def test_skip_warning_names_no_secret(secret_pipes, tmp_path, caplog):
    pipes, idx, _ = secret_pipes
    ds = StreamingBatches(pipes, 400, 8, index_dir=idx, decode=Broken(), on_error="skip", cache_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="streambatch"):
        assert sum(len(b) for b in ds) == 0
    assert ds.num_skipped == 32 and "skipping a sample" in caplog.text
    assert_clean(caplog.text)


def test_long_samples_raise_names_no_secret(secret_pipes, tmp_path):
    pipes, idx, _ = secret_pipes
    with pytest.raises(ValueError, match="longer than max_length") as info:
        StreamingBatches(pipes, 400, 8, index_dir=idx, max_length=2, long_samples="raise", cache_dir=str(tmp_path))
    assert_clean(full_text(info.value))


def test_failure_channel_message_names_no_secret():
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    channel = FailureChannel("127.0.0.1", store.port, "scrub", 1, 2)
    try:
        raise RuntimeError(f"connection to {HTTP_URL} reset")
    except RuntimeError as exc:
        channel.report(0, exc)
    other = FailureChannel("127.0.0.1", store.port, "scrub", 0, 2)
    with pytest.raises(ShardError, match="rank 1 failed") as info:
        other.check(0)
    assert "***" in str(info.value)
    assert_clean(full_text(info.value))


@pytest.mark.slow  # a fresh interpreter (imports torch): ~2 s
def test_cli_error_names_no_secret(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-m", "streambatch.cli", "plan", HTTP_URL, "--max-batch-tokens", "400"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 2 and "error" in out.stderr
    assert_clean(out.stdout + out.stderr)
