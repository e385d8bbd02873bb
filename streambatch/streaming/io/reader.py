"""Byte access to shards that are not cached objects: opening a shard for a
scan, reading samples from local files by offset (``os.pread``) and from
streams (``pipe:``, ``http(s):`` through webdataset's ``gopen``) front to back.

Stream: sample bytes of local files by offset, and of streams front to back."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import OrderedDict
from collections.abc import Iterable

from webdataset.gopen import gopen

from ...core.redact import scrub
from ..errors import ShardError
from .urls import local_path

_SKIP_CHUNK = 1 << 20


def open_stream(url: str):
    """A binary stream over a shard (webdataset's gopen), or a ShardError naming it."""
    try:
        return gopen(url, "rb")
    except Exception as exc:  # gopen raises whatever the scheme's opener raises
        raise ShardError(f"cannot open shard {url}: {exc}") from exc


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


def check_regular(url: str, mode: int, what: str = "shard") -> None:
    """Refuse a local shard whose ``st_mode`` is not a regular file's: streambatch reads local shards by byte
    offset and scans them front to back to index them, which a FIFO (open blocks until a writer comes, and
    its bytes go once), a device (/dev/zero never ends) or a directory cannot give. ``what``: the kind of file
    named in the error (another corpus format's files: "Parquet file", "NeMo manifest", "Shar cuts file")."""
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    path = local_path(url)
    link = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    fix = ("local shards are read by byte offset and indexed front to back; copy the data into a regular .tar "
           "file and list that" if what == "shard" else
           "streambatch reads it whole or by byte offset, which a FIFO, a device or a directory cannot give; copy "
           "it into a regular file and name that")
    raise ShardError(f"{what} {url} is {kind}{link}, not a regular file: {fix}")


def open_regular(url: str, what: str = "shard") -> int:
    """A read-only descriptor of local shard ``url``, checked to be a regular file (``check_regular``).
    Opened non-blocking, so that a FIFO put in a shard's place is refused instead of waiting for a writer
    (for a regular file the flag changes nothing). OSError passes through for the caller to word."""
    fd = os.open(local_path(url), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        check_regular(url, os.fstat(fd).st_mode, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_shard(url: str, seekable: bool):
    """A binary file object over a shard for one front-to-back scan.

    Compressed tars are refused: their byte offsets would not address the file.
    """
    if not seekable:
        return open_stream(url)
    with contextlib.ExitStack() as on_error:  # closes the file if it is refused; the caller closes it otherwise
        try:
            fd = open_regular(url)
        except OSError as exc:
            raise ShardError(f"cannot open shard {url}: {exc}") from exc
        f = on_error.enter_context(os.fdopen(fd, "rb"))
        _refuse_compressed(url, f.read(6))
        f.seek(0)
        on_error.pop_all()
    return f


def _refuse_compressed(url: str, magic: bytes) -> None:
    gzip, bzip2, xz, zstd = b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd"
    if magic.startswith((gzip, bzip2, xz, zstd)):
        raise ShardError(
            f"shard {url} is compressed; streaming reads samples by byte offset, so shards must be plain "
            "tar (audio members are already compressed). Re-pack it with `tar` without -z/-j/-J/--zstd"
        )


# Running out of descriptors or memory is the process's problem, not the
# shard's: raised as OSError so that on_error="skip" does not hide it.
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


class LocalReader:
    """Reads sample bytes from local shards with ``os.pread``, keeping at most
    ``max_open`` descriptors open (least recently used closed first), so a
    window of thousands of small shards stays far below ``ulimit -n``."""

    def __init__(self, max_open: int = 64):
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be an integer >= 1, got {max_open!r}")
        self.max_open = max_open
        self._fds: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.bytes_read = 0

    def _open(self, url: str) -> tuple[int, int]:
        while len(self._fds) >= self.max_open:
            os.close(self._fds.popitem(last=False)[1][0])
        try:
            fd = open_regular(url)
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES and self._fds:
                self.close()  # give our own descriptors back and retry once
                return self._open(url)
            if exc.errno in OUT_OF_RESOURCES:
                raise OSError(exc.errno, f"cannot open shard {scrub(url)}: out of file descriptors ({exc.strerror}); "
                                         "raise the limit (`ulimit -n`) or use fewer DataLoader workers") from exc
            raise ShardError(f"cannot open shard {url}: {exc}") from exc
        entry = (fd, os.fstat(fd).st_size)
        self._fds[url] = entry
        return entry

    def read(self, url: str, offset: int, size: int) -> bytes:
        entry = self._fds.get(url)
        if entry is None:
            entry = self._open(url)
        else:
            self._fds.move_to_end(url)
        fd, file_size = entry
        if offset < 0 or size < 0 or offset + size > file_size:  # checked before allocating the buffer
            raise ShardError(
                f"shard {url} is truncated: the sidecar has a sample at bytes {offset}..{offset + size} "
                f"but the file has {file_size} bytes; re-index it with `streambatch index --force {url}` "
                "or replace the shard"
            )
        try:
            buf = os.pread(fd, size, offset)
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                raise
            raise ShardError(f"cannot read shard {url} at byte {offset}: {exc}") from exc
        self.bytes_read += len(buf)
        if len(buf) != size:
            raise ShardError(
                f"shard {url} is truncated: the sidecar has a sample at bytes {offset}..{offset + size} "
                f"but the file now ends at byte {offset + len(buf)}; re-index it with "
                f"`streambatch index --force {url}` or replace the shard"
            )
        return buf

    def keep_only(self, urls: Iterable[str]) -> None:
        """Close descriptors of shards not in ``urls``."""
        keep = set(urls)
        for url in [u for u in self._fds if u not in keep]:
            os.close(self._fds.pop(url)[0])

    def close(self) -> None:
        self.keep_only(())

    def __del__(self):
        with contextlib.suppress(Exception):  # a finalizer must never raise
            self.close()


def read_stream_regions(url: str, regions: list[tuple[int, int]], out: dict[int, bytes] | None = None
                        ) -> tuple[dict[int, bytes], int]:
    """Read byte regions ``(offset, size)`` from a non-seekable shard in one
    front-to-back pass, stopping after the last one.

    Returns ({offset: bytes}, bytes consumed from the stream). Everything
    before the last region is read (and skipped ones discarded). Regions are
    stored into ``out`` (if given) as they are read, so after a ``ShardError``
    it holds the ones read before the failure.
    """
    out = {} if out is None else out
    pos = 0
    stream = open_stream(url)
    try:
        for offset, size in sorted(set(regions)):
            if offset < pos:  # overlapping regions cannot happen with a valid sidecar
                raise ShardError(f"sidecar of shard {url} has overlapping samples at byte {offset}")
            while pos < offset:
                chunk = stream.read(min(_SKIP_CHUNK, offset - pos))
                if not chunk:
                    raise ShardError(f"shard {url} ended at byte {pos}, before the sample the sidecar places "
                                     f"at byte {offset}; re-index it with `streambatch index --force {url}`")
                pos += len(chunk)
            parts, need = [], size
            while need:
                chunk = stream.read(min(need, _SKIP_CHUNK))  # a corrupt size must not allocate up front
                if not chunk:
                    raise ShardError(f"shard {url} is truncated inside the sample at byte {offset}; "
                                     "re-index or replace it")
                parts.append(chunk)
                need -= len(chunk)
            out[offset] = b"".join(parts)
            pos += size
    except OSError as exc:
        raise ShardError(f"cannot read shard {url} at byte {pos}: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):  # a pipe closed early exits with SIGPIPE; the data we needed is read
            stream.close()
    return out, pos
