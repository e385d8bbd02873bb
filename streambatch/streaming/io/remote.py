"""One remote shard (or catalog, or sidecar) by URL: its identity, ranged
reads and whole-object downloads, with retries.

A whole shard is read in one GET where the backend can stream (HTTP(S)
through aiohttp, S3 through s3fs/aiobotocore, the Hub's streaming file:
``streams.py``), else in ``chunk_bytes`` ranged GETs. A transient failure is
retried and the download resumed from the byte reached (``retry.py``); a
download whose object no longer has the size or ETag recorded at indexing is
a ``ShardError`` (stale shard). The URL helpers (``objects.py``) and the
policy (``retry.py``) are imported from here by callers that read objects.

Stream: the bytes of one remote object (a range, or the whole of it into a file)."""

from __future__ import annotations

import random

from ...core.redact import scrub_url
from .objects import CHUNK_BYTES, READ_CHUNK, IOStats, call, deadline, filesystem, normalize_etag, object_info, protocol
from .retry import RangeIgnored, RetryPolicy, ShortRead, StaleShard, Truncated, with_retries
from .streams import AsyncStream, ChunkedStream, PipeStream, http_get, s3_get


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

    def retrying(self, what: str, fn, where=lambda: 0, passthrough: tuple[type, ...] = (RangeIgnored,)):
        """``fn()`` under this shard's retry policy (``retry.with_retries``)."""
        return with_retries(self.retry, what, self.kind, self.url, fn, where, passthrough, self._rng, self.stats)

    def request(self, what: str, method: str, *args, nbytes: int = 0, **kwargs):
        """``fs.<method>(path, *args, **kwargs)`` with retries, each attempt
        bounded by the policy's timeout (``deadline``)."""
        fs, path = self._filesystem()

        def attempt():
            self.stats.add(requests=1)
            return call(fs, method, path, *args, timeout=deadline(self.retry.timeout, nbytes), **kwargs)

        return self.retrying(what, attempt, passthrough=(FileNotFoundError,))

    def info(self) -> tuple[int | None, str | None]:
        """(size, etag) from one metadata request."""
        fs, path = self._filesystem()

        def stat():
            self.stats.add(requests=1)
            return object_info(fs, path, self.retry.timeout)

        return self.retrying("stat", stat)

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

        return self.retrying("read", get, lambda: start)

    def open_at(self, offset: int, end: int | None = None):
        """One GET of bytes [offset, end) of the object (end None: to its
        end); the stream may run past ``end`` (no retries here)."""
        if protocol(self.url) == "pipe":
            self.stats.add(requests=1)
            return PipeStream(self.url, offset)
        fs, path = self._filesystem()
        kind = type(fs).__module__
        self.stats.add(requests=1)
        if kind.startswith("fsspec.implementations.http"):
            return AsyncStream(fs, http_get, fs, path, offset, end, self.retry.timeout, timeout=self.retry.timeout,
                                bound=False)
        if kind.startswith("s3fs"):  # botocore's read timeout would not follow the policy: wait_for does
            return AsyncStream(fs, s3_get, fs, path, offset, end, timeout=self.retry.timeout)
        self.stats.add(requests=-1)  # counted per chunk below
        return ChunkedStream(fs, path, offset, end, self.size, self.chunk_bytes, self.stats, self.retry.timeout)

    def download(self, out, start: int = 0, end: int | None = None) -> int:
        """Write bytes [start, end) of the object (end None: to its end) to
        the binary file ``out`` in one GET, resuming after transient faults
        from the byte reached; returns the number of bytes written."""
        state = {"pos": start, "stop": end if end is not None else self.size, "total": self.size}

        def attempt():
            stream = self.open_at(state["pos"], end)
            try:
                self.check_identity(stream)
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

        return self.retrying("read", attempt, lambda: state["pos"])

    def check_identity(self, stream) -> None:
        if self.size is not None and stream.total is not None and stream.total != self.size:
            raise StaleShard(f"it has {stream.total} bytes, the index recorded {self.size}")
        if self.etag is not None and stream.etag is not None and stream.etag != self.etag:
            raise StaleShard(f"its ETag is {stream.etag}, the index recorded {self.etag}")
