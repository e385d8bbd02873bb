"""Parquet files as pyarrow reads them here: file URLs from patterns and globs,
local files with their bytes counted, remote ones through ranged GETs, the
footer in one small read, each row group's byte range, and a row group read
back from the bytes the node-local cache holds.

Stream: bytes of Parquet files (footers, column chunks, row groups) for ``parquet.py``."""

from __future__ import annotations

import glob as globmod
import io
import os
from typing import Any

import numpy as np

from ....core.redact import scrub_url
from ...errors import ShardError
from ...io.objects import IOStats, filesystem, is_remote
from ...io.ranged import open_ranged, remote_stat
from ...io.reader import check_regular, open_regular
from ...io.urls import expand_urls, local_path

_GLOB = set("*?[")


def pyarrow_parquet():
    try:
        import pyarrow.parquet as pq  # lazy for start-up: an optional extra
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'streambatch[parquet]'") from None
    return pq


def expand_files(urls: Any, storage_options: dict | None = None) -> list[str]:
    """Parquet file URLs from paths, brace patterns and globs (local: ``glob``; remote: the store's listing)."""
    out: list[str] = []
    for u in expand_urls(urls):
        if not _GLOB & set(u.split("?", 1)[0].split("://", 1)[-1]):
            out.append(u)
        elif is_remote(u):
            fs, path = filesystem(u, storage_options)
            scheme = u.split("://", 1)[0]
            out.extend(f"{scheme}://{p.lstrip('/')}" for p in sorted(fs.glob(path)))
        else:
            out.extend(sorted(globmod.glob(local_path(u))))
    if not out:
        raise FileNotFoundError(f"no Parquet file matches {scrub_url(str(urls))}")
    return out


class CountingFile(io.RawIOBase):
    """A read-only file that counts the bytes read through it (local Parquet files)."""

    def __init__(self, f):
        super().__init__()
        self.f, self.bytes = f, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.bytes += len(data)
        return data

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.bytes += n or 0
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


def open_file(url: str, storage_options: dict | None, retry, stats: IOStats, size: int | None = None,
              readahead: int = 0):
    """A seekable file over a Parquet file: local, or remote through ranged GETs (counted in ``stats``)."""
    if is_remote(url):
        if size is None:
            size = remote_stat(url, storage_options, retry)["size"]
        return open_ranged(url, size, storage_options, stats=stats, readahead=readahead, retry=retry)
    # a regular file only (a FIFO would block, /dev/zero never end); closed by the caller
    return CountingFile(os.fdopen(open_regular(url, "Parquet file"), "rb"))


class TailFile(io.RawIOBase):
    """A file of ``size`` bytes of which only the last ones (``tail``) are known; the rest read as zeros.
    pyarrow parses a footer from it: it reads its default 64 KiB from the end, but only the footer counts."""

    def __init__(self, size: int, tail: bytes):
        super().__init__()
        self.size, self.tail, self.at, self.pos = size, tail, size - len(tail), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else max(0, min(n, self.size - self.pos))
        lo, self.pos = self.pos, self.pos + n
        pad = max(0, min(self.at - lo, n))
        start = max(0, lo - self.at)
        return bytes(pad) + self.tail[start:start + n - pad]

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class SliceFile(io.RawIOBase):
    """Bytes ``[start, start + len(data))`` of a file of ``size`` bytes (a row group from the node-local cache),
    read at their positions in the file; pyarrow reads a row group's column chunks from it."""

    def __init__(self, data: bytes, start: int, size: int, url: str):
        super().__init__()
        self.data, self.start, self.size, self.url, self.pos = data, start, size, url, start

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        lo = self.pos - self.start
        n = len(self.data) - lo if n is None or n < 0 else n
        if lo < 0 or lo + n > len(self.data):
            raise ShardError(f"Parquet file {self.url}: a read at byte {self.pos} ({n} bytes) falls outside the "
                             f"row group's bytes {self.start}..{self.start + len(self.data)}")
        self.pos += n
        return self.data[lo:lo + n]

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def group_ranges(md) -> np.ndarray:
    """(G, 2) int64 byte range [start, end) of each row group's column chunks (a footer's ``FileMetaData``)."""
    out = np.zeros((md.num_row_groups, 2), dtype=np.int64)
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        lo, hi = None, 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset else \
                col.data_page_offset
            lo = start if lo is None else min(lo, start)
            hi = max(hi, start + col.total_compressed_size)
        out[g] = (lo or 0, hi)
    return out


def read_footer(f, size: int, url: str, guess: int = 16 << 10):
    """A Parquet file's footer (pyarrow ``FileMetaData``) in one read of its last ``guess`` bytes (two when
    the footer is larger), instead of the 64 KiB pyarrow reads: for a remote file, one small GET."""
    take = min(size, guess)
    f.seek(size - take)
    tail = f.read(take)
    if size < 12 or tail[-4:] != b"PAR1":
        raise ValueError(f"{scrub_url(url)} is not a Parquet file (no PAR1 footer)")
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > size - 4:
        raise ValueError(f"{scrub_url(url)}: its footer claims {need} bytes, the file has {size}")
    if need > take:
        f.seek(size - need)
        tail = f.read(need)
    return pyarrow_parquet().ParquetFile(TailFile(size, tail[-need:])).metadata


def identity(url: str, storage_options: dict | None, retry) -> dict[str, Any]:
    """What says a Parquet file is still the one opened: size and ETag (remote) or size and mtime (local)."""
    if is_remote(url):
        return remote_stat(url, storage_options, retry)
    st = os.stat(local_path(url))
    check_regular(url, st.st_mode, "Parquet file")  # before pyarrow opens it
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
