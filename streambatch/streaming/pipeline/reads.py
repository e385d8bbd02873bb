"""Byte reads: the bytes of the samples of this process's steps.

Per window, the sidecar tables (keys, offsets, sizes) of the shards its
steps touch are read once (``Catalog.table``, or the remote reader's copy);
per sample, its bytes are read by offset: a local shard with ``os.pread``
(``io/reader.LocalReader``), a remote one from the node-local cache
(``io/remote_reader.RemoteWindowReader``, which also prefetches the window's
pieces when the pass enters it). Which shard is local is the catalog's
(``Catalog.local``), decided once per shard.

Shards of other corpus formats (``shards/corpora/``): Shar and NeMo tars are
read by offset like WebDataset tars (their layout's table, their layout
parses the bytes); Parquet rows are read by their layout's per-pass reader,
row group by row group (``ParquetRows``: told each window which rows this
process needs).

A shard that cannot be read is a ``ShardError``: raised at once with
``on_error="raise"``; with ``"skip"`` each of its samples is passed on as
the error (``samples.py`` counts and drops it), so every rank still takes
the same steps.

Stream: per step, ``Raw`` samples (shard, URL, byte offset, key, tar bytes or a read row) or the ``ShardError``
reading one."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ShardError
from ..io.reader import LocalReader
from ..io.remote_reader import RemoteWindowReader
from ..shards.catalog import Catalog
from .steps import RankWindow


@dataclass(frozen=True)
class Raw:
    """One sample's tar bytes (its members, back to back) and where they are from.
    layout / info: a corpus format's layout, which parses the bytes, and the sample's metadata (its cut or
    manifest entry); None for WebDataset tars. sample: the sample dict itself, when the layout read it
    whole (a Parquet row; ``data`` is then empty)."""

    shard: int
    url: str
    offset: int
    key: str
    data: bytes
    layout: Any = None
    info: Any = None
    sample: dict | None = None


@dataclass(frozen=True)
class Step:
    """One step of this process: its epoch step index and its samples (a
    lazy stream: each stage maps it sample by sample, so a sample is read,
    parsed and decoded before the next one is read)."""

    index: int
    samples: Iterator[Any]


class SampleReads:
    """The byte-read stage of one pass.

    catalog: every shard; remote: the pass's reader of remote shards (None
    when every shard is local); on_error: ``"raise"`` or ``"skip"``.
    """

    def __init__(self, catalog: Catalog, remote: RemoteWindowReader | None, on_error: str):
        self.catalog, self.remote, self.on_error = catalog, remote, on_error
        self.local = LocalReader()
        self._is_local = catalog.local.tolist()
        self._tables: dict[int, Any] = {}  # shard -> (keys, offsets, sizes), or the ShardError reading it
        # layouts that read their samples themselves (Parquet): one reader each for this pass
        own = {id(lay): lay for lay in (catalog.layouts or ()) if lay is not None and not lay.tar}
        self._rows = {k: lay.rows(catalog, remote) for k, lay in own.items()}

    @property
    def bytes_read(self) -> int:
        """Bytes this pass read (tar bytes from files and the cache, and the files of row readers)."""
        rows = sum(r.bytes_read for r in self._rows.values())  # (local files; cached ones count in remote's)
        return self.local.bytes_read + rows + (self.remote.bytes_read if self.remote is not None else 0)

    def steps(self, windows: Iterable[RankWindow], epoch: int) -> Iterator[Step]:
        """The stage: each step of each window, its samples read lazily, in batch order."""
        for rw in windows:
            if self.remote is not None:
                self.remote.enter(epoch, rw.window, rw.next)
            if not rw.steps:
                continue  # planned from lengths only: no tar data read
            self._enter(rw)
            for s, idx in zip(rw.steps, rw.batches):
                yield Step(s, self._samples(rw.window, idx))
        if self.remote is not None:
            self.remote.leave()

    def _enter(self, rw: RankWindow) -> None:
        """Read the tables of the shards this window's steps touch (once), forget the others'."""
        win = rw.window
        if self._rows:  # row readers: this window's (shard, row) reads of this process, one per use
            idx = np.concatenate(rw.batches)
            pairs: dict[int, list[tuple[int, int]]] = {k: [] for k in self._rows}
            for s, r in zip(win.shard_ids[idx].tolist(), win.local[idx].tolist()):
                lay = self.catalog.layouts[s]
                if lay is not None and not lay.tar:
                    pairs[id(lay)].append((s, r))
            for k, reader in self._rows.items():
                reader.enter(pairs[k])
        shards = np.unique(win.shard_ids[np.unique(np.concatenate(rw.batches))]).tolist()
        shards = [s for s in shards if self._reads_tar(s)]
        needed = set(shards)
        for s in [s for s in self._tables if s not in needed]:
            del self._tables[s]
        for s in shards:
            if s not in self._tables:
                try:
                    if self.remote is not None and not self._is_local[s]:
                        self._tables[s] = self.remote.shard_table(s)
                    else:
                        self._tables[s] = self.catalog.table(s)
                except ShardError as exc:
                    if self.on_error == "raise":
                        raise
                    self._tables[s] = exc  # each of the shard's samples is skipped and counted
        self.local.keep_only(self.catalog.urls[s] for s in shards)

    def _reads_tar(self, shard: int) -> bool:
        lay = self.catalog.layout(shard)
        return lay is None or lay.tar

    def _samples(self, win: Any, idx: np.ndarray) -> Iterator[Raw | ShardError]:
        for i in idx.tolist():
            yield self._read(win, i)

    def _read(self, win: Any, i: int) -> Raw | ShardError:
        shard = int(win.shard_ids[i])
        local = int(win.local[i])
        url = self.catalog.urls[shard]
        if not self._reads_tar(shard):  # the layout reads the sample whole (a Parquet row)
            try:
                sample = self._rows[id(self.catalog.layouts[shard])].take(shard, local)
            except ShardError as exc:
                return exc
            return Raw(shard, url, local, sample["__key__"], b"", sample=sample)
        table = self._tables[shard]
        if isinstance(table, ShardError):
            return table  # the shard could not be read: each of its samples is this error (skipped, counted)
        try:
            keys, offsets, sizes = table
            offset, size = int(offsets[local]), int(sizes[local])
            key = keys[local].decode("utf-8", "surrogateescape")
            if self._is_local[shard]:
                buf = self.local.read(url, offset, size)
            else:
                buf = self.remote.read(shard, offset, size)
            layout = getattr(table, "layout", None)  # another corpus format's table parses its own bytes
            return Raw(shard, url, offset, key, buf, layout, table.info[local] if layout is not None else None)
        except ShardError as exc:
            return exc

    def close(self) -> None:
        """Close the local descriptors and the remote reader (a pass that did
        not finish deletes the pieces it knew of: ``RemoteWindowReader.close``)."""
        self.local.close()
        for reader in self._rows.values():
            reader.close()
        if self.remote is not None:
            self.remote.close()
