"""Webdataset samples from tar members: ``sample_groups`` groups a
``TarScanner``'s members into samples by key (webdataset's rule; one stage,
shared by the indexer and the reader), ``read_member`` reads one member of a
scanned sample back, and ``parse_sample`` turns one sample's bytes (as the
sidecar's offsets locate them) back into a sample dict.

Stream: ``TarSample`` groups of a scan, in tar order; a sample dict from its bytes."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from webdataset.tariterators import base_plus_ext

from ..errors import ShardError
from . import tar_sparse
from .tar import TarScanner

# webdataset's own rule for members that are not sample data (tariterators.py)
_META_NAME = re.compile(r"__[^/]*__($|/)")


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


@dataclass
class TarSample:
    """The members of one sample, as ``sample_groups`` collected them.

    offset: byte of the sample's first header; end: byte after its last
    member's padded data. members: suffix -> the bytes the caller asked for
    (possibly only a head); sizes / data_at: suffix -> member size (of the
    file, for a sparse member) and the byte its stored data starts at;
    sparse: suffix -> the data regions of a sparse member (``read_member``
    reads either kind back).
    """

    key: str
    offset: int
    end: int = 0
    members: dict[str, bytes] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    data_at: dict[str, int] = field(default_factory=dict)
    sparse: dict[str, tar_sparse.Regions] = field(default_factory=dict)


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
            raise ShardError(f"shard {scanner.url} has two {suffix!r} members for sample {key!r} "
                             f"at byte {entry.offset}")
        cur.sizes[suffix] = entry.size
        cur.data_at[suffix] = entry.data_offset
        if entry.sparse is not None:
            cur.sparse[suffix] = entry.sparse
        n = want(suffix)
        if n is not None:
            cur.members[suffix] = scanner.read_data(None if n < 0 else n)
        cur.end = entry.end
    if cur is not None:
        yield cur


def read_member(f, sample: TarSample, suffix: str) -> bytes:
    """The whole member ``suffix`` of ``sample``, read again from ``f``, a
    seekable file of the shard (offsets as scanned); a sparse member is
    rebuilt from its regions. ``f``'s position is kept."""
    here = f.tell()
    try:
        at, size = sample.data_at[suffix], sample.sizes[suffix]
        regions = sample.sparse.get(suffix)
        if regions is None:
            f.seek(at)
            return f.read(size)

        def read(offset: int, n: int) -> bytes:
            f.seek(at + offset)
            return f.read(n)

        return tar_sparse.rebuild(regions, size, 0, size, read)
    finally:
        f.seek(here)


def parse_sample(buf: bytes, url: str, offset: int, key: str) -> dict:
    """The webdataset-style sample dict held by ``buf``, the tar bytes of one
    sample (its members' headers and data) read at ``offset`` of ``url``."""
    hint = f"re-index it with `streambatch index --force {url}` if the shard changed, or replace it if it is damaged"
    # positions are shard offsets (never seek the buffer); a sample's bytes end
    # without the archive's end marker
    scanner = TarScanner(io.BytesIO(buf), url, base=offset, seekable=False, require_end=False)
    try:
        groups = sample_groups(scanner, lambda suffix: -1)
        found = next(groups, None)
        extra = next(groups, None) if found is not None and found.key == key else None
    except ShardError as exc:
        raise ShardError(f"{exc} (reading sample {key!r}; {hint})") from None
    if found is None:
        raise ShardError(f"sidecar/tar mismatch in shard {url} at byte {offset}: no member of sample {key!r} "
                         f"there; {hint}")
    bad = found if found.key != key else extra
    if bad is not None:
        raise ShardError(
            f"sidecar/tar mismatch in shard {url} at byte {bad.offset}: the sidecar lists sample "
            f"{key!r} but the tar holds sample {bad.key!r} there; {hint}"
        )
    return {"__key__": key, "__url__": url, **found.members}
