"""The catalog stage of ``StreamingBatches``: the shard lists it was given,
expanded once, and the catalog opened from them.

``urls`` is one shard list (a brace pattern, a path, a list of them, or a
``*.catalog.npz`` file; or a corpus of another format: ``corpora/``) or a
mix of ``Source`` entries, each with its own list. A list is expanded
(``io/urls.expand_urls``) the first time its URLs are needed, and a catalog
file read the first time (one request), and kept:
choosing the read mode, indexing missing shards across ranks and opening the
catalog all use the same expansion.

Stream: nothing: the shard lists, whether they are all local, and the opened ``Catalog``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...core.long_samples import too_long, warn_over_budget
from ...core.redact import scrub_url
from ...core.types import IntLike, LengthFrom
from ..io.remote_io import RemoteOptions
from ..io.urls import expand_urls, is_local
from .catalog import Catalog, from_contents, open_urls
from .catalog_file import is_catalog, read_catalog
from .corpora import OpenSettings, WebDataset, resolve
from .indexer import index_shards
from .sources import Source, SourceCatalog, is_sources, mix_sources, source_label


@dataclass(frozen=True)
class IndexOptions:
    """How sidecars are checked and missing ones made (``StreamingBatches``'
    indexing keywords): index_missing (index local shards that have none),
    length_from / frames_per_second (how lengths are computed when indexing;
    if given, sidecars made another way are stale), workers (index_workers),
    verify ("stat" or "full": the check of each shard against its sidecar).
    Where the sidecars are (``index_dir``) belongs to each shard list: a
    ``Source`` may name its own."""

    index_missing: bool = False
    length_from: LengthFrom | None = None
    frames_per_second: float | None = None
    workers: IntLike | None = 1
    verify: str = "stat"


class ShardList:
    """One shard list as given, its URLs expanded at first need and kept.

    The ``remote`` settings each method takes say how a catalog file (and
    remote sidecars) are read: remote, one GET under ``remote.retry``; a
    catalog's entries checked against ``remote.trust`` (``catalog_trust.py``).
    """

    def __init__(self, given: Any, index_dir: str | None, format: str | None = None):
        # the corpus format: named, or detected from what was given (corpora/__init__.resolve)
        self.format, self.spec = resolve(given, format)
        self.webdataset = self.format.name == "webdataset"  # WebDataset tars: sidecars, catalog files, indexing
        self.given = self.spec.urls if isinstance(self.spec, WebDataset) else given
        self.index_dir = index_dir
        self._urls: list[str] | None = None
        self._contents: dict[str, Any] | None = None

    @property
    def catalog_file(self) -> str | None:
        """The path of the catalog file this list is, or None."""
        return os.fspath(self.given) if self.webdataset and is_catalog(self.given) else None

    def settings(self, index: IndexOptions, remote: RemoteOptions) -> OpenSettings:
        """How a corpus of another format opens (``corpora/base.OpenSettings``)."""
        return OpenSettings(index.length_from, index.frames_per_second, remote.storage_options, remote.retry,
                            self.index_dir)

    def by_offset(self, remote: RemoteOptions) -> bool:
        """Every shard is a local file read by sample offsets (the default read mode is then ``"sample"``);
        a Parquet corpus reads row groups, which ranks share only in shard mode."""
        return self.format.tar and all(is_local(u) for u in self.urls(remote))

    def contents(self, remote: RemoteOptions) -> dict[str, Any]:
        """A catalog file's contents (``catalog_file.read_catalog``), read once."""
        if self._contents is None:
            self._contents = read_catalog(self.catalog_file, remote.storage_options, trust=remote.trust,
                                          retry=remote.retry)
        return self._contents

    def urls(self, remote: RemoteOptions) -> list[str]:
        """The shard URLs, in the order given."""
        if self._urls is None:
            if not self.webdataset:
                self._urls = self.spec.shard_urls(OpenSettings(storage_options=remote.storage_options,
                                                               retry=remote.retry))
            elif self.catalog_file:
                self._urls = list(self.contents(remote)["urls"])
            else:
                self._urls = expand_urls(self.given)
        return self._urls

    def open(self, index: IndexOptions, remote: RemoteOptions) -> Catalog:
        """This list's catalog: from the catalog file, or from each shard's sidecar; a corpus of another
        format from its own metadata (``corpora/``)."""
        if not self.webdataset:
            return self.spec.open(self.settings(index, remote))
        if self.catalog_file:
            return from_contents(self.catalog_file, self.contents(remote), index.length_from,
                                 index.frames_per_second, remote.storage_options)
        return open_urls(self.urls(remote), index_dir=self.index_dir, index_missing=index.index_missing,
                         length_from=index.length_from, frames_per_second=index.frames_per_second,
                         index_workers=index.workers, url_hint=self.given if isinstance(self.given, str) else None,
                         verify=index.verify, storage_options=remote.storage_options, retry=remote.retry)

    def index_share(self, rank: int, world_size: int, index: IndexOptions, remote: RemoteOptions) -> None:
        """With ``index_missing`` under torch.distributed: index 1/W of this
        list's local shards (shard i if i % W == rank; those with a current
        sidecar are skipped). A catalog file needs no indexing."""
        if self.catalog_file or not self.webdataset:
            return
        mine = [u for i, u in enumerate(self.urls(remote)) if i % world_size == rank and is_local(u)]
        if mine:
            index_shards(mine, length_from=index.length_from or "json:duration",
                         frames_per_second=index.frames_per_second, index_dir=self.index_dir, workers=index.workers,
                         progress=False)


class ShardLists:
    """What ``StreamingBatches(urls, ...)`` reads: one shard list, or a mix.

    urls: as ``StreamingBatches`` takes it; samples_per_epoch: a mix's (None:
    the sum of the sources' samples); index_dir: where sidecars are (a
    source's own ``index_dir`` first).
    """

    def __init__(self, urls: Any, *, samples_per_epoch: IntLike | None = None, index_dir: str | None = None,
                 format: str | None = None):
        self.mixed = is_sources(urls)
        if samples_per_epoch is not None and not self.mixed:
            raise ValueError("samples_per_epoch applies to a mix of Source(...) entries; with one shard list "
                             "every sample is trained once per epoch")
        self.samples_per_epoch = samples_per_epoch
        self.sources: list[Source] = ([urls] if isinstance(urls, Source) else list(urls)) if self.mixed else []
        given = ([(s.urls, s.index_dir or index_dir, s.format or format) for s in self.sources] if self.mixed
                 else [(urls, index_dir, format)])
        self.lists = [ShardList(u, d, f) for u, d, f in given]

    def all_local(self, remote: RemoteOptions) -> bool:
        """Every shard of every list is a local file read by offset (``ShardList.by_offset``)."""
        return all(lst.by_offset(remote) for lst in self.lists)

    def index_shares(self, rank: int, world_size: int, index: IndexOptions, remote: RemoteOptions) -> None:
        """With ``index_missing`` under torch.distributed: each rank indexes
        its share of every list's missing local shards, then all meet at one
        barrier (also when indexing failed: the caller carries the failure to
        every rank)."""
        try:
            for lst in self.lists:
                lst.index_share(rank, world_size, index, remote)
        finally:
            torch.distributed.barrier()

    def open(self, index: IndexOptions, remote: RemoteOptions) -> tuple[SourceCatalog | None, Catalog]:
        """(the mix of sources or None, the catalog of every shard) from the
        sidecars or catalog files. A source's errors name the source."""
        if not self.mixed:
            return None, self.lists[0].open(index, remote)
        cats = []
        for i, lst in enumerate(self.lists):
            try:
                cats.append(lst.open(index, remote))
            except (OSError, ValueError, TypeError) as exc:
                raise type(exc)(f"{source_label(self.sources, i)}: {exc}") from exc
        sources = mix_sources(self.sources, cats, self.samples_per_epoch)
        return sources, sources.catalog


def check_samples(catalog: Catalog, max_length: int | None, long_samples: str, budget: int | None = None) -> None:
    """Refuse an empty catalog, and with ``long_samples="raise"`` one holding a sample over ``max_length``
    or (``budget`` given) over the budget; otherwise one ``LongSampleWarning`` when samples (within
    ``max_length``) are longer than the budget: planned alone (``"warn"``) or left out (``"drop"``)."""
    if catalog.num_samples == 0:
        raise ValueError(f"the {len(catalog.urls)} shards hold no samples; check the shard list")
    if long_samples == "raise":
        for i, url in enumerate(catalog.urls):
            too_long(catalog.lengths(i), max_length, long_samples, where=f" of shard {scrub_url(url)}",
                     budget=budget)
    elif budget is not None:
        every = getattr(catalog, "all_lengths", None)  # every shard's lengths in one array (a Catalog's)
        if every is None:
            every = np.concatenate([catalog.lengths(i) for i in range(len(catalog.urls))])
        every = np.asarray(every, dtype=np.int64)
        big = every[every > budget]
        if max_length is not None:  # those over max_length are left out anyway, and logged as such
            big = big[big <= max_length]
        warn_over_budget(big, budget, long_samples, "StreamingBatches: ", stacklevel=4)

