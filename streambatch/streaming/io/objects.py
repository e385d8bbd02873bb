"""Remote objects through fsspec: which URLs are remote, the filesystem of a
URL (with the Hugging Face token for Hub hosts), network calls bounded by a
timeout, and an object's identity (size, ETag).

Any URL fsspec knows (``s3://``, ``gs://``, ``https://``, ``hf://``, ...) is
opened with ``fsspec.core.url_to_fs(url, **storage_options)``; ``pipe:``
commands go through webdataset's ``gopen`` (``streams.py``). URLs and
options are scrubbed of credentials before they reach a message.

Every network call waits at most ``RetryPolicy.timeout`` for an answer
(``call``): on an async fsspec backend (HTTP, S3, GCS) the coroutine is
cancelled on fsspec's event loop when the time is up; a sync backend's call
runs in a thread that is abandoned then. A timeout (``NetworkTimeout``) is a
transient fault: ``retry.py`` retries it.

Stream: nothing: answers about remote objects (scheme, filesystem, size and ETag) and bounded calls."""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlsplit

from ...core.redact import SECRET_KEY, logger, scrub, secret_header

log = logger("streambatch.streaming")

# protocol -> (package fsspec needs, streambatch extra that installs it)
_BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
             "hf": ("huggingface_hub", "hf"), "http": ("aiohttp", "http"), "https": ("aiohttp", "http"),
             "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure")}
# Hosts that get the Hugging Face token (HF_TOKEN) on https:// URLs (port 443, subdomains too); HF_ENDPOINT's
# origin is added at call time.
HUB_HOSTS = ("huggingface.co", "hf.co")
# Plain-http origins the user allows to receive credentials (test servers, a trusted private network):
# comma-separated, e.g. "http://127.0.0.1:8080,http://minio.lan:9000".
INSECURE_ENV = "STREAMBATCH_INSECURE_HTTP"
_DEFAULT_PORTS = {"http": 80, "https": 443}
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


def origin(url: str) -> str:
    """Where requests for ``url`` go: ``scheme://host:port`` for http(s) (default port filled in, host in lower
    case, user-info left out), ``scheme://bucket`` for object stores; '' for paths and pipe: commands."""
    proto = protocol(url)
    if not proto or proto in ("file", "pipe"):
        return ""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or _DEFAULT_PORTS.get(proto)
    except ValueError:  # an invalid port or IPv6 literal: compare what was written
        return f"{proto}://{urlsplit(url).netloc.rpartition('@')[2].lower()}"
    if ":" in host:
        host = f"[{host}]"
    return f"{proto}://{host}:{port}" if port else f"{proto}://{host}"


def insecure_allowed(url: str) -> bool:
    """Is ``url``'s plain-http origin one the user named in STREAMBATCH_INSECURE_HTTP?"""
    named = {origin(o.strip()) for o in os.environ.get(INSECURE_ENV, "").split(",") if o.strip()}
    return origin(url) in named


def carries_credentials(options: Any) -> bool:
    """Do ``storage_options`` hold a credential: a secret-looking key with a value (token, key, secret,
    password, auth, ...) or a credential header (Authorization, Cookie, X-Api-Key, X-JFrog-Art-Api, ...),
    at any depth (``client_kwargs={"headers": ...}``)?"""
    if isinstance(options, dict):
        for k, v in options.items():
            if v is None or v is False or v == "":
                continue
            if isinstance(k, str) and (SECRET_KEY.search(k) or secret_header(k)):
                return True
            if carries_credentials(v):
                return True
    elif isinstance(options, (list, tuple)):
        return any(carries_credentials(v) for v in options)
    return False


def hub_endpoint(storage_options: dict | None) -> str:
    """Where the requests of an ``hf://`` URL go: ``storage_options["endpoint"]``, else huggingface_hub's
    endpoint (``HF_ENDPOINT`` as it read it; by default https://huggingface.co)."""
    given = (storage_options or {}).get("endpoint")
    if isinstance(given, str) and given:
        return given
    try:
        from huggingface_hub import constants  # only for hf:// URLs (the hf extra)
    except ImportError:
        return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    return constants.ENDPOINT


def wire_url(url: str, storage_options: dict | None) -> str:
    """The URL whose scheme the requests for ``url`` travel by: ``url`` itself, or for ``hf://`` the Hub
    endpoint its client talks to (a plain-http ``HF_ENDPOINT`` mirror carries the token in clear too)."""
    return hub_endpoint(storage_options) if protocol(url) == "hf" else url


def check_transport(url: str, storage_options: dict | None) -> None:
    """Refuse to send ``storage_options`` credentials over plain http, unless the user named that origin in
    STREAMBATCH_INSECURE_HTTP: on the wire they are readable by anyone between here and the server.
    (S3, GCS and Azure requests are signed, and their endpoint is the one the options themselves name;
    ``hf://`` goes to its Hub endpoint: ``wire_url``.)"""
    wire = wire_url(url, storage_options)
    if protocol(wire) == "http" and carries_credentials(storage_options) and not insecure_allowed(wire):
        where = origin(wire)
        serve = ("point the Hub endpoint (HF_ENDPOINT, or storage_options endpoint) at https"
                 if wire != url else "serve the shards over https")
        raise ValueError(scrub(f"storage_options hold credentials, which streambatch does not send over plain "
                               f"http ({where}, for {url}): {serve}, or, for a test server or a network you "
                               f"trust, name the origin: {INSECURE_ENV}={where}"))


def filesystem(url: str, storage_options: dict | None = None):
    """(fsspec filesystem, path) for ``url``, or ImportError naming the extra to install. Credentials in
    ``storage_options`` are refused over plain http (``check_transport``)."""
    check_transport(url, storage_options)
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
    """True for an http(s) URL on the Hugging Face Hub (or on ``HF_ENDPOINT``'s host), by name: which
    backend's advice a refusal gets (``retry.refusal_hint``). Whether the token goes there is ``hub_origin``."""
    if protocol(url) not in ("http", "https"):
        return False
    host = (urlsplit(url).hostname or "").lower()
    hosts = set(HUB_HOSTS)
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        hosts.add((urlsplit(endpoint).hostname or "").lower())
    return any(host == h or host.endswith("." + h) for h in hosts if h)


def hub_origin(url: str) -> bool:
    """Does the Hugging Face token go to ``url``? Only to the Hub's own origins: https on port 443 of
    huggingface.co, hf.co or their subdomains (the Hub's CDN), and ``HF_ENDPOINT`` at its exact scheme, host
    and port."""
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint and origin(url) == origin(endpoint):
        return True
    if protocol(url) != "https" or not origin(url).endswith(":443"):
        return False
    host = (urlsplit(url).hostname or "").lower()
    return any(host == h or host.endswith("." + h) for h in HUB_HOSTS)


def hub_token_options(url: str, storage_options: dict | None) -> dict:
    """``storage_options`` plus ``Authorization: Bearer <HF_TOKEN>`` for a URL
    of the Hub's own origins (``hub_origin``) that has no Authorization header
    of its own: the same token ``hf://`` URLs use (``HF_TOKEN``, else
    ``huggingface-cli login``'s). Never to another server, and over plain
    http (an ``HF_ENDPOINT`` mirror) only when that origin is named in
    STREAMBATCH_INSECURE_HTTP (else one warning says why it was not sent)."""
    options = dict(storage_options or {})
    if protocol(url) == "hf":  # huggingface_hub sends the token itself, to its endpoint
        return _hf_client_token(url, options)
    if not hub_origin(url):
        return options
    headers = dict(options.get("headers") or {})
    if any(k.lower() == "authorization" for k in headers):
        return options
    token = os.environ.get("HF_TOKEN") or _saved_hub_token()
    if token and protocol(url) == "http" and not insecure_allowed(url):
        _withhold(origin(url))
        return options
    if token:
        headers["Authorization"] = f"Bearer {token}"
        options["headers"] = headers
    return options


def _hf_client_token(url: str, options: dict) -> dict:
    """``options`` for an ``hf://`` URL: huggingface_hub's client sends its token (HF_TOKEN, else the saved
    login) to its endpoint; to a plain-http endpoint not named in STREAMBATCH_INSECURE_HTTP it sends none
    (``token=False``; a token given in ``options`` was refused by ``check_transport``)."""
    wire = wire_url(url, options)
    if protocol(wire) != "http" or insecure_allowed(wire) or "token" in options:
        return options
    if os.environ.get("HF_TOKEN") or _saved_hub_token():
        _withhold(origin(wire))
    return {**options, "token": False}


def _withhold(where: str) -> None:
    """Say once per origin that the Hub token was not sent there."""
    if where not in _withheld:
        _withheld.add(where)
        log.warning("the Hugging Face token (HF_TOKEN) is not sent to %s (the Hub endpoint: HF_ENDPOINT) over plain "
                    "http, where anyone on the way can read it; serve the mirror over https, or name the origin: "
                    "%s=%s",
                    where, INSECURE_ENV, where)


_withheld: set[str] = set()  # origins the token was withheld from (warned once each)


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
