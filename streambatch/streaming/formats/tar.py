"""Tar member headers: ``TarScanner`` walks a shard's member headers (files by
seeking, streams by reading) and yields ``TarEntry`` records; grouping them
into samples and parsing a sample's bytes back is ``tar_samples.py``.

Members read as ``tarfile`` reads them: sparse members (GNU old style, pax
0.0/0.1/1.0; ``streaming/formats/tar_sparse.py``) are rebuilt into the files they stand for,
and the data of member types tarfile does not know (GNU 'D' dump
directories, 'M' multi-volume continuations, 'V' volume labels, ...) is
skipped. Unlike ``tarfile``, a corrupt header, a truncated member, a damaged
sparse map or a missing end-of-archive marker is a ``ShardError`` naming the
shard and byte offset, never a silent early end, an endless loop or an
unbounded allocation.

Stream: tar member records (name, offset, size, where the data is)."""

from __future__ import annotations

import io
import re
import tarfile

from ..errors import ShardError
from . import tar_sparse

_SKIP_CHUNK = 1 << 20
_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_GNU_NAME_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
# Real pax / GNU long-name headers hold a path and a few numbers; a bigger one
# is damage, and reading it whole would let one header allocate without bound.
_MAX_EXTENDED = 1 << 20
_PAX_LENGTH = re.compile(rb"([0-9]+) ")
_DECIMAL = re.compile(r"[0-9]+")
_GNU_MAGIC = b"ustar  \0"


class TarEntry:
    """One tar member: ``offset`` of its first header block (including any
    pax/GNU long-name headers before it), ``data_offset`` (its first stored
    data byte), ``size`` (of the file: the real size of a sparse member),
    ``stored`` (data bytes in the archive from ``data_offset``), ``sparse``
    (a sparse member's data regions, else None; see ``tar_sparse``), and the
    padded ``end`` where the next member starts."""

    __slots__ = ("offset", "name", "size", "data_offset", "regular", "stored", "sparse")

    def __init__(self, offset: int, name: str, size: int, data_offset: int, regular: bool,
                 stored: int | None = None, sparse: tar_sparse.Regions | None = None):
        self.offset, self.name, self.size, self.data_offset, self.regular = offset, name, size, data_offset, regular
        self.stored = size if stored is None else stored
        self.sparse = sparse

    @property
    def end(self) -> int:
        return self.data_offset + _padded(self.stored)


def _padded(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK


class TarScanner:
    """Walks the headers of an uncompressed tar, front to back.

    Header blocks are decoded with ``tarfile.TarInfo.frombuf`` (checksums,
    ustar prefixes, base-256 sizes); pax and GNU long-name records are applied
    here, strictly. Unlike ``tarfile``, damage anywhere is a ``ShardError``
    naming the shard and byte offset, never a silent early end: with
    ``require_end`` (whole shards) the archive must close with its
    end-of-archive marker, two zero blocks followed by nothing but zeros
    (writers pad to 10240-byte records), so a shard cut at a member boundary
    or holding a zero block mid-way is reported. ``read_data(n)`` reads (part
    of) the current member's data; the rest is skipped by seeking (files) or
    reading (streams). Reads are chunked and member sizes checked against the
    file size, so a corrupt size never allocates more than the data present.
    """

    def __init__(self, f, url: str, base: int = 0, *, seekable: bool | None = None, require_end: bool = True):
        self.f, self.url, self.pos = f, url, base
        if seekable is None:
            seekable = bool(getattr(f, "seekable", lambda: False)())
        self.seekable = seekable
        self.require_end = require_end
        self._size: int | None = None  # the shard's size in scan positions (seekable files only)
        if seekable:
            here = f.tell()
            self._size = base + f.seek(0, io.SEEK_END) - here
            f.seek(here)
        self._data_left = 0
        self._pad = 0
        self._sparse: tar_sparse.Regions | None = None  # the current member's regions, if sparse
        self._real = self._real_left = 0
        self._done = False

    def _truncated(self, at: int, what: str) -> ShardError:
        return ShardError(f"shard {self.url} is truncated at byte {at}: {what}")

    def _read(self, n: int) -> bytes:
        # Chunked, so a corrupt size on a stream allocates no more than the data that arrives.
        parts, need = [], n
        while need > 0:
            chunk = self.f.read(min(need, _SKIP_CHUNK))
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
                raise self._truncated(self.pos, "a member's data runs past the end")
            n -= got

    def read_data(self, n: int | None = None) -> bytes:
        """Up to ``n`` bytes (all if None) of the current member's remaining
        data; for a sparse member, of the file it stands for (holes as zeros)."""
        if self._sparse is not None:
            n = self._real_left if n is None else min(n, self._real_left)
            buf = tar_sparse.rebuild(self._sparse, self._real, self._real - self._real_left, n, self._read_stored)
            self._real_left -= n
            return buf
        n = self._data_left if n is None else min(n, self._data_left)
        buf = self._read(n)
        self._data_left -= len(buf)
        if len(buf) != n:
            raise self._truncated(self.pos, "a member's data runs past the end")
        return buf

    def _read_stored(self, offset: int, n: int) -> bytes:
        # ``rebuild`` asks for the stored regions in order, so this is the next ``n`` stored bytes
        buf = self._read(n)
        self._data_left -= len(buf)
        if len(buf) != n:
            raise self._truncated(self.pos, "a member's data runs past the end")
        return buf

    def _check_fits(self, at: int, data_at: int, size: int) -> None:
        if self._size is not None and data_at + _padded(size) > self._size:
            raise self._truncated(at, f"the member there declares {size} bytes of data, which run to byte "
                                      f"{data_at + _padded(size)}, past the end of the {self._size}-byte file")

    def _finish_member(self) -> None:
        self._skip(self._data_left)  # sizes were checked against the file when seekable
        self._skip(self._pad)
        self._data_left = self._pad = 0
        self._sparse = None

    def _check_end(self, at: int) -> None:
        """After a zero block at ``at``: a second one, then only zeros to EOF."""
        second = self._read(_BLOCK)
        if second != _ZERO_BLOCK:
            if not second.strip(b"\0") and len(second) < _BLOCK:
                raise self._truncated(at, "it ends inside its end-of-archive marker (one zero block of two)")
            raise ShardError(
                f"shard {self.url} has a zero block at byte {at} followed by data: a damaged or zeroed "
                "header mid-shard, not the end-of-archive marker; replace the shard")
        while True:
            here = self.pos
            chunk = self._read(_SKIP_CHUNK)
            if not chunk:
                return
            rest = chunk.lstrip(b"\0")
            if rest:
                raise ShardError(
                    f"shard {self.url} has data at byte {here + len(chunk) - len(rest)} after its end-of-archive "
                    f"marker at byte {at}: a zeroed block mid-shard, or tars joined together; replace the shard")

    def __iter__(self):
        return self

    def __next__(self) -> TarEntry:
        if self._done:
            raise StopIteration
        self._finish_member()
        first = self.pos
        overrides: dict[str, str] = {}
        sparse_00: list[tuple[str, str]] = []  # pax 0.0 repeats its map records, in order
        while True:
            start = self.pos
            block = self._read(_BLOCK)
            if len(block) < _BLOCK or block == _ZERO_BLOCK:
                if block and len(block) < _BLOCK:
                    raise self._truncated(start, "half a tar header")
                if first != start:
                    if not block:
                        raise self._truncated(start, "it ends after an extended header, before its member")
                    raise ShardError(f"corrupt tar in shard {self.url} at byte {first}: an extended header "
                                     "with no member after it")
                if self.require_end:
                    if not block:
                        raise self._truncated(start, "it ends without the end-of-archive marker (an interrupted "
                                                     "copy?); re-copy or rebuild the shard")
                    self._check_end(start)
                self._done = True
                raise StopIteration
            try:
                ti = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except (tarfile.HeaderError, ValueError) as exc:  # nti raises ValueError on overflowing fields
                raise ShardError(f"corrupt tar header in shard {self.url} at byte {start}: {exc}") from None
            if ti.size < 0:
                raise ShardError(f"corrupt tar header in shard {self.url} at byte {start}: negative size {ti.size}")
            if ti.type in _PAX_TYPES or ti.type in _GNU_NAME_TYPES:
                if ti.size > _MAX_EXTENDED:
                    raise ShardError(f"corrupt tar header in shard {self.url} at byte {start}: an extended header "
                                     f"of {ti.size} bytes (real ones hold a few hundred)")
                self._check_fits(start, self.pos, ti.size)
                padded = _padded(ti.size)
                data = self._read(padded)
                if len(data) != padded:
                    raise self._truncated(self.pos, "inside an extended header")
                data = data[: ti.size]
                if ti.type == tarfile.GNUTYPE_LONGNAME:
                    overrides["path"] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif ti.type != tarfile.XGLTYPE and ti.type != tarfile.GNUTYPE_LONGLINK:
                    for key, value in _pax_records(data, self.url, start):
                        overrides[key] = value
                        if key in ("GNU.sparse.offset", "GNU.sparse.numbytes"):
                            sparse_00.append((key, value))
                continue
            name = overrides.get("path", ti.name)
            if block[257:265] == _GNU_MAGIC and block[345] and "path" not in overrides:
                # Old GNU headers keep atime/ctime (incremental dumps) where ustar has its name
                # prefix: GNU tar, libarchive and Go read the name alone (tarfile prepends the times).
                name = tarfile.nts(block[:100], "utf-8", "surrogateescape")
            # tarfile takes a sparse member's name from GNU.sparse.name (pax 0.1 and 1.0)
            name = overrides.get("GNU.sparse.name", name)
            size = ti.size
            if "size" in overrides:
                if not _DECIMAL.fullmatch(overrides["size"]):
                    raise ShardError(f"corrupt pax header in shard {self.url} at byte {first}: size "
                                     f"{overrides['size']!r} is not a decimal number")
                size = int(overrides["size"])
            regular = ti.type in tarfile.REGULAR_TYPES
            if not regular and ti.type in tarfile.SUPPORTED_TYPES:
                # links, directories, devices, fifos: no data (as tarfile reads them)
                return TarEntry(first, name, 0, self.pos, False)
            # Regular members, and every type tarfile does not know (GNU 'D' dump directories,
            # 'M' multi-volume continuations, 'V' volume labels, 'N'): their data is skipped.
            sparse = tar_sparse.read_map(self, ti, block, overrides, sparse_00, first, name, size) if regular else None
            if sparse is not None:
                regions, real, size = sparse
            self._check_fits(first, self.pos, size)
            self._data_left = size
            self._pad = _padded(size) - size
            if sparse is None:
                return TarEntry(first, name, size if regular else 0, self.pos, regular, size)
            self._sparse, self._real, self._real_left = regions, real, real
            return TarEntry(first, name, real, self.pos, True, size, regions)


def _pax_records(data: bytes, url: str, offset: int) -> list[tuple[str, str]]:
    """The records ``"%d %s=%s\\n"`` of a pax extended header, in order,
    strictly: each length must be a decimal that spans its own length field,
    key, ``=`` and the closing newline, within the data."""
    out, pos = [], 0
    while pos < len(data) and data[pos] != 0:
        m = _PAX_LENGTH.match(data, pos)
        length = int(m.group(1)) if m else 0
        end = pos + length
        if m is None or end > len(data) or end <= m.end() or data[end - 1] != 0x0A:
            raise ShardError(f"corrupt pax header in shard {url} at byte {offset}: a malformed record at "
                             f"byte {pos} of its data ({bytes(data[pos : pos + 24])!r})")
        key, eq, value = data[m.end() : end - 1].partition(b"=")
        if not eq or not key:
            raise ShardError(f"corrupt pax header in shard {url} at byte {offset}: record "
                             f"{bytes(data[pos:end][:40])!r} has no key=value")
        out.append((key.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))
        pos = end
    return out
