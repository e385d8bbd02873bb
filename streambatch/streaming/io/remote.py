"""Remote shards through fsspec: opening, whole-shard streaming reads with
retries, ranged reads, and object identity (size, ETag).

Any URL fsspec knows (``s3://``, ``gs://``, ``https://``, ``hf://``, ...) is
opened with ``fsspec.core.url_to_fs(url, **storage_options)``; ``pipe:``
commands keep going through webdataset's ``gopen``. A whole shard is read in
one GET where the backend can stream (HTTP(S) through aiohttp, S3 through
s3fs/aiobotocore, the Hub's streaming file), else in ``chunk_bytes`` ranged
GETs. A transient failure (5xx, 408/429, connection reset, timeout, short
read) is retried with exponential backoff, resuming from the byte reached;
after ``RetryPolicy.retries`` failures without progress it becomes a
``ShardError`` naming the URL and the byte offset. URLs and options are
scrubbed of credentials before they reach a message or a log line.

Every network call waits at most ``RetryPolicy.timeout`` for an answer
(``call``): on an async fsspec backend (HTTP, S3, GCS) the coroutine is
cancelled on fsspec's event loop when the time is up; a sync backend's call
runs in a thread that is abandoned then. A timeout is a transient fault:
retried, then a ``ShardError`` that names the timeout and how to raise it.
"""

from __future__ import annotations

import errno
import numbers
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...core.redact import logger, scrub, scrub_options, scrub_url  # noqa: F401  (re-exported: their old home)
from ..errors import CacheError, ShardError

log = logger("streambatch.streaming")

# protocol -> (package fsspec needs, streambatch extra that installs it)
_BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
             "hf": ("huggingface_hub", "hf"), "http": ("aiohttp", "http"), "https": ("aiohttp", "http"),
             "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure")}
# Hosts that get the Hugging Face token (HF_TOKEN) on https:// URLs; HF_ENDPOINT's host is added at call time.
HUB_HOSTS = ("huggingface.co", "hf.co")
READ_CHUNK = 1 << 20  # bytes per read() from a stream; the memory a download holds
CHUNK_BYTES = 64 << 20  # bytes per ranged GET where the backend cannot stream


# ---------------------------------------------------------------- URLs and secrets


def protocol(url: str) -> str:
    """Lower-case URL scheme ('' for plain paths)."""
    scheme = urlsplit(url).scheme.lower()
    return "" if len(scheme) <= 1 else scheme  # 'C:' is a drive, not a scheme


def is_remote(url: str) -> bool:
    """True for URLs read through fsspec (anything but paths, file: and pipe:)."""
    return protocol(url) not in ("", "file", "pipe") and url != "-"


def filesystem(url: str, storage_options: dict | None = None):
    """(fsspec filesystem, path) for ``url``, or ImportError naming the extra to install."""
    proto = protocol(url)
    package, extra = _BACKENDS.get(proto, (None, None))
    hint = f"pip install 'streambatch[{extra}]'" if extra else f"install the fsspec backend for {proto}://"
    try:
        import fsspec.core
    except ImportError:
        raise ImportError(f"reading {proto}:// shards needs fsspec; {hint}") from None
    try:
        return fsspec.core.url_to_fs(url, **hub_token_options(url, storage_options))
    except ImportError as exc:
        need = package or "its fsspec backend"
        raise ImportError(f"reading {proto}:// shards ({scrub(url)}) needs {need}: {hint} ({exc})") from None
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            raise ValueError(f"no fsspec backend reads {proto}:// URLs ({scrub(url)}); use a path, "
                             "s3://, gs://, http(s)://, hf:// or pipe:") from None
        raise


def hub_host(url: str) -> bool:
    """True for an http(s) URL on the Hugging Face Hub (or on ``HF_ENDPOINT``'s host)."""
    if protocol(url) not in ("http", "https"):
        return False
    host = (urlsplit(url).hostname or "").lower()
    hosts = set(HUB_HOSTS)
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        hosts.add((urlsplit(endpoint).hostname or "").lower())
    return any(host == h or host.endswith("." + h) for h in hosts if h)


def hub_token_options(url: str, storage_options: dict | None) -> dict:
    """``storage_options`` plus ``Authorization: Bearer <HF_TOKEN>`` for an
    https:// URL on the Hub that has no Authorization header of its own: the
    same token ``hf://`` URLs use (``HF_TOKEN``, else ``huggingface-cli
    login``'s). Sent only to Hub hosts, never to another server."""
    options = dict(storage_options or {})
    if not hub_host(url):
        return options
    headers = dict(options.get("headers") or {})
    if any(k.lower() == "authorization" for k in headers):
        return options
    token = os.environ.get("HF_TOKEN") or _saved_hub_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
        options["headers"] = headers
    return options


def _saved_hub_token() -> str | None:
    try:
        from huggingface_hub import get_token
    except ImportError:
        return None
    try:
        return get_token()
    except Exception:  # an unreadable token file is the same as none: the server then says 401
        return None


# ---------------------------------------------------------------- bounded calls


class NetworkTimeout(TimeoutError):
    """No answer within ``RetryPolicy.timeout`` (transient: retried)."""


def deadline(timeout: float, nbytes: int = 0) -> float:
    """Seconds a call moving ``nbytes`` may take: ``timeout`` per MiB started
    (a metadata request or a small read: ``timeout``), so a large ranged GET
    on a slow link is not cut off while bytes still flow."""
    return timeout * max(1, -(-int(nbytes) // READ_CHUNK))


def call(fs, method: str, *args, timeout: float, **kwargs):
    """``fs.<method>(*args, **kwargs)`` answered within ``timeout`` seconds,
    else ``NetworkTimeout``. Async backends run the coroutine on fsspec's loop
    under ``asyncio.wait_for`` (cancelled when the time is up, so the socket
    is closed, whatever the backend's own timeouts: aiohttp's 300 s, botocore's
    read timeout); sync backends run it in a daemon thread, left behind if it
    never returns."""
    coro = getattr(fs, "_" + method, None) if getattr(fs, "async_impl", False) else None
    if coro is not None and getattr(fs, "loop", None) is not None:
        from fsspec.asyn import sync
        from fsspec.exceptions import FSTimeoutError

        try:
            return sync(fs.loop, coro, *args, timeout=timeout, **kwargs)
        except FSTimeoutError:
            raise NetworkTimeout(f"no answer within {timeout:g} s") from None
    return _in_thread(getattr(fs, method), args, kwargs, timeout)


def _in_thread(fn, args, kwargs, timeout: float):
    box: dict[str, Any] = {}
    done = threading.Event()

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="streambatch-io", daemon=True).start()
    if not done.wait(timeout):
        raise NetworkTimeout(f"no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def as_policy(retry: Any) -> RetryPolicy:
    """A ``RetryPolicy`` from None (the default), an int (retries) or a policy."""
    if retry is None:
        return RetryPolicy()
    if isinstance(retry, RetryPolicy):
        return retry
    if isinstance(retry, bool) or not isinstance(retry, numbers.Integral) or retry < 0:
        raise ValueError(f"retry must be a RetryPolicy or an integer >= 0 (the number of retries), got {retry!r}")
    return RetryPolicy(retries=int(retry))


def normalize_etag(etag: Any) -> str | None:
    """ETags compare without quotes and weak-validator prefixes; None if absent."""
    if etag is None:
        return None
    s = str(etag).strip()
    if s.startswith("W/"):
        s = s[2:]
    return s.strip('"') or None


def object_identity(info: dict) -> tuple[int | None, str | None]:
    """(size, etag) from an fsspec ``info()`` dict: the ETag (S3, HTTP, GCS)
    or, on the Hub, the blob's id / LFS sha256."""
    size = info.get("size")
    tag = info.get("ETag") or info.get("etag") or info.get("blob_id")
    if tag is None and isinstance(info.get("lfs"), dict):
        tag = info["lfs"].get("sha256")
    if tag is None:
        tag = info.get("generation") or info.get("md5Hash")
    return (int(size) if size is not None else None), normalize_etag(tag)


def object_info(fs, path: str, timeout: float) -> tuple[int | None, str | None]:
    """(size, identity tag) of one object in one metadata request. gcsfs's
    ``info()`` also lists the parent "directory" (a second request, racing the
    first); asking for the object itself is what an object needs."""
    if hasattr(fs, "_get_object") and getattr(fs, "async_impl", False):
        return object_identity(call(fs, "get_object", path, timeout=timeout))
    return object_identity(call(fs, "info", path, timeout=timeout))


# ---------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """retries: failed attempts in a row (without a byte of progress) before
    giving up; backoff: first delay in seconds, doubled per retry up to
    max_backoff (with jitter); timeout: seconds a read may wait for bytes."""

    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 20.0
    timeout: float = 60.0

    def __post_init__(self):
        for name, low in (("retries", 0), ("backoff", 0), ("max_backoff", 0), ("timeout", 1e-3)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= low:
                raise ValueError(f"RetryPolicy.{name} must be a number >= {low}, got {v!r}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        return min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * rng.uniform(0.5, 1.0)


class HTTPStatusError(OSError):
    """An HTTP response with an error status."""

    def __init__(self, status: int, url: str):
        super().__init__(f"HTTP {status} from {scrub(url)}")
        self.status = status


class ShortRead(OSError):
    """The stream ended before the shard's known size."""


class RangeIgnored(Exception):
    """The server answered a ranged GET with the whole object (status 200):
    it ignores Range requests (not retried: it will again)."""


class StaleShard(Exception):
    """The object's size or ETag differs from what was indexed (not retried)."""


class Truncated(Exception):
    """A ``pipe:`` command exited cleanly before the bytes expected (not retried:
    running it again gives the same bytes)."""


_TRANSIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "http", "ssl",
                      "huggingface_hub", "google", "gcsfs", "s3fs", "fsspec")


# A full or read-only local disk: no network read raises these, and retrying cannot help (the cache
# turns them into CacheError, see cache.py).
_DISK_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EROFS") if hasattr(errno, n))


# Refusals: asking again gives the same answer (a missing, private or gated object, a bad credential).
_REFUSAL_STATUSES = frozenset((401, 403, 404, 410))
_REFUSAL_CLASSES = frozenset((
    # huggingface_hub
    "RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "EntryNotFoundError",
    "RemoteEntryNotFoundError", "DisabledRepoError",
    # azure-core / azure-storage-blob (adlfs)
    "ClientAuthenticationError", "ResourceNotFoundError",
    # google-auth / google-api-core (gcsfs)
    "RefreshError", "DefaultCredentialsError", "Forbidden", "Unauthorized", "NotFound",
))


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        if e.__cause__ is not None:
            e = e.__cause__
        else:  # an error raised while handling another, unless `raise ... from None` hid it
            e = None if e.__suppress_context__ else e.__context__


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an error carries, looked for on ``exc`` and its causes:
    aiohttp/our ``status``, requests/httpx/huggingface_hub ``response.status_code``,
    azure ``status_code``, gcsfs ``HttpError.code``, botocore's response dict."""
    for e in _chain(exc):
        # ``code`` only on gcsfs/google errors: aiohttp's parser errors carry code=400 for a response cut short
        google = type(e).__module__.split(".")[0] in ("gcsfs", "google")
        for attr in ("status", "status_code", "code") if google else ("status", "status_code"):
            v = getattr(e, attr, None)
            if isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599:
                return v
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            v = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(v, int):
                return v
        elif response is not None:
            v = getattr(response, "status_code", None) or getattr(response, "status", None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None


def is_refusal(exc: BaseException) -> bool:
    """The store refused (401/403/404/410, or a backend's not-found / auth /
    gated-repo exception anywhere in the cause chain): never retried."""
    for e in _chain(exc):
        if any(c.__name__ in _REFUSAL_CLASSES for c in type(e).__mro__):
            return True
    return http_status(exc) in _REFUSAL_STATUSES


def refusal_hint(url: str) -> str:
    """What to check when the store of ``url`` refuses: per backend."""
    proto = protocol(url)
    if proto == "hf" or hub_host(url):
        return ("check the repo id and path, that the revision exists, and for a private or gated repo that you "
                "accepted its terms and gave a token: set HF_TOKEN (or run `huggingface-cli login`), or pass "
                "storage_options={'token': ...}")
    if proto in ("gs", "gcs"):
        return ("check the bucket and object name, and the credentials: storage_options={'token': ...} "
                "(a service-account JSON path, 'google_default', or 'anon' for a public bucket)")
    if proto in ("az", "abfs", "abfss"):
        return ("check the container and blob name, and the credentials: storage_options={'account_name': ..., "
                "'sas_token': ...} or {'connection_string': ...} (or 'anon': True for a public container)")
    if proto in ("s3", "s3a"):
        return ("check the bucket and key, and the credentials: storage_options={'key': ..., 'secret': ...}, "
                "{'profile': ...} or AWS_* environment variables ({'anon': True} for a public bucket)")
    return "check the URL, and for a server that needs a login pass storage_options={'headers': {'Authorization': ...}}"


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: 5xx/408/429, connection resets, timeouts, short reads;
    never a refusal (``is_refusal``) nor the machine's own disk (``CacheError``,
    ENOSPC, EDQUOT, EROFS)."""
    if isinstance(exc, CacheError) or (isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS):
        return False
    if is_refusal(exc):
        return False
    if isinstance(exc, FileNotFoundError) and exc.__cause__ is not None:
        return is_transient(exc.__cause__)  # fsspec's HTTP info() turns any failure (a 503 too) into this
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                        ImportError, StaleShard, Truncated)):
        return False
    status = http_status(exc)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if isinstance(exc, (OSError, TimeoutError, EOFError)):
        return True
    return type(exc).__module__.split(".")[0] in _TRANSIENT_MODULES


def _describe(exc: BaseException) -> str:
    """'Type: message', with the cause a backend wrapped (fsspec hides a 503 in a FileNotFoundError)."""
    text = f"{type(exc).__name__}: {scrub(exc)}"
    if exc.__cause__ is not None:
        text += f" (from {type(exc.__cause__).__name__}: {scrub(exc.__cause__)})"
    return text


class IOStats:
    """Thread-safe counters of one process's remote I/O."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = self.bytes = self.retries = 0

    def add(self, requests: int = 0, nbytes: int = 0, retries: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.retries += retries

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries}


# ---------------------------------------------------------------- one shard


class RemoteShard:
    """A shard addressed by URL: identity, ranged reads and whole-shard
    downloads, with retries. ``size`` / ``etag`` are what the index recorded
    (None: unknown); a download whose object differs raises ShardError.
    ``kind`` names the object in messages ("shard", "catalog", "sidecar")."""

    def __init__(self, url: str, storage_options: dict | None = None, *, size: int | None = None,
                 etag: str | None = None, retry: RetryPolicy | None = None, stats: IOStats | None = None,
                 chunk_bytes: int = CHUNK_BYTES, kind: str = "shard"):
        self.url, self.size, self.etag, self.kind = url, size, normalize_etag(etag), kind
        self.retry = retry or RetryPolicy()
        self.stats = stats or IOStats()
        self.chunk_bytes = chunk_bytes
        self._options = storage_options
        self._fs = None
        self._rng = random.Random()  # backoff jitter only; never feeds a plan

    @property
    def name(self) -> str:
        return scrub_url(self.url)

    def _filesystem(self):
        if self._fs is None:
            self._fs = filesystem(self.url, self._options)
        return self._fs

    def _with_retries(self, what: str, fn, where=lambda: 0, passthrough: tuple[type, ...] = (RangeIgnored,)):
        """Call fn() until it succeeds, retrying transient errors; the count
        of failures starts again whenever ``where()`` (the byte reached) moved.
        A non-transient error of a ``passthrough`` type is raised as it is."""
        fails, last = 0, where()
        while True:
            try:
                return fn()
            except StaleShard as exc:
                raise ShardError(f"shard {self.name} changed since it was indexed: {exc}; re-index it with "
                                 f"`streambatch index --force`") from None
            except ShardError:
                raise
            except Exception as exc:
                at = where()
                if at > last:
                    fails, last = 0, at
                why = _describe(exc)
                if not is_transient(exc):
                    if isinstance(exc, passthrough):
                        raise
                    refused = is_refusal(exc) or isinstance(exc, (FileNotFoundError, PermissionError))
                    hint = f"; {refusal_hint(self.url)}" if refused else ""
                    raise ShardError(f"cannot {what} {self.kind} {self.name} at byte {at}: {why}{hint}") from None
                fails += 1
                if fails > self.retry.retries:
                    hint = ""
                    if isinstance(exc, TimeoutError):
                        hint = (f"; the server sent nothing for RetryPolicy.timeout = {self.retry.timeout:g} s: "
                                "to wait longer pass retry=RetryPolicy(timeout=SECONDS) (on the command line: "
                                "`streambatch index --timeout SECONDS`)")
                    raise ShardError(f"cannot {what} {self.kind} {self.name} at byte {at}: gave up after {fails} "
                                     f"attempts ({why}){hint}") from None
                delay = self.retry.delay(fails, self._rng)
                log.warning("retrying %s %s at byte %d in %.2f s (attempt %d of %d): %s", self.kind, self.name, at,
                            delay, fails, self.retry.retries, why)
                self.stats.add(retries=1)
                time.sleep(delay)

    def request(self, what: str, method: str, *args, nbytes: int = 0, **kwargs):
        """``fs.<method>(path, *args, **kwargs)`` with retries, each attempt
        bounded by the policy's timeout (``deadline``)."""
        fs, path = self._filesystem()

        def attempt():
            self.stats.add(requests=1)
            return call(fs, method, path, *args, timeout=deadline(self.retry.timeout, nbytes), **kwargs)

        return self._with_retries(what, attempt, passthrough=(FileNotFoundError,))

    def info(self) -> tuple[int | None, str | None]:
        """(size, etag) from one metadata request."""
        fs, path = self._filesystem()

        def stat():
            self.stats.add(requests=1)
            return object_info(fs, path, self.retry.timeout)

        return self._with_retries("stat", stat)

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes [start, end) in one ranged GET (fewer at the end of the
        object); ``RangeIgnored`` if the server answers with the whole object
        instead (an HTTP server that ignores Range: nothing more is read)."""
        fs, path = self._filesystem()
        http = type(fs).__module__.startswith("fsspec.implementations.http")

        def get():
            if http:  # the status line tells whether the Range was honoured, before any body arrives
                stream = self.open_at(start, end)
                try:
                    if stream.ignored_range and (start > 0 or stream.total is None or stream.total > end):
                        raise RangeIgnored(f"asked for bytes {start}-{end - 1}, the server sent the whole object")
                    parts, need = [], end - start
                    while need > 0:
                        chunk = stream.read(min(need, READ_CHUNK))
                        if not chunk:
                            break
                        parts.append(chunk)
                        need -= len(chunk)
                finally:
                    stream.close()
                data = b"".join(parts)
            else:
                self.stats.add(requests=1)
                data = call(fs, "cat_file", path, start=start, end=end,
                            timeout=deadline(self.retry.timeout, end - start))
                if len(data) > end - start:
                    raise RangeIgnored(f"asked for {end - start} bytes at byte {start}, got {len(data)}")
            self.stats.add(nbytes=len(data))
            return data

        return self._with_retries("read", get, lambda: start)

    def open_at(self, offset: int, end: int | None = None):
        """One GET of bytes [offset, end) of the object (end None: to its
        end); the stream may run past ``end`` (no retries here)."""
        from .streams import _AsyncStream, _ChunkedStream, _http_get, _PipeStream, _s3_get

        if protocol(self.url) == "pipe":
            self.stats.add(requests=1)
            return _PipeStream(self.url, offset)
        fs, path = self._filesystem()
        kind = type(fs).__module__
        self.stats.add(requests=1)
        if kind.startswith("fsspec.implementations.http"):
            return _AsyncStream(fs, _http_get, fs, path, offset, end, self.retry.timeout, timeout=self.retry.timeout,
                                bound=False)
        if kind.startswith("s3fs"):  # botocore's read timeout would not follow the policy: wait_for does
            return _AsyncStream(fs, _s3_get, fs, path, offset, end, timeout=self.retry.timeout)
        self.stats.add(requests=-1)  # counted per chunk below
        return _ChunkedStream(fs, path, offset, end, self.size, self.chunk_bytes, self.stats, self.retry.timeout)

    def download(self, out, start: int = 0, end: int | None = None) -> int:
        """Write bytes [start, end) of the object (end None: to its end) to
        the binary file ``out`` in one GET, resuming after transient faults
        from the byte reached; returns the number of bytes written."""
        state = {"pos": start, "stop": end if end is not None else self.size, "total": self.size}

        def attempt():
            stream = self.open_at(state["pos"], end)
            try:
                self._check_identity(stream)
                if stream.total is not None:
                    state["total"] = stream.total
                    if state["stop"] is None:
                        state["stop"] = stream.total
                while state["stop"] is None or state["pos"] < state["stop"]:
                    want = READ_CHUNK if state["stop"] is None else min(READ_CHUNK, state["stop"] - state["pos"])
                    chunk = stream.read(want)
                    if not chunk:
                        break
                    out.write(chunk)
                    state["pos"] += len(chunk)
                    self.stats.add(nbytes=len(chunk))
                if end is None and state["total"] is not None and stream.read(1):
                    raise StaleShard(f"it has more than the {state['total']} bytes recorded")
            finally:
                stream.close()
            if state["stop"] is not None and state["pos"] < state["stop"]:
                if protocol(self.url) == "pipe":
                    if stream.close_error is not None:
                        raise stream.close_error
                    raise Truncated(f"the command's output ended at byte {state['pos']} of {state['stop']}")
                raise ShortRead(f"the response ended at byte {state['pos']} of {state['stop']}")
            return state["pos"] - start

        return self._with_retries("read", attempt, lambda: state["pos"])

    def _check_identity(self, stream) -> None:
        if self.size is not None and stream.total is not None and stream.total != self.size:
            raise StaleShard(f"it has {stream.total} bytes, the index recorded {self.size}")
        if self.etag is not None and stream.etag is not None and stream.etag != self.etag:
            raise StaleShard(f"its ETag is {stream.etag}, the index recorded {self.etag}")
