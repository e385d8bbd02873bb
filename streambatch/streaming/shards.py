"""Shard URLs and tar reading: whole-shard scans for indexing, and single
samples by byte offset for training.

URL expansion and opening are webdataset's (``expand_urls``, ``gopen``), so
brace patterns, ``file:``, ``pipe:`` and ``http(s):`` behave as they do there.
Local files are read with ``os.pread`` at the offsets recorded in the sidecar;
anything else is a stream that can only be read front to back.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Iterable
from urllib.parse import urlparse

from webdataset.gopen import gopen
from webdataset.shardlists import expand_urls as wds_expand_urls
from webdataset.tariterators import base_plus_ext

# webdataset's own rule for members that are not sample data (tariterators.py)
_META_NAME = re.compile(r"__[^/]*__($|/)")
_SKIP_CHUNK = 1 << 20


class ShardError(ValueError):
    """A shard cannot be read as its sidecar describes: corrupt or truncated
    tar, a sidecar that no longer matches, or an unreadable URL. The message
    names the shard and, where it applies, the byte offset."""


def expand_urls(urls) -> list[str]:
    """Shard URLs from a brace pattern (``"a-{000..009}.tar"``), a path, or a
    list of either, in the given order."""
    if isinstance(urls, os.PathLike):
        urls = os.fspath(urls)
    if isinstance(urls, str):
        out = wds_expand_urls(urls)
    elif isinstance(urls, (list, tuple)):
        out = []
        for u in urls:
            if isinstance(u, os.PathLike):
                u = os.fspath(u)
            if not isinstance(u, str):
                raise TypeError(f"shard URLs must be strings or paths, got {u!r} ({type(u).__name__})")
            out.extend(wds_expand_urls(u))
    else:
        raise TypeError(
            f"urls must be a brace pattern string or a list of shard URLs, got {type(urls).__name__}"
        )
    if not out:
        raise ValueError("the shard list is empty; pass shard paths or a pattern like 'train-{000000..000099}.tar'")
    seen = set()
    for u in out:
        if u in seen:
            raise ValueError(f"shard {u!r} is listed twice; its samples would be trained on twice. Remove the duplicate")
        seen.add(u)
    return out


def is_local(url: str) -> bool:
    """True for plain paths and ``file:`` URLs: the shards we can seek in."""
    if url == "-":
        return False
    scheme = urlparse(url).scheme
    return scheme == "" or scheme == "file" or (len(scheme) == 1 and os.name == "nt")


def local_path(url: str) -> str:
    return re.sub(r"^file://?", "/", url) if url.startswith("file:") else url


def url_basename(url: str) -> str:
    """The file name a URL refers to; for ``pipe:cmd ... path`` the last word."""
    if url.startswith("pipe:"):
        url = url[5:].split()[-1].strip("'\"") if url[5:].split() else ""
    path = urlparse(url).path if not is_local(url) else local_path(url)
    name = os.path.basename(path.rstrip("/"))
    if not name:
        raise ValueError(f"cannot name a sidecar for shard URL {url!r}: it has no file name; pass index_dir and a URL ending in the shard's name")
    return name


def open_stream(url: str):
    """A binary stream over a shard (webdataset's gopen), or a ShardError naming it."""
    try:
        return gopen(url, "rb")
    except Exception as exc:  # gopen raises whatever the scheme's opener raises
        raise ShardError(f"cannot open shard {url}: {exc}") from exc


def open_shard(url: str, seekable: bool):
    """A binary file object over a shard for one front-to-back scan.

    Compressed tars are refused: their byte offsets would not address the file.
    """
    if seekable:
        try:
            f = open(local_path(url), "rb")
        except OSError as exc:
            raise ShardError(f"cannot open shard {url}: {exc}") from exc
        _refuse_compressed(url, f.read(6))
        f.seek(0)
        return f
    return open_stream(url)


def _refuse_compressed(url: str, magic: bytes) -> None:
    if magic[:2] == b"\x1f\x8b" or magic[:3] == b"BZh" or magic[:6] == b"\xfd7zXZ\x00" or magic[:4] == b"\x28\xb5\x2f\xfd":
        raise ShardError(
            f"shard {url} is compressed; streaming reads samples by byte offset, so shards must be plain "
            "tar (audio members are already compressed). Re-pack it with `tar` without -z/-j/-J/--zstd"
        )


def member_key(name: str) -> tuple[str | None, str | None]:
    """(sample key, lower-case suffix) of a member name as webdataset groups it,
    or (None, None) for members webdataset skips."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None, None
    if _META_NAME.match(name):
        return None, None
    prefix, suffix = base_plus_ext(name)
    if prefix is None:
        return None, None
    return prefix, suffix.lower()


_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_GNU_NAME_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class TarEntry:
    """One tar member: ``offset`` of its first header block (including any
    pax/GNU long-name headers before it), ``data_offset``, ``size``, and the
    padded ``end`` where the next member starts."""

    __slots__ = ("offset", "name", "size", "data_offset", "regular")

    def __init__(self, offset: int, name: str, size: int, data_offset: int, regular: bool):
        self.offset, self.name, self.size, self.data_offset, self.regular = offset, name, size, data_offset, regular

    @property
    def end(self) -> int:
        return self.data_offset + -(-self.size // _BLOCK) * _BLOCK


class TarScanner:
    """Walks the headers of an uncompressed tar, front to back.

    Header blocks are decoded with ``tarfile.TarInfo.frombuf`` (checksums,
    ustar prefixes, base-256 sizes); pax and GNU long-name records are applied
    here. Unlike ``tarfile``, a corrupt header or truncated member anywhere is
    an error naming the shard and byte offset, never a silent early end.
    ``read_data(n)`` reads (part of) the current member's data; the rest is
    skipped by seeking (files) or reading (streams).
    """

    def __init__(self, f, url: str, base: int = 0):
        self.f, self.url, self.pos = f, url, base
        self.seekable = bool(getattr(f, "seekable", lambda: False)())
        self._data_left = 0
        self._pad = 0

    def _read(self, n: int) -> bytes:
        parts, need = [], n
        while need:
            chunk = self.f.read(need)
            if not chunk:
                break
            parts.append(chunk)
            need -= len(chunk)
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        self.pos += len(buf)
        return buf

    def _skip(self, n: int) -> None:
        if n <= 0:
            return
        if self.seekable:
            self.f.seek(n, io.SEEK_CUR)
            self.pos += n
            return
        while n:
            got = len(self._read(min(n, _SKIP_CHUNK)))
            if not got:
                raise ShardError(f"shard {self.url} is truncated at byte {self.pos}: a member's data runs past the end")
            n -= got

    def read_data(self, n: int | None = None) -> bytes:
        """Up to ``n`` bytes (all if None) of the current member's remaining data."""
        n = self._data_left if n is None else min(n, self._data_left)
        buf = self._read(n)
        self._data_left -= len(buf)
        if len(buf) != n:
            raise ShardError(f"shard {self.url} is truncated at byte {self.pos}: a member's data runs past the end")
        return buf

    def _finish_member(self) -> None:
        if self.seekable and self._data_left:
            end = self.pos + self._data_left + self._pad
            size = self.f.seek(0, io.SEEK_END)
            if end > size:
                raise ShardError(f"shard {self.url} is truncated: a member's data runs to byte {end}, the file has {size} bytes")
            self.f.seek(end)
            self.pos = end
        else:
            self._skip(self._data_left)
            self._skip(self._pad)
        self._data_left = self._pad = 0

    def __iter__(self):
        return self

    def __next__(self) -> TarEntry:
        self._finish_member()
        first = self.pos
        overrides: dict[str, str] = {}
        while True:
            start = self.pos
            block = self._read(_BLOCK)
            if not block or block == _ZERO_BLOCK:  # end-of-archive marker (or a clean EOF)
                raise StopIteration
            if len(block) < _BLOCK:
                raise ShardError(f"shard {self.url} is truncated at byte {start}: half a tar header")
            try:
                ti = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise ShardError(f"corrupt tar header in shard {self.url} at byte {start}: {exc}") from None
            padded = -(-ti.size // _BLOCK) * _BLOCK
            if ti.type in _PAX_TYPES or ti.type in _GNU_NAME_TYPES:
                data = self._read(padded)
                if len(data) != padded:
                    raise ShardError(f"shard {self.url} is truncated at byte {self.pos}, inside an extended header")
                data = data[: ti.size]
                if ti.type == tarfile.GNUTYPE_LONGNAME:
                    overrides["path"] = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif ti.type != tarfile.XGLTYPE and ti.type != tarfile.GNUTYPE_LONGLINK:
                    overrides.update(_pax_records(data, self.url, start))
                continue
            name = overrides.get("path", ti.name)
            size = int(overrides["size"]) if "size" in overrides else ti.size
            self._data_left = size if ti.type in tarfile.REGULAR_TYPES else 0
            self._pad = -(-size // _BLOCK) * _BLOCK - self._data_left if self._data_left else 0
            return TarEntry(first, name, self._data_left, self.pos, ti.isreg())


def _pax_records(data: bytes, url: str, offset: int) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
            key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        except ValueError:
            raise ShardError(f"corrupt pax header in shard {url} at byte {offset}") from None
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def parse_sample(buf: bytes, url: str, offset: int, key: str) -> dict:
    """The webdataset-style sample dict held by ``buf``, the tar bytes of one
    sample (its members' headers and data) read at ``offset`` of ``url``."""
    sample = {"__key__": key, "__url__": url}
    hint = f"re-index it with `streambatch index --force {url}` if the shard changed, or replace it if it is damaged"
    scanner = TarScanner(io.BytesIO(buf), url, base=offset)
    scanner.seekable = False  # positions are shard offsets; never seek the buffer
    try:
        for entry in scanner:
            if not entry.regular:
                continue
            prefix, suffix = member_key(entry.name)
            if prefix is None:
                continue
            if prefix != key:
                raise ShardError(
                    f"sidecar/tar mismatch in shard {url} at byte {entry.offset}: the sidecar lists sample "
                    f"{key!r} but the tar holds member {entry.name!r} there; {hint}"
                )
            if suffix in sample:
                raise ShardError(f"shard {url} has two {suffix!r} members for sample {key!r} at byte {entry.offset}")
            sample[suffix] = scanner.read_data()
    except ShardError as exc:
        if hint in str(exc):
            raise
        raise ShardError(f"{exc} (reading sample {key!r}; {hint})") from None
    if len(sample) == 2:
        raise ShardError(f"sidecar/tar mismatch in shard {url} at byte {offset}: no member of sample {key!r} there; {hint}")
    return sample


class LocalReader:
    """Reads sample bytes from local shards with ``os.pread``; one descriptor
    per open shard, kept for the shards of the current window."""

    def __init__(self):
        self._fds: dict[str, tuple[int, int]] = {}
        self.bytes_read = 0

    def read(self, url: str, offset: int, size: int) -> bytes:
        entry = self._fds.get(url)
        if entry is None:
            try:
                fd = os.open(local_path(url), os.O_RDONLY)
            except OSError as exc:
                raise ShardError(f"cannot open shard {url}: {exc}") from exc
            entry = (fd, os.fstat(fd).st_size)
            self._fds[url] = entry
        fd, file_size = entry
        try:
            buf = os.pread(fd, size, offset)
        except OSError as exc:
            raise ShardError(f"cannot read shard {url} at byte {offset}: {exc}") from exc
        self.bytes_read += len(buf)
        if len(buf) != size:
            raise ShardError(
                f"shard {url} is truncated: the sidecar has a sample at bytes {offset}..{offset + size} "
                f"but the file has {file_size} bytes; re-index it with `streambatch index --force {url}` "
                "or replace the shard"
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
        try:
            self.close()
        except Exception:
            pass


def read_stream_regions(url: str, regions: list[tuple[int, int]]) -> tuple[dict[int, bytes], int]:
    """Read byte regions ``(offset, size)`` from a non-seekable shard in one
    front-to-back pass, stopping after the last one.

    Returns ({offset: bytes}, bytes consumed from the stream). Everything
    before the last region is read (and skipped ones discarded).
    """
    out: dict[int, bytes] = {}
    pos = 0
    stream = open_stream(url)
    try:
        for offset, size in sorted(set(regions)):
            if offset < pos:  # overlapping regions cannot happen with a valid sidecar
                raise ShardError(f"sidecar of shard {url} has overlapping samples at byte {offset}")
            while pos < offset:
                chunk = stream.read(min(_SKIP_CHUNK, offset - pos))
                if not chunk:
                    raise ShardError(f"shard {url} ended at byte {pos}, before the sample the sidecar places at byte {offset}; re-index it with `streambatch index --force {url}`")
                pos += len(chunk)
            parts, need = [], size
            while need:
                chunk = stream.read(need)
                if not chunk:
                    raise ShardError(f"shard {url} is truncated inside the sample at byte {offset}; re-index or replace it")
                parts.append(chunk)
                need -= len(chunk)
            out[offset] = b"".join(parts)
            pos += size
    except OSError as exc:
        raise ShardError(f"cannot read shard {url} at byte {pos}: {exc}") from exc
    finally:
        try:
            stream.close()
        except Exception:  # a pipe closed early exits with SIGPIPE; the data we needed is read
            pass
    return out, pos
