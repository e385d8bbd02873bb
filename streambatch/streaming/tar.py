"""Tar reading in small stages: ``TarScanner`` walks member headers (files by
seeking, streams by reading), ``sample_groups`` groups the members of a scan
into webdataset samples (one stage, shared by the indexer and the reader),
and ``parse_sample`` turns one sample's bytes back into a sample dict.

Unlike ``tarfile``, a corrupt header or truncated member anywhere is a
``ShardError`` naming the shard and byte offset, never a silent early end.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from webdataset.tariterators import base_plus_ext

from .errors import ShardError

# webdataset's own rule for members that are not sample data (tariterators.py)
_META_NAME = re.compile(r"__[^/]*__($|/)")
_SKIP_CHUNK = 1 << 20


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


@dataclass
class TarSample:
    """The members of one sample, as ``sample_groups`` collected them.

    offset: byte of the sample's first header; end: byte after its last
    member's padded data. members: suffix -> the bytes the caller asked for
    (possibly only a head); sizes / data_at: suffix -> member size and the
    byte its data starts at.
    """

    key: str
    offset: int
    end: int = 0
    members: dict[str, bytes] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    data_at: dict[str, int] = field(default_factory=dict)


def sample_groups(scanner: TarScanner, want: Callable[[str], int | None]) -> Iterator[TarSample]:
    """Group a scan's sample members by key, in tar order (webdataset's rule).

    ``want(suffix)`` says how much of a member's data to keep: None (none),
    -1 (all) or a byte count (a head). A key seen again after another key's
    members, or twice the same suffix in one sample, is a ``ShardError``.
    """
    cur: TarSample | None = None
    for entry in scanner:
        if not entry.regular:
            continue
        key, suffix = member_key(entry.name)
        if key is None:
            continue
        if cur is None or key != cur.key:
            if cur is not None:
                yield cur
            cur = TarSample(key, entry.offset)
        if suffix in cur.sizes:
            raise ShardError(f"shard {scanner.url} has two {suffix!r} members for sample {key!r} at byte {entry.offset}")
        cur.sizes[suffix] = entry.size
        cur.data_at[suffix] = entry.data_offset
        n = want(suffix)
        if n is not None:
            cur.members[suffix] = scanner.read_data(None if n < 0 else n)
        cur.end = entry.end
    if cur is not None:
        yield cur


def parse_sample(buf: bytes, url: str, offset: int, key: str) -> dict:
    """The webdataset-style sample dict held by ``buf``, the tar bytes of one
    sample (its members' headers and data) read at ``offset`` of ``url``."""
    hint = f"re-index it with `streambatch index --force {url}` if the shard changed, or replace it if it is damaged"
    scanner = TarScanner(io.BytesIO(buf), url, base=offset)
    scanner.seekable = False  # positions are shard offsets; never seek the buffer
    try:
        groups = sample_groups(scanner, lambda suffix: -1)
        found = next(groups, None)
        extra = next(groups, None) if found is not None and found.key == key else None
    except ShardError as exc:
        raise ShardError(f"{exc} (reading sample {key!r}; {hint})") from None
    if found is None:
        raise ShardError(f"sidecar/tar mismatch in shard {url} at byte {offset}: no member of sample {key!r} there; {hint}")
    bad = found if found.key != key else extra
    if bad is not None:
        raise ShardError(
            f"sidecar/tar mismatch in shard {url} at byte {bad.offset}: the sidecar lists sample "
            f"{key!r} but the tar holds sample {bad.key!r} there; {hint}"
        )
    return {"__key__": key, "__url__": url, **found.members}
