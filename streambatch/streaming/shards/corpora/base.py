"""What a corpus format provides, and the pieces the formats share.

A format (``CorpusFormat``, one per module of this package, registered in
``__init__.py``) turns what the user passed (a directory, a manifest, a
pattern, or the format's own spec object) into a spec, and the spec into:

- ``urls(settings)``: its shards' URLs (cheap: a listing or a manifest read,
  no shard opened), which the read mode and the cache sizing look at;
- ``open(settings)``: a ``Catalog`` (``shards/catalog.py``) with every
  sample's planning length, taken from the format's own metadata (Shar cuts,
  NeMo manifests, a Parquet column) without reading audio, and per shard a
  ``Layout``: how the shard's samples are read.

A ``Layout`` with ``tar = True`` describes samples that are byte ranges of a
tar shard: ``table`` gives (keys, offsets, sizes) like a WebDataset sidecar
(so local files are read by offset and remote ones through the node-local
cache, exactly as WebDataset tars) and ``sample`` turns one sample's tar bytes
into a sample dict. A layout with ``tar = False`` reads its samples itself
(``rows``: Parquet row groups); its ``table`` gives the byte range each sample
needs (its row group's), which the node-local cache downloads for remote files.

Stream: nothing: the format interface, a sample table, and shared helpers
(tar member scans, whole small objects, directory listings)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ....core.redact import scrub
from ....core.units import seconds_to_frames
from ...errors import ShardError
from ...formats.tar import TarEntry, TarScanner
from ...io.objects import filesystem, is_remote
from ...io.ranged import open_ranged, read_npz_bytes, remote_stat
from ...io.reader import open_regular, open_shard
from ...io.retry import RetryPolicy
from ...io.urls import is_local, local_path
from ..lengths import LengthSpec, length_spec


@dataclass(frozen=True)
class OpenSettings:
    """How a format opens its corpus (``StreamingBatches``' keywords of the same names).

    length_from / frames_per_second: the ``LengthSpec`` (None: the format's default);
    storage_options / retry: remote reads; index_dir: where streambatch's own files for
    the corpus are (only a format that lacks what the planner needs writes any)."""

    length_from: Any = None
    frames_per_second: float | None = None
    storage_options: dict | None = None
    retry: RetryPolicy | None = None
    index_dir: str | None = None

    def spec(self, default: str) -> LengthSpec:
        """The length source: the caller's, else the format's ``default``."""
        return length_spec(self.length_from if self.length_from is not None else default, self.frames_per_second)


class SampleTable(tuple):
    """(keys (n,) bytes, offsets (n,) int64, sizes (n,) int64) of one tar shard,
    as a WebDataset sidecar gives them (so readers unpack it the same way),
    plus ``layout`` (who parses a sample's bytes) and ``info`` (per sample,
    the format's metadata, e.g. its cut or manifest entry, or None)."""

    layout: Any
    info: list[Any] | None

    def __new__(cls, keys: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, layout: Any,
                info: list[Any] | None = None) -> SampleTable:
        self = super().__new__(cls, (keys, offsets, sizes))
        self.layout, self.info = layout, info
        return self


class Layout:
    """How one corpus' shards are read (attached per shard to the ``Catalog``;
    picklable: DataLoader workers get a copy).

    tar: True when samples are byte ranges of tar shards (``table`` and
    ``sample``); False when the layout reads samples itself (``rows``)."""

    tar = True
    name = "?"

    def table(self, catalog: Any, shard: int, copy: str | None = None) -> SampleTable:
        raise NotImplementedError

    def sample(self, url: str, offset: int, key: str, data: bytes, info: Any) -> dict[str, Any]:
        """The sample dict held by ``data``, the tar bytes of one sample read at ``offset`` of ``url``."""
        raise NotImplementedError

    def rows(self, catalog: Any, remote: Any = None) -> Any:
        """A per-pass reader of this layout's samples (``tar = False`` only); ``remote``: the pass's
        ``RemoteWindowReader`` (the node-local cache of remote shards, planned from ``table``), or None."""
        raise NotImplementedError


@dataclass(frozen=True)
class CorpusFormat:
    """One registered corpus format.

    name: what ``format=`` names it; spec: the class of its spec objects
    (``Shar(...)``, ...), built from a string by ``spec(given)``; claims(given):
    True when a string or list the user passed is this format's (a local
    directory holding its files, a file suffix); summary: one line for docs
    and errors; tar: whether its samples are tar members read by offset.
    """

    name: str
    spec: type
    claims: Callable[[Any], bool]
    summary: str
    build: Callable[[Any], Any] | None = field(default=None, repr=False)
    tar: bool = True  # samples are tar members read by offset (False: the layout reads them, e.g. row groups)

    def make(self, given: Any) -> Any:
        """``given`` as this format's spec object."""
        if isinstance(given, self.spec):
            return given
        return self.build(given) if self.build is not None else self.spec(given)


# ---------------------------------------------------------------- shared helpers


def read_object(url: str, storage_options: dict | None = None, retry: RetryPolicy | None = None,
                what: str = "file") -> bytes:
    """A whole small file (a cuts file, a manifest): local, or one GET under ``retry``. A local one must be a
    regular file (a ShardError naming ``what`` otherwise: a FIFO would block, /dev/zero never end)."""
    if is_remote(url):
        return read_npz_bytes(url, storage_options, retry)
    with os.fdopen(open_regular(url, what), "rb") as f:
        return f.read()


def json_lines(data: bytes, where: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, one per non-blank line; a line
    that is not a JSON object is a ValueError naming ``where`` and the line."""
    for n, line in enumerate(io.BytesIO(data), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}, line {n}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}, line {n}: a JSON {type(obj).__name__}, not an object")
        yield obj


def field_of(record: dict[str, Any], keys: tuple[str, ...], where: str) -> Any:
    """``record[keys[0]][keys[1]]...``, or a ValueError naming ``where`` and the field."""
    value: Any = record
    try:
        for part in keys:
            value = value[part]
    except (KeyError, TypeError, IndexError):
        have = sorted(record)[:12]
        name = ".".join(keys)
        raise ValueError(f"{where}: no field {name!r} (its fields: {have}); choose another length_from") from None
    return value


def lengths_of(records: Iterable[dict[str, Any]], spec: LengthSpec, where: Callable[[int], str]) -> np.ndarray:
    """(n,) int64 planning lengths of JSON records (``spec``: ``json:FIELD``)."""
    if spec.source != "json":
        raise ValueError(f"length_from={spec.describe()!r}: this format's lengths come from its metadata; use "
                         "'json:FIELD' (e.g. 'json:duration' with frames_per_second)")
    values = [field_of(r, spec.field, where(i)) for i, r in enumerate(records)]
    return values_to_lengths(values, spec, where)


def values_to_lengths(values: list[Any], spec: LengthSpec, where: Callable[[int], str]) -> np.ndarray:
    """(n,) int64 lengths of metadata values: seconds with ``frames_per_second`` (``seconds_to_frames``),
    else counts; checked in numpy, and the first bad value reported as ``LengthSpec.to_length`` reports it."""
    if not all(type(v) in (int, float) for v in values):  # bools, strings, None: value by value, named
        return np.asarray([spec.to_length(v, where(i)) for i, v in enumerate(values)], dtype=np.int64)
    as_float = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(as_float) | (as_float < 0)
    if spec.frames_per_second is None:
        bad |= (as_float != np.floor(as_float)) | (as_float >= 2.0**62)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        spec.to_length(values[i], where(i))  # raises the one-line ValueError
    if spec.frames_per_second is None:
        return np.asarray(values, dtype=np.int64)
    try:
        return seconds_to_frames(as_float, spec.frames_per_second)
    except ValueError as exc:
        raise ValueError(f"{scrub(where(0).rsplit(',', 1)[0])}: {exc}") from None


def json_bytes(obj: Any) -> bytes:
    """``obj`` as UTF-8 JSON (a sample's metadata member)."""
    return json.dumps(obj, ensure_ascii=False).encode()


def narrow(lengths: np.ndarray) -> np.ndarray:
    """Lengths in the narrowest unsigned type that holds them (as the catalog keeps them)."""
    top = int(lengths.max()) if lengths.size else 0
    for dtype in (np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return lengths.astype(dtype)
    return lengths.astype(np.int64)


def digest(*parts: Any) -> str:
    """A short content hash of arrays and strings (a shard's catalog digest)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(np.ascontiguousarray(p).tobytes() if isinstance(p, np.ndarray) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def scan_members(url: str, storage_options: dict | None = None, retry: RetryPolicy | None = None) -> list[TarEntry]:
    """Every regular member of a tar shard, from its headers alone: a local
    file by seeking from header to header, a remote one through small ranged
    reads (about one GET per member), never the member data."""
    if is_remote(url):
        stat = remote_stat(url, storage_options, retry)
        f = open_ranged(url, stat["size"], storage_options, retry=retry)
    else:
        f = open_shard(url, seekable=is_local(url))
    try:
        return [e for e in TarScanner(f, url) if e.regular]
    except OSError as exc:
        raise ShardError(f"cannot read the member headers of shard {url}: {exc}") from None
    finally:
        f.close()


def tar_members(data: bytes, url: str, offset: int, key: str) -> list[tuple[str, bytes]]:
    """(name, bytes) of the tar members in ``data``, one sample's tar bytes read at ``offset`` of ``url``."""
    scanner = TarScanner(io.BytesIO(data), url, base=offset, seekable=False, require_end=False)
    out = []
    try:
        for entry in scanner:
            if entry.regular:
                out.append((entry.name, scanner.read_data(None)))
    except ShardError as exc:
        raise ShardError(f"{exc} (reading sample {key!r})") from None
    return out


def list_dir(url: str, storage_options: dict | None = None) -> list[str]:
    """The file URLs directly inside directory ``url`` (local, or an fsspec listing), sorted."""
    if not is_remote(url):
        path = local_path(url)
        return sorted(os.path.join(path, n) for n in os.listdir(path))
    fs, path = filesystem(url, storage_options)
    scheme = url.split("://", 1)[0]
    names = fs.ls(path, detail=False)
    return sorted(n if "://" in n else f"{scheme}://{n.lstrip('/')}" for n in names)


def check_counts(url: str, have: int, want: int, what: str) -> None:
    """A shard whose member count no longer matches its metadata has changed since the catalog was opened."""
    if have != want:
        raise ShardError(f"shard {url} holds {have} samples but its {what} lists {want}: the shard or its "
                         f"{what} changed since this job opened them (or they do not belong together); restart "
                         "the job on files that are not being rewritten")
