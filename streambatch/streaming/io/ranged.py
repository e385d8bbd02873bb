"""Indexing remote shards without downloading them, and sidecars that live
in object storage.

``RangedFile`` is a seekable read-only file over a remote object that
fetches small ranges on demand: a read that misses fetches at least
``readahead`` bytes from there, in one GET. The tar scanner seeks from
header to header through it and skips audio payloads. 2 KiB from a member's
first header cover what indexing needs of it: webdataset's TarWriter writes
a pax header and record before each ustar header (1.5 KiB), then the data,
whose first 512 bytes hold a small JSON member or the WAV/FLAC frame count.
So a sample of an audio and a JSON member costs two GETs and 4 KiB (ustar
or GNU tars without pax records: 2 KiB), about 4-6 % of a 2 s 16 kHz
WAV/FLAC sample and under 3 % from 4 s on.

A server that ignores Range requests (HTTP 200 with the whole object) makes
``RangedFile`` raise ``RangeIgnored`` on its first read, before any body is
read; the indexer then streams the shard once front to back
(``StreamFile``), like a ``pipe:``.

Sidecars and catalogs in object storage are read with one GET each
(``read_npz_bytes``), under the same ``RetryPolicy`` (timeout, retries) as
shards.

Stream: byte ranges of remote objects (``RangedFile``), npz files in remote storage."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np

from ...core.redact import scrub, scrub_url
from ..errors import ShardError
from .objects import READ_CHUNK, IOStats, is_remote
from .remote import RemoteShard
from .retry import RetryPolicy, ShortRead

READAHEAD = 2048  # pax header + record + ustar header + the first data block
AUDIO_HEAD = 512  # WAV fmt/data chunks and FLAC STREAMINFO sit in the first bytes; more is fetched if not


class RangedFile(io.RawIOBase):
    """Read-only, seekable view of a remote object of known ``size``."""

    def __init__(self, shard: RemoteShard, size: int, readahead: int = READAHEAD):
        super().__init__()
        self.shard, self.size, self.readahead = shard, size, readahead
        self.pos = 0
        self._buf, self._buf_at = b"", 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = max(0, min(n, self.size - self.pos))
        if n == 0:
            return b""
        lo = self.pos - self._buf_at
        if lo >= 0 and lo + n <= len(self._buf):
            out = self._buf[lo : lo + n]
        else:
            # Keep what the buffer already holds of the front, fetch the rest plus readahead.
            head = self._buf[lo:] if 0 <= lo < len(self._buf) else b""
            start = self.pos + len(head)
            end = min(self.size, max(self.pos + n, start + self.readahead))
            data = self.shard.read_range(start, end)  # RangeIgnored passes: the indexer streams instead
            if len(data) != end - start:
                raise ShardError(f"shard {self.shard.name} is shorter than its {self.size} bytes: a read at "
                                 f"byte {start} returned {len(data)} of {end - start} bytes")
            self._buf, self._buf_at = head + data, self.pos
            out = self._buf[: n]
        self.pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def remote_stat(url: str, storage_options: dict | None, retry: RetryPolicy | None = None,
                stats: IOStats | None = None) -> dict[str, Any]:
    """{"size": bytes, "etag": str or None} of a remote shard (one metadata request)."""
    size, etag = RemoteShard(url, storage_options, retry=retry, stats=stats).info()
    if size is None:
        raise ShardError(f"shard {scrub_url(url)} does not report its size; remote indexing needs it")
    return {"size": size, "etag": etag}


def open_ranged(url: str, size: int, storage_options: dict | None, stats: IOStats | None = None,
                readahead: int = READAHEAD, retry: RetryPolicy | None = None) -> RangedFile:
    return RangedFile(RemoteShard(url, storage_options, size=size, stats=stats, retry=retry), size, readahead)


class StreamFile(io.RawIOBase):
    """Read-only, forward-only view of a remote object as one streaming GET
    (for servers that ignore Range): what the tar scanner reads of a pipe.
    A transient fault reopens the stream at the byte reached (on such a
    server that re-reads the bytes before it, dropped as they arrive); the
    object must still have the ``stat`` size and ETag."""

    def __init__(self, url: str, stat: dict, storage_options: dict | None, retry: RetryPolicy | None = None,
                 stats: IOStats | None = None):
        super().__init__()
        self.shard = RemoteShard(url, storage_options, size=stat.get("size"), etag=stat.get("etag"), retry=retry,
                                 stats=stats)
        self.pos = 0
        self._stream = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        n = READ_CHUNK if n is None or n < 0 else n

        def attempt() -> bytes:
            try:
                if self._stream is None:
                    self._stream = self.shard.open_at(self.pos)
                    self.shard.check_identity(self._stream)
                return self._stream.read(n)
            except BaseException:
                self._drop()
                raise

        data = self.shard.retrying("read", attempt, lambda: self.pos)
        self.pos += len(data)
        self.shard.stats.add(nbytes=len(data))
        return data

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def close(self) -> None:
        self._drop()
        super().close()


# ---------------------------------------------------------------- sidecars in object storage


def _kind(path: str) -> str:
    """What the object is called in messages: a sidecar (``*.idx.npz``) or a catalog (or catalog part)."""
    return "sidecar" if path.split("?", 1)[0].endswith(".idx.npz") else "catalog"


def read_npz_bytes(path: str, storage_options: dict | None, retry: RetryPolicy | None = None) -> bytes:
    """A whole remote object in one streaming GET, retried and resumed like a
    shard's under ``retry`` (its timeout bounds every wait). A missing object
    is ``FileNotFoundError``; any other failure an ``OSError`` naming it."""
    shard = RemoteShard(path, storage_options, retry=retry, kind=_kind(path))
    buf = io.BytesIO()
    try:
        shard.retrying("read", lambda: _download_all(shard, buf), passthrough=(FileNotFoundError,))
    except ShardError as exc:
        raise OSError(str(exc)) from None
    except FileNotFoundError:
        raise FileNotFoundError(f"{scrub_url(path)} does not exist") from None
    return buf.getvalue()


def _download_all(shard: RemoteShard, buf: io.BytesIO) -> None:
    # one attempt from the byte reached (download() retries itself, and turns a missing object into
    # a ShardError; here a missing catalog must stay FileNotFoundError)
    stream = shard.open_at(buf.tell())
    try:
        while True:
            chunk = stream.read(READ_CHUNK)
            if not chunk:
                break
            buf.write(chunk)
            shard.stats.add(nbytes=len(chunk))
    finally:
        stream.close()
    if stream.total is not None and buf.tell() < stream.total:
        raise ShortRead(f"the response ended at byte {buf.tell()} of {stream.total}")


def load_npz(path: str, storage_options: dict | None = None, retry: RetryPolicy | None = None):
    """``np.load`` of a local or remote .npz (remote: one GET into memory)."""
    if not is_remote(path):
        return np.load(path)
    return np.load(io.BytesIO(read_npz_bytes(path, storage_options, retry)))


def exists(path: str, storage_options: dict | None = None, retry: RetryPolicy | None = None) -> bool:
    """Whether the object exists (one metadata request, under ``retry``: a
    server that does not answer is a ``ShardError``, not a missing object)."""
    if not is_remote(path):
        return os.path.exists(path)
    return bool(RemoteShard(path, storage_options, retry=retry, kind=_kind(path)).request("stat", "exists"))


def write_bytes(path: str, data: bytes, storage_options: dict | None = None, retry: RetryPolicy | None = None) -> None:
    """Write a whole object (an object-store PUT is atomic: no torn sidecars),
    retried under ``retry`` (a PUT of the same bytes again is harmless)."""
    try:
        RemoteShard(path, storage_options, retry=retry, kind=_kind(path)).request("write", "pipe_file", data,
                                                                                nbytes=len(data))
    except (ShardError, OSError, NotImplementedError) as exc:
        # a public bucket, the Hub or an HTTP server takes no upload from a reader: say where else it can go
        raise ShardError(f"{scrub(exc)}; the store did not take the write: keep the index elsewhere with "
                         "index_dir=DIR (`streambatch index --index-dir DIR`), a local directory or shared "
                         "storage every rank can read") from None


def npz_bytes(meta: dict, arrays: dict[str, np.ndarray], compressed: bool = True) -> bytes:
    buf = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()
