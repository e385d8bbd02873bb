"""Parquet files (the Hugging Face Hub's format; ``datasets``' ``to_parquet``),
local or remote through fsspec (``s3://``, ``https://``, ``hf://``): one row
per sample, an audio column of ``{bytes, path}`` structs (``datasets``'
``Audio`` feature), and a length column.

Lengths come from one column read alone (``length_from="column:duration"``
with ``frames_per_second`` for seconds; an integer column such as
``num_samples`` is a count as it is): pyarrow reads the footer and that
column's chunks, never the audio. A corpus without a length column plans
with ``length_from="audio"``, which reads every audio header once per open
(the whole audio column: add a duration column instead, see the docs).

Reading: a Parquet file is read by row groups. Each pass, per window, a
DataLoader worker reads each row group that holds one of its samples once,
keeps those rows until they are yielded and drops the rest, so memory holds
at most its samples of one window. A remote file's row groups are downloaded
into the node-local cache (as remote tars' byte ranges are: once per rank,
whatever ``num_workers``, prefetched) and read from there. A rank's samples
lie in about 1/W of the row groups when the read mode is ``"shard"``, the
default for Parquet (a rank trains contiguous rows); ``"sample"`` spreads
every rank over every row group.

A sample is ``{"__key__": "<file name>/<row>" (or ``key_column``),
"__url__": file URL, "<audio column>.<ext>": audio bytes,
"<audio column>.path": its path, <other column>: value}``: ``decode="audio"``
and ``collate_audio`` take it as they take a WebDataset sample.

Stream: a Parquet corpus as a ``Catalog`` (one column's lengths) and its rows, row group by row group, as
sample dicts."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....core.redact import scrub_url
from ....core.units import seconds_to_frames
from ...errors import ShardError
from ...formats.audio import AUDIO_EXTS, audio_ext, audio_info
from ...io.objects import IOStats, is_remote
from ...io.urls import is_local, local_path
from ..catalog import Catalog
from ..lengths import LengthSpec
from .base import CorpusFormat, Layout, OpenSettings, SampleTable, digest, narrow
from .parquet_files import (
    CountingFile,
    SliceFile,
    expand_files,
    group_ranges,
    identity,
    open_file,
    pyarrow_parquet,
    read_footer,
)

# audio containers by their first bytes, for rows whose path gives no suffix
_MAGIC = ((b"RIFF", "wav"), (b"RF64", "wav"), (b"fLaC", "flac"), (b"OggS", "ogg"), (b"ID3", "mp3"),
          (b"\xff\xfb", "mp3"), (b"\xff\xf3", "mp3"), (b"\xff\xf2", "mp3"))


@dataclass(frozen=True)
class Parquet:
    """A Parquet corpus.

    urls: files, brace patterns or globs (``data/train-*.parquet``,
        ``s3://bucket/ds/*.parquet``, ``hf://datasets/ORG/NAME@~parquet/default/train/*.parquet``);
    audio_column: the ``{bytes, path}`` column (default ``"audio"``, else the
        first column of that type; None found: samples without audio);
    key_column: a column holding each row's key (default ``<file name>/<row>``).
    """

    urls: Any
    audio_column: str | None = None
    key_column: str | None = None

    def shard_urls(self, settings: OpenSettings) -> list[str]:
        return expand_files(self.urls, settings.storage_options)

    def open(self, settings: OpenSettings) -> Catalog:
        """The catalog: per file its row groups and the length column; no audio read (but ``length_from="audio"``)."""
        files = self.shard_urls(settings)
        spec = settings.spec("column:duration")
        if spec.source not in ("column", "audio"):
            raise ValueError(f"length_from={spec.describe()!r}: Parquet lengths come from a column "
                             "('column:duration' with frames_per_second, or an integer column such as "
                             "'column:num_frames') or from the audio headers ('audio')")
        with ThreadPoolExecutor(16 if any(is_remote(u) for u in files) else 1) as pool:
            opened = list(pool.map(lambda u: self._open_one(u, spec, settings), files))
        audio = opened[0].audio
        for u, f in zip(files, opened):
            if f.audio != audio:
                raise ValueError(f"Parquet files disagree on the audio column: {scrub_url(files[0])} has {audio!r}, "
                                 f"{scrub_url(u)} has {f.audio!r}; pass audio_column=")
        layout = ParquetLayout({u: f for u, f in zip(files, opened)}, audio, self.key_column,
                               settings.storage_options, settings.retry)
        counts = np.array([f.lengths.size for f in opened], dtype=np.int64)
        lengths = np.concatenate([f.lengths for f in opened]) if opened else np.zeros(0, np.int64)
        remote = [is_remote(u) for u in files]
        # remote files: their size and ETag, checked before training (verify) like remote tars
        sizes = np.array([f.identity["size"] if r else -1 for f, r in zip(opened, remote)], dtype=np.int64)
        etags = tuple((f.identity.get("etag") or "") if r else "" for f, r in zip(opened, remote))
        return Catalog(tuple(files), ("",) * len(files), counts, tuple(f.digest for f in opened), narrow(lengths),
                       np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), sizes, etags,
                       storage_options=settings.storage_options, layouts=(layout,) * len(files))

    def _open_one(self, url: str, spec: LengthSpec, settings: OpenSettings) -> ParquetFileInfo:
        """One file's lengths, row groups, footer and identity."""
        pq = pyarrow_parquet()
        stats = IOStats()
        try:
            ident = identity(url, settings.storage_options, settings.retry)
            # lengths: small reads of one column's chunks, no readahead past them
            with open_file(url, settings.storage_options, settings.retry, stats, ident["size"], 0) as f:
                md = read_footer(f, ident["size"], url)
                pf = pq.ParquetFile(f, metadata=md)  # column chunks read exactly (pyarrow coalesces near ones)
                names = pf.schema_arrow.names
                audio = self.audio_column or find_audio_column(pf.schema_arrow)
                if self.audio_column is not None and self.audio_column not in names:
                    raise ValueError(f"Parquet file {scrub_url(url)} has no column {self.audio_column!r} "
                                     f"(its columns: {names})")
                if self.key_column is not None and self.key_column not in names:
                    raise ValueError(f"Parquet file {scrub_url(url)} has no key column {self.key_column!r} "
                                     f"(its columns: {names})")
                where = f"Parquet file {scrub_url(url)}"
                if spec.source == "column":
                    col = spec.field[0]
                    if col not in names:
                        raise ValueError(f"{where} has no column {col!r} for length_from={spec.describe()!r} (its "
                                         f"columns: {names}); name a length column, or use length_from='audio' "
                                         "to read the audio headers")
                    values = pf.read(columns=[col]).column(0)
                    lengths = column_lengths(values, spec, where)
                else:
                    if audio is None:
                        raise ValueError(f"{where} has no audio column to measure; pass audio_column=")
                    lengths = audio_lengths(pf.read(columns=[audio]).column(0), spec, where)
        except OSError as exc:
            if isinstance(exc, ShardError):
                raise
            raise OSError(f"cannot read Parquet file {scrub_url(url)}: {exc}") from exc
        rows = np.array([md.row_group(g).num_rows for g in range(md.num_row_groups)], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        return ParquetFileInfo(lengths, starts, digest(lengths, starts, md.serialized_size, audio), audio, md, ident,
                               group_ranges(md))


@dataclass(frozen=True)
class ParquetFileInfo:
    """What opening one Parquet file found: lengths (n,) int64, row-group starts (G + 1,) int64 (rows),
    the catalog digest, the audio column, the footer (pyarrow ``FileMetaData``: readers read row groups
    without reading it again), its identity (``identity``) and ranges (G, 2) int64: each row group's bytes."""

    lengths: np.ndarray
    starts: np.ndarray
    digest: str
    audio: str | None
    metadata: Any
    identity: dict[str, Any]
    ranges: np.ndarray


def find_audio_column(schema) -> str | None:
    """``"audio"``, else the first struct column with a binary ``bytes`` field (``datasets``' Audio), else None."""
    import pyarrow as pa  # lazy for start-up: an optional extra

    if "audio" in schema.names:
        return "audio"
    for f in schema:
        if pa.types.is_struct(f.type) and any(c.name == "bytes" and pa.types.is_binary(c.type) or
                                              c.name == "bytes" and pa.types.is_large_binary(c.type) for c in f.type):
            return f.name
    return None


def column_lengths(values, spec: LengthSpec, where: str) -> np.ndarray:
    """(n,) int64 lengths of a numeric column (seconds with ``frames_per_second``, else counts)."""
    import pyarrow as pa  # lazy for start-up: an optional extra

    if values.null_count or not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        # nulls, strings, decimals: value by value, so the first bad row is named
        return np.asarray([spec.to_length(v, f"{where}, row {i}") for i, v in enumerate(values.to_pylist())],
                          dtype=np.int64)
    arr = values.to_numpy(zero_copy_only=False)
    as_float = arr.astype(np.float64)
    bad = ~np.isfinite(as_float) | (as_float < 0)
    if spec.frames_per_second is None:
        bad |= (as_float != np.floor(as_float)) | (as_float >= 2.0**62)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        spec.to_length(arr[i].item(), f"{where}, row {i}")  # raises the one-line ValueError
    if spec.frames_per_second is None:
        return arr.astype(np.int64)
    try:
        return seconds_to_frames(as_float, spec.frames_per_second)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def audio_lengths(values, spec: LengthSpec, where: str) -> np.ndarray:
    """(n,) int64 lengths from each row's audio header (``length_from="audio"``)."""
    out = np.empty(len(values), dtype=np.int64)
    for i, cell in enumerate(values.to_pylist()):
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if not data:
            raise ValueError(f"{where}, row {i}: no audio bytes to measure (length_from='audio')")
        ext = sniff(data, cell.get("path"))
        if ext is None:
            raise ValueError(f"{where}, row {i}: cannot tell the audio format ({', '.join(AUDIO_EXTS)})")
        try:
            frames, rate = audio_info(data, ext, len(data))
        except Exception as exc:  # parsers and soundfile on untrusted bytes
            raise ValueError(f"{where}, row {i}: cannot read the audio header: {exc}") from None
        value = frames if spec.frames_per_second is None else frames / rate
        out[i] = spec.to_length(value, f"{where}, row {i}")
    return out


def sniff(data: bytes, path: Any = None) -> str | None:
    """The audio format of one cell: its path's suffix, else its first bytes."""
    if isinstance(path, str) and audio_ext(path) is not None:
        return audio_ext(path)
    return next((ext for magic, ext in _MAGIC if data.startswith(magic)), None)


class ParquetLayout(Layout):
    """Reads Parquet rows, row group by row group (``rows``)."""

    tar = False
    name = "parquet"

    def __init__(self, files: dict[str, ParquetFileInfo], audio_column: str | None, key_column: str | None,
                 storage_options: dict | None, retry):
        self.files, self.audio_column, self.key_column = files, audio_column, key_column
        self.storage_options, self.retry = storage_options, retry

    def rows(self, catalog: Catalog, remote: Any = None) -> ParquetRows:
        return ParquetRows(catalog, self, remote)

    def table(self, catalog: Catalog, shard: int, copy: str | None = None) -> SampleTable:
        """Per row, the byte range of its row group: what the node-local cache downloads for a remote file
        (one piece per run of row groups a rank's workers need, shared by them), read back whole by ``rows``."""
        info = self.files[catalog.urls[shard]]
        group = np.repeat(np.arange(info.ranges.shape[0]), np.diff(info.starts))
        keys = np.array([str(i).encode() for i in range(int(info.starts[-1]))], dtype=bytes)
        start = info.ranges[group, 0]
        return SampleTable(keys, start, info.ranges[group, 1] - start, self)

    def to_sample(self, url: str, row: int, record: dict[str, Any]) -> dict[str, Any]:
        """One row as a sample dict (the audio column under ``<column>.<ext>``)."""
        name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        key = str(record[self.key_column]) if self.key_column else f"{name}/{row}"
        out: dict[str, Any] = {"__key__": key, "__url__": url}
        for col, value in record.items():
            if col == self.audio_column and isinstance(value, dict):
                data, path = value.get("bytes"), value.get("path")
                if data:
                    out[f"{col}.{sniff(data, path) or 'bin'}"] = data
                out[f"{col}.path"] = path
            else:
                out[col] = value
        return out


class ParquetRows:
    """One pass's reader of Parquet samples (one per DataLoader worker).

    ``enter(pairs)``: a window's (shard, row) pairs this worker yields, one per
    use; ``take(shard, row)`` returns a row's sample dict, reading its row
    group (and keeping the other rows of it this worker needs in the window)
    the first time one of them is asked for. ``bytes_read``: file bytes read.
    remote: the pass's ``RemoteWindowReader``: a remote file's row groups come
    from the node-local cache it fills (downloaded once for the rank's workers,
    prefetched), each read whole once per window by each worker needing it."""

    def __init__(self, catalog: Catalog, layout: ParquetLayout, remote: Any = None):
        self.catalog, self.layout, self.remote = catalog, layout, remote
        self.stats = IOStats()
        self._files: dict[int, tuple[Any, Any]] = {}  # shard -> (open file, ParquetFile)
        self._local_bytes = 0
        self._uses: Counter = Counter()  # (shard, row) -> takes left in this window
        self._rows: dict[tuple[int, int], dict[str, Any]] = {}  # rows read, waiting for their takes
        self._group_rows: dict[tuple[int, int], list[int]] = {}  # (shard, group) -> rows this worker needs

    @property
    def bytes_read(self) -> int:
        return self._local_bytes + sum(f.bytes for f, _ in self._files.values() if isinstance(f, CountingFile)) \
            + self.stats.bytes

    def enter(self, pairs: list[tuple[int, int]]) -> None:
        """Start a window: forget what the last one left, and note what this one needs."""
        self._uses = Counter(pairs)
        self._rows.clear()
        self._group_rows = {}
        for shard, row in self._uses:
            g = self._group(shard, row)
            self._group_rows.setdefault((shard, g), []).append(row)
        for shard in [s for s in self._files if not any(s == k[0] for k in self._group_rows)]:
            self._close(shard)

    def _group(self, shard: int, row: int) -> int:
        starts = self.layout.files[self.catalog.urls[shard]].starts
        return int(np.searchsorted(starts, row, side="right") - 1)

    def take(self, shard: int, row: int) -> dict[str, Any]:
        key = (shard, row)
        if key not in self._rows:
            self._load(shard, self._group(shard, row))
        sample = self._rows[key]
        self._uses[key] -= 1
        if self._uses[key] <= 0:
            del self._rows[key]
            del self._uses[key]
        return sample

    def _file(self, shard: int):
        if shard not in self._files:
            url = self.catalog.urls[shard]
            info = self.layout.files[url]
            if not is_remote(url):  # (remote files: size and ETag checked before training)
                now = identity(url, None, None)
                if now != info.identity:
                    raise ShardError(f"Parquet file {url} changed since this job opened it ({info.identity} -> "
                                     f"{now}); restart the job on files that are not being rewritten")
            # row groups only: the footer read at open is reused (no GET for it per worker and window)
            f = open_file(url, self.layout.storage_options, self.layout.retry, self.stats, info.identity["size"],
                          readahead=0)
            self._files[shard] = (f, pyarrow_parquet().ParquetFile(f, metadata=info.metadata))
        return self._files[shard]

    def _load(self, shard: int, group: int) -> None:
        url = self.catalog.urls[shard]
        info = self.layout.files[url]
        try:
            if self.remote is not None and not self.catalog.local[shard]:  # from the cache: no GET of our own
                lo, hi = (int(x) for x in info.ranges[group])
                data = self.remote.read(shard, lo, hi - lo)
                piece = SliceFile(data, lo, info.identity["size"], url)
                pf = pyarrow_parquet().ParquetFile(piece, metadata=info.metadata)
            else:
                _, pf = self._file(shard)
            table = pf.read_row_group(group)
        except ShardError:
            raise
        except Exception as exc:  # pyarrow and the store: one file's failure, skipped with on_error="skip"
            raise ShardError(f"cannot read row group {group} of Parquet file {url}: {exc}") from exc
        wanted = self._group_rows.get((shard, group), [])
        first = int(self.layout.files[url].starts[group])
        idx = [r - first for r in wanted]
        for r, record in zip(wanted, table.take(idx).to_pylist() if idx else []):
            self._rows[(shard, r)] = self.layout.to_sample(url, r, record)

    def _close(self, shard: int) -> None:
        f, _ = self._files.pop(shard)
        if isinstance(f, CountingFile):
            self._local_bytes += f.bytes
        f.close()

    def close(self) -> None:
        for shard in list(self._files):
            self._close(shard)
        self._rows.clear()


def claims(given: Any) -> bool:
    """Parquet files or patterns (``.parquet``), or a local directory holding Parquet files only."""
    if isinstance(given, (list, tuple)):
        return bool(given) and all(claims(g) for g in given)
    if not isinstance(given, (str, os.PathLike)):
        return False
    text = os.fspath(given).split("?", 1)[0]
    if text.endswith(".parquet") or ".parquet}" in text:
        return True
    if is_local(text) and os.path.isdir(local_path(text)):
        names = [n for n in os.listdir(local_path(text)) if not n.startswith(".")]
        return bool(names) and all(n.endswith(".parquet") for n in names)
    return False


def build(given: Any) -> Parquet:
    text = os.fspath(given) if isinstance(given, os.PathLike) else given
    if isinstance(text, str) and is_local(text) and os.path.isdir(local_path(text)):
        return Parquet(os.path.join(local_path(text), "*.parquet"))
    return Parquet(text)


FORMAT = CorpusFormat("parquet", Parquet, claims, "Parquet: one row per sample, an audio column, a length column",
                      build=build, tar=False)
