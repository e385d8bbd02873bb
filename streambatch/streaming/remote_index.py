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
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np

from .errors import ShardError
from .remote import IOStats, RemoteShard, RetryPolicy, filesystem, is_remote, scrub_url

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
            data = self.shard.read_range(start, end)
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
                readahead: int = READAHEAD) -> RangedFile:
    return RangedFile(RemoteShard(url, storage_options, size=size, stats=stats), size, readahead)


# ---------------------------------------------------------------- sidecars in object storage


def read_npz_bytes(path: str, storage_options: dict | None) -> bytes:
    fs, p = filesystem(path, storage_options)
    try:
        return fs.cat_file(p)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise OSError(f"cannot read {scrub_url(path)}: {exc}") from None


def load_npz(path: str, storage_options: dict | None = None):
    """``np.load`` of a local or remote .npz (remote: one GET into memory)."""
    if not is_remote(path):
        return np.load(path)
    return np.load(io.BytesIO(read_npz_bytes(path, storage_options)))


def exists(path: str, storage_options: dict | None = None) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    fs, p = filesystem(path, storage_options)
    return fs.exists(p)


def write_bytes(path: str, data: bytes, storage_options: dict | None = None) -> None:
    """Write a whole object (an object-store PUT is atomic: no torn sidecars)."""
    fs, p = filesystem(path, storage_options)
    fs.pipe_file(p, data)


def npz_bytes(meta: dict, arrays: dict[str, np.ndarray], compressed: bool = True) -> bytes:
    buf = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()
