"""Remote-shard settings of a ``StreamingBatches`` (``RemoteOptions``), the
per-pass reader they make (``RemoteIO``: the glue between the dataset and
``cache.py``), and the check, before training, that remote shards are still
the objects that were indexed (``check_identity``).

Stream: nothing: the remote settings of a dataset and its identity checks."""

from __future__ import annotations

import atexit
import logging
import numbers
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ...core.redact import scrub_options, scrub_url
from ..errors import ShardError
from .cache import ShardCache, ShardRef
from .disk import cache_estimate, check_cache_dir, run_dir, sweep_dead_runs
from .objects import call, filesystem, is_remote, object_identity
from .remote import RemoteShard
from .remote_reader import RemoteWindowReader
from .retry import RetryPolicy, as_policy

log = logging.getLogger("streambatch.streaming")


def _check_count(name: str, value: Any, low: int, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an integer >= {low}{extra}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RemoteOptions:
    """The remote-storage settings of a ``StreamingBatches`` (its keywords of the same names), checked.

    storage_options: passed to fsspec for every remote URL (endpoint,
        credentials, anonymous access); never logged.
    cache_dir: root of the node-local shard cache (default: under the
        system temp dir); each rank of each run gets its own subdirectory,
        removed when the process that built the dataset exits. Must be a
        local disk with room for two windows of this rank's shards plus the
        prefetched ones: checked at construction (``CacheError`` if it cannot
        be created or written, a warning if it has less room than that
        estimate); a disk that fills while reading raises ``CacheError``
        (never skipped, never retried), after prefetch has held back.
    prefetch_shards / prefetch_bytes: download at most this many shards
        (bytes) ahead of the reader, per DataLoader worker.
    retry: the ``RetryPolicy`` (given as a policy, or an int: the number of
        retries); its timeout bounds every request, catalog reads included.
    trust: what a catalog file's entries may be (``shards/catalog_trust.py``).
    """

    storage_options: dict | None = None
    cache_dir: str | None = None
    prefetch_shards: int = 4
    prefetch_bytes: int | None = None
    retry: RetryPolicy = RetryPolicy()
    trust: bool | frozenset[str] = False

    @classmethod
    def build(cls, storage_options: Any = None, cache_dir: Any = None, prefetch_shards: Any = 4,
              prefetch_bytes: Any = None, retry: Any = None, trust: bool | frozenset[str] = False) -> RemoteOptions:
        """Check every setting (TypeError/ValueError naming the bad one)."""
        policy = as_policy(retry)
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options must be a dict of fsspec options or None, got "
                            f"{type(storage_options).__name__}")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a directory path or None, got {type(cache_dir).__name__}")
        return cls(storage_options, os.fspath(cache_dir) if cache_dir is not None else None,
                   _check_count("prefetch_shards", prefetch_shards, 1),
                   _check_count("prefetch_bytes", prefetch_bytes, 1, allow_none=True), policy, trust)

    def __repr__(self) -> str:
        return (f"RemoteOptions(storage_options={scrub_options(self.storage_options)!r}, cache_dir={self.cache_dir!r}, "
                f"prefetch_shards={self.prefetch_shards}, prefetch_bytes={self.prefetch_bytes}, retry={self.retry}, "
                f"trust={self.trust!r})")


class RemoteIO:
    """How a dataset reads its remote shards; picklable, so DataLoader
    workers get a copy and each builds its own reader (``reader``)."""

    def __init__(self, remote: bool, directory: str | None, storage_options: dict | None, retry: RetryPolicy,
                 prefetch_shards: int, prefetch_bytes: int | None, threads: int = 2):
        self.remote = remote
        self.directory = directory
        self.storage_options = storage_options
        self.retry = retry
        self.prefetch_shards = prefetch_shards
        self.prefetch_bytes = prefetch_bytes
        self.threads = threads

    @classmethod
    def for_catalog(cls, catalog, rank: int, options: RemoteOptions, world_size: int = 1,
                    window_samples: int | None = None, rank_share: bool = True) -> RemoteIO:
        """The remote reading of ``catalog``'s shards for ``rank``; its cache
        directory is created and checked here (``disk.check_cache_dir``),
        sized with ``world_size`` / ``window_samples`` / ``rank_share`` (each
        rank streams only its share of a window: shard mode)."""
        o = options
        remote = not bool(catalog.local.all())
        directory = None
        if remote:
            sweep_dead_runs(o.cache_dir)
            directory = run_dir(o.cache_dir, os.getpid(), rank)
            need = cache_estimate(catalog, world_size, window_samples, rank_share, o.prefetch_shards,
                                  o.prefetch_bytes)
            check_cache_dir(directory, o.cache_dir, need, o.prefetch_shards)
            atexit.register(_remove_tree, directory, os.getpid())
        return cls(remote, directory, o.storage_options, o.retry, o.prefetch_shards, o.prefetch_bytes)

    def reader(self, catalog, rank: int, worker: int, stride: int, start: int) -> RemoteWindowReader | None:
        """A reader for one pass of one process, or None when every shard is local."""
        if not self.remote:
            return None
        cache = ShardCache(self.directory, self.storage_options, retry=self.retry,
                           prefetch_shards=self.prefetch_shards, prefetch_bytes=self.prefetch_bytes,
                           threads=self.threads, peers=stride)
        sizes = getattr(catalog, "sizes", None)
        etags = getattr(catalog, "etags", None)

        def ref(s: int) -> ShardRef:
            size = int(sizes[s]) if sizes is not None and sizes[s] >= 0 else None
            return ShardRef(catalog.urls[s], size, etags[s] if etags is not None and etags[s] else None)

        remote = (~catalog.local).tolist()

        def table(s: int, cache: ShardCache):
            # A sidecar in object storage is downloaded once per rank (first worker, under the cache's
            # lock) instead of once per worker and window; the rank's workers share the copy.
            if not is_remote(catalog.sidecars[s]):
                return catalog.table(s)
            sidecar = ShardRef(catalog.sidecars[s])
            cache.sidecars.add(sidecar)
            return catalog.table(s, copy=cache.fetch(sidecar, hold=False))

        return RemoteWindowReader(cache, ref, table, remote.__getitem__, rank, worker, stride, start)

    def __repr__(self) -> str:
        return (f"RemoteIO(cache={self.directory!r}, storage_options={scrub_options(self.storage_options)!r}, "
                f"prefetch_shards={self.prefetch_shards}, prefetch_bytes={self.prefetch_bytes}, retry={self.retry})")


def _remove_tree(path: str, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that inherited the handler
        shutil.rmtree(path, ignore_errors=True)


def check_identity(catalog, rank: int, world_size: int, storage_options: dict | None = None,
                   retry: RetryPolicy | None = None, threads: int = 16) -> None:
    """Before training: compare the size and ETag recorded at indexing with
    the objects' current ones, for this rank's share (shard k with k % W ==
    rank) of the remote shards; raise ShardError naming the stale ones (or
    the unreadable ones: a server that does not answer within
    ``retry.timeout`` fails here, within about timeout x (retries + 1)).

    Shards sharing a directory are checked with one listing where the
    backend lists sizes (S3, GCS: 1,000 objects per request), else with one
    metadata request each, in ``threads`` threads.
    """
    sizes = getattr(catalog, "sizes", None)
    if sizes is None:
        return
    retry = retry or RetryPolicy()
    etags = catalog.etags or ("",) * len(catalog.urls)
    mine = [k for k in range(rank, len(catalog.urls), world_size)
            if is_remote(catalog.urls[k]) and sizes[k] >= 0]
    if not mine:
        return
    by_dir: dict[str, list[int]] = {}
    for k in mine:
        by_dir.setdefault(catalog.urls[k].split("?", 1)[0].rsplit("/", 1)[0], []).append(k)
    found: dict[int, tuple[int | None, str | None]] = {}
    for directory, ks in by_dir.items():
        if len(ks) < 32:
            continue
        try:
            fs, path = filesystem(directory, storage_options)
            # one try, bounded (a timeout per 1,000 shards: a page each on S3/GCS); a listing that fails
            # or hangs falls back to one request per shard
            listing = {e["name"].rstrip("/").rsplit("/", 1)[-1]: object_identity(e)
                       for e in call(fs, "ls", path, detail=True, timeout=retry.timeout * -(-len(ks) // 1000))}
        except Exception:  # no listing here (e.g. plain HTTP): fall back to one request per shard
            continue
        for k in ks:
            got = listing.get(catalog.urls[k].split("?", 1)[0].rsplit("/", 1)[-1])
            if got is not None and got[0] is not None:
                found[k] = got

    unreadable: dict[int, str] = {}

    def info(k: int):
        try:
            return k, RemoteShard(catalog.urls[k], storage_options, retry=retry).info()
        except ShardError as exc:
            unreadable[k] = str(exc)
            return k, (None, None)

    rest = [k for k in mine if k not in found]
    if rest:
        with ThreadPoolExecutor(min(threads, len(rest))) as pool:
            found.update(dict(pool.map(info, rest)))
    if unreadable:  # not stale, maybe: re-indexing is not the fix
        first = unreadable[min(unreadable)]
        raise ShardError(f"{len(unreadable)} of this rank's {len(mine)} remote shards cannot be read before "
                         f"training (first: {first})")
    stale = []
    for k in mine:
        size, etag = found[k]
        if size != sizes[k] or (etag and etags[k] and etag != etags[k]):
            stale.append(f"{scrub_url(catalog.urls[k])} ({size} bytes, ETag {etag}; indexed: {sizes[k]} "
                         f"bytes, ETag {etags[k] or '?'})")
    if stale:
        raise ShardError(f"{len(stale)} shards changed since they were indexed (first: {stale[0]}); re-index "
                         "them with `streambatch index --force` before training")
