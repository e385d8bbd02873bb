"""When a remote read is tried again: the ``RetryPolicy``, the errors a read
can end in, which of them are transient, and the retry loop itself.

A transient failure (5xx, 408/429, connection reset, timeout, short read) is
retried with exponential backoff, resuming from the byte reached; after
``RetryPolicy.retries`` failures without progress it becomes a
``ShardError`` naming the URL and the byte offset. A refusal (401/403/404/410,
a backend's not-found or auth error) and the machine's own disk (``CacheError``,
ENOSPC) are never retried.

Stream: nothing: the retry decision and loop around one remote call."""

from __future__ import annotations

import errno
import numbers
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.redact import logger, scrub, scrub_url
from ..errors import CacheError, ShardError
from .objects import IOStats, hub_host, protocol

log = logger("streambatch.streaming")


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


def as_policy(retry: Any) -> RetryPolicy:
    """A ``RetryPolicy`` from None (the default), an int (retries) or a policy."""
    if retry is None:
        return RetryPolicy()
    if isinstance(retry, RetryPolicy):
        return retry
    if isinstance(retry, bool) or not isinstance(retry, numbers.Integral) or retry < 0:
        raise ValueError(f"retry must be a RetryPolicy or an integer >= 0 (the number of retries), got {retry!r}")
    return RetryPolicy(retries=int(retry))


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


def describe(exc: BaseException) -> str:
    """'Type: message', with the cause a backend wrapped (fsspec hides a 503 in a FileNotFoundError)."""
    text = f"{type(exc).__name__}: {scrub(exc)}"
    if exc.__cause__ is not None:
        text += f" (from {type(exc.__cause__).__name__}: {scrub(exc.__cause__)})"
    return text


def with_retries(policy: RetryPolicy, what: str, kind: str, url: str, fn: Callable[[], Any],
                 where: Callable[[], int] = lambda: 0, passthrough: tuple[type, ...] = (RangeIgnored,),
                 rng: random.Random | None = None, stats: IOStats | None = None) -> Any:
    """Call fn() until it succeeds, retrying transient errors under ``policy``;
    the count of failures starts again whenever ``where()`` (the byte reached)
    moved. A non-transient error of a ``passthrough`` type is raised as it is,
    any other failure as a ShardError naming the ``kind`` of object ("shard",
    "catalog", "sidecar"), its URL (scrubbed) and the byte reached. ``rng``:
    backoff jitter only, never a plan's; ``stats`` counts the retries."""
    rng = rng or random.Random()
    name = scrub_url(url)
    fails, last = 0, where()
    while True:
        try:
            return fn()
        except StaleShard as exc:
            raise ShardError(f"shard {name} changed since it was indexed: {exc}; re-index it with "
                             f"`streambatch index --force`") from None
        except ShardError:
            raise
        except Exception as exc:
            at = where()
            if at > last:
                fails, last = 0, at
            why = describe(exc)
            if not is_transient(exc):
                if isinstance(exc, passthrough):
                    raise
                refused = is_refusal(exc) or isinstance(exc, (FileNotFoundError, PermissionError))
                hint = f"; {refusal_hint(url)}" if refused else ""
                raise ShardError(f"cannot {what} {kind} {name} at byte {at}: {why}{hint}") from None
            fails += 1
            if fails > policy.retries:
                hint = ""
                if isinstance(exc, TimeoutError):
                    hint = (f"; the server sent nothing for RetryPolicy.timeout = {policy.timeout:g} s: "
                            "to wait longer pass retry=RetryPolicy(timeout=SECONDS) (on the command line: "
                            "`streambatch index --timeout SECONDS`)")
                raise ShardError(f"cannot {what} {kind} {name} at byte {at}: gave up after {fails} "
                                 f"attempts ({why}){hint}") from None
            delay = policy.delay(fails, rng)
            log.warning("retrying %s %s at byte %d in %.2f s (attempt %d of %d): %s", kind, name, at,
                        delay, fails, policy.retries, why)
            if stats is not None:
                stats.add(retries=1)
            time.sleep(delay)
