"""One GET per stream: the response bodies ``RemoteShard`` reads from
(HTTP(S) through fsspec's aiohttp session, S3 through s3fs/aiobotocore, ranged
chunks for other fsspec backends, ``pipe:`` commands through webdataset's
gopen). No retries here: ``remote.RemoteShard`` retries and resumes (``retry.py``).

Waiting is bounded by ``RetryPolicy.timeout`` everywhere: HTTP by aiohttp's
``sock_connect``/``sock_read`` (an idle bound: a body that keeps flowing is
never cut), S3 by ``asyncio.wait_for`` around the request and around each
read (aiobotocore's ``read(n)`` returns what has arrived, so this too bounds
the silence, not the transfer), ranged chunks by ``objects.call``.

Stream: the body of one GET of a remote object, from a byte offset, chunk by chunk."""

from __future__ import annotations

import contextlib

from ...core.redact import scrub
from .objects import CHUNK_BYTES, READ_CHUNK, IOStats, NetworkTimeout, call, deadline, normalize_etag, object_info
from .retry import HTTPStatusError


class Stream:
    """One GET from ``offset``: ``read(n)`` -> bytes (b'' at the end);
    ``total`` (object size if the response told) and ``etag``;
    ``ignored_range``: the server sent the whole object although a Range
    was asked for (HTTP 200 instead of 206)."""

    total: int | None = None
    etag: str | None = None
    ignored_range: bool = False

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass


class AsyncStream(Stream):
    """A response body on fsspec's event loop, read from this thread.
    ``timeout``: seconds the request (to its headers) and each ``read`` may
    wait; ``bound=False`` when the opener bounds its own waits (``http_get``:
    aiohttp's idle timeouts, which a skip over ignored Range bytes needs)."""

    def __init__(self, fs, opener, *args, timeout: float = 60.0, bound: bool = True):
        from fsspec.asyn import sync

        self._sync, self._loop, self._timeout = sync, fs.loop, timeout
        self._wait = timeout if bound else None
        self._body, self.total, self.etag = self._run(opener, *args)
        self.ignored_range = bool(getattr(self._body, "ignored_range", False))

    def _run(self, fn, *args):
        from fsspec.exceptions import FSTimeoutError

        try:
            return self._sync(self._loop, fn, *args, timeout=self._wait)
        except FSTimeoutError:  # ours, or aiohttp's ServerTimeoutError (an asyncio.TimeoutError) that fsspec renames
            raise NetworkTimeout(f"no answer within {self._timeout:g} s") from None

    def read(self, n: int) -> bytes:
        return self._run(self._body.read, n)

    def close(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            # on the loop's thread (asyncio transports are not thread-safe); closing a
            # broken connection may itself fail, and there is nothing left to keep
            with contextlib.suppress(Exception):
                self._sync(self._loop, _aclose, body)


async def _aclose(body) -> None:
    body.close()


class _HTTPBody:
    def __init__(self, response, skip: int, ignored_range: bool = False):
        self.r, self.skip, self.ignored_range = response, skip, ignored_range

    async def read(self, n: int) -> bytes:
        while self.skip:  # the server ignored our Range: drop the bytes before the offset
            got = await self.r.content.read(min(self.skip, READ_CHUNK))
            if not got:
                return b""
            self.skip -= len(got)
        return await self.r.content.read(n)

    def close(self) -> None:
        self.r.close()


def _range(offset: int, end: int | None) -> str | None:
    if end is not None:
        return f"bytes={offset}-{end - 1}"
    return f"bytes={offset}-" if offset else None


async def http_get(fs, url: str, offset: int, end: int | None, timeout: float):
    import aiohttp

    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    if _range(offset, end):
        headers["Range"] = _range(offset, end)
    kw["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
    r = await session.get(fs.encode_url(url), headers=headers, **kw)
    if r.status >= 400:
        r.release()
        if r.status == 404:
            raise FileNotFoundError(f"{scrub(url)} does not exist (HTTP 404)")
        if r.status in (401, 403):
            raise PermissionError(f"access to {scrub(url)} was refused (HTTP {r.status}); check storage_options")
        raise HTTPStatusError(r.status, url)
    total = _content_total(r.headers.get("Content-Range"), r.headers.get("Content-Length"),
                           offset if r.status == 206 else 0)
    skip = offset if (offset and r.status != 206) else 0
    ignored = r.status != 206 and _range(offset, end) is not None
    return _HTTPBody(r, skip, ignored), total, normalize_etag(r.headers.get("ETag"))


async def s3_get(fs, path: str, offset: int, end: int | None):
    bucket, key, version = fs.split_path(path)
    kw = {"Range": _range(offset, end)} if _range(offset, end) else {}
    if version:
        kw["VersionId"] = version
    r = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
    total = _content_total(r.get("ContentRange"), r.get("ContentLength"), offset)
    return r["Body"], total, normalize_etag(r.get("ETag"))


def _content_total(content_range, content_length, offset: int) -> int | None:
    if content_range and "/" in str(content_range):
        tail = str(content_range).rsplit("/", 1)[1]
        if tail.isdigit():
            return int(tail)
    return int(content_length) + offset if content_length is not None else None


class ChunkedStream(Stream):
    """Ranged GETs of ``chunk`` bytes from ``offset`` to ``end`` (None: the
    object's end), for backends without a streaming body; each may take
    ``timeout`` seconds per MiB (``objects.deadline``). ``total`` and
    ``etag`` are the object's size and identity tag (ETag, GCS generation,
    Hub blob id / LFS sha256) from one metadata request first, so every
    backend's download is checked against what was indexed, as HTTP's and
    S3's response headers are."""

    def __init__(self, fs, path: str, offset: int, end: int | None, size: int | None, chunk: int = CHUNK_BYTES,
                 stats: IOStats | None = None, timeout: float = 60.0):
        self.fs, self.path, self.pos, self.chunk = fs, path, offset, chunk
        self.stats, self.timeout = stats or IOStats(), timeout
        # Chunks carry no headers: ask the object itself (also where its end is: reading past it fails on
        # some backends). Without this a piece of a shard would look like a different, shorter shard.
        self.stats.add(requests=1)
        info_size, self.etag = object_info(fs, path, timeout)
        if info_size is None:
            info_size = size
        self.total = None if info_size is None else int(info_size)
        # the object's size, not the end of the range read: a piece of a shard is not a smaller shard
        self.stop = end if end is not None else self.total
        self._buf = memoryview(b"")

    def read(self, n: int) -> bytes:
        if not self._buf:
            if self.stop is not None and self.pos >= self.stop:
                return b""
            end = self.pos + self.chunk if self.stop is None else min(self.stop, self.pos + self.chunk)
            self.stats.add(requests=1)
            data = call(self.fs, "cat_file", self.path, start=self.pos, end=end,
                        timeout=deadline(self.timeout, end - self.pos))
            if not data:
                return b""
            self._buf = memoryview(data)
        out, self._buf = bytes(self._buf[:n]), self._buf[n:]
        self.pos += len(out)
        return out


class PipeStream(Stream):
    def __init__(self, url: str, offset: int):
        from webdataset.gopen import gopen

        self.f = gopen(url, "rb")
        while offset:  # a pipe cannot seek
            got = self.f.read(min(offset, READ_CHUNK))
            if not got:
                break
            offset -= len(got)

    def read(self, n: int) -> bytes:
        return self.f.read(n)

    def close(self) -> None:
        try:  # a pipe closed early exits with SIGPIPE; a failed command is kept for download()
            self.f.close()
        except Exception as exc:
            self.close_error = exc

    close_error: Exception | None = None
