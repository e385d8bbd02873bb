"""One GET per stream: the response bodies ``RemoteShard`` reads from
(HTTP(S) through fsspec's aiohttp session, S3 through s3fs/aiobotocore, ranged
chunks for other fsspec backends, ``pipe:`` commands through webdataset's
gopen). No retries here: ``remote.RemoteShard`` retries and resumes."""

from __future__ import annotations

import contextlib

from .remote import READ_CHUNK, HTTPStatusError, IOStats, normalize_etag, scrub


class _Stream:
    """One GET from ``offset``: ``read(n)`` -> bytes (b'' at the end);
    ``total`` (object size if the response told) and ``etag``."""

    total: int | None = None
    etag: str | None = None

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _AsyncStream(_Stream):
    """A response body on fsspec's event loop, read from this thread."""

    def __init__(self, fs, opener, *args):
        from fsspec.asyn import sync

        self._sync, self._loop = sync, fs.loop
        self._body, self.total, self.etag = sync(fs.loop, opener, *args)

    def read(self, n: int) -> bytes:
        return self._sync(self._loop, self._body.read, n)

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
    def __init__(self, response, skip: int):
        self.r, self.skip = response, skip

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


async def _http_get(fs, url: str, offset: int, end: int | None, timeout: float):
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
    return _HTTPBody(r, skip), total, normalize_etag(r.headers.get("ETag"))


async def _s3_get(fs, path: str, offset: int, end: int | None):
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


class _ChunkedStream(_Stream):
    """Ranged GETs of ``chunk`` bytes, for backends without a streaming body."""

    def __init__(self, fs, path: str, offset: int, size: int | None, chunk: int, stats: IOStats):
        self.fs, self.path, self.pos, self.size, self.chunk, self.stats = fs, path, offset, size, chunk, stats
        self.total = size
        self._buf = memoryview(b"")

    def read(self, n: int) -> bytes:
        if not self._buf:
            if self.size is not None and self.pos >= self.size:
                return b""
            end = self.pos + self.chunk if self.size is None else min(self.size, self.pos + self.chunk)
            self.stats.add(requests=1)
            self._buf = memoryview(self.fs.cat_file(self.path, start=self.pos, end=end))
        out, self._buf = bytes(self._buf[:n]), self._buf[n:]
        self.pos += len(out)
        return out


class _PipeStream(_Stream):
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
