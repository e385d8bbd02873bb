"""A node-local cache of whole remote shards (or byte ranges of them:
pieces), shared by one rank's DataLoader workers, with background prefetch.

Why whole pieces on local disk: the plan does not depend on ``num_workers``
(worker w of N yields the rank's steps w, w + N, ...), so every worker of a
rank needs samples from the same shards. The first process to need a piece
downloads it whole (one GET) and the others read the finished file by offset
(``pieces.py``). So each shard crosses the network once per rank per epoch
whatever ``num_workers`` is, and once per job when ranks read disjoint
shards (the shard-affine plan).

Bounds: disk holds the rank's pieces of the current window plus the
prefetched ones (``prefetch_shards`` / ``prefetch_bytes`` ahead, per worker:
``prefetch.py``); a piece is deleted when every worker of the rank that
reads it in a window is done with it. A pass that stops early (a loop that
breaks) releases what it held when its reader closes, and deletes only the
files nobody holds, so a live worker's files stay. Memory holds one
``READ_CHUNK`` (1 MiB) per download thread; samples are read with ``pread``,
so resident memory does not grow with the number of shards.

The disk is the machine's, not the sample's (``disk.py``): prefetch starts a
download only while the disk has room for it and as much again; short of
that it stops until the reader moves on, and the reader downloads what it
needs itself, first deleting this process's own prefetched pieces it has not
reached yet. Only a piece that still does not fit is a ``CacheError``.

This module wires the three jobs: the piece store (``pieces.py``), the
prefetch queue (``prefetch.py``) and the disk-space policy (``disk.py``).

Stream: shard byte ranges on node-local disk, shared by the rank's processes."""

from __future__ import annotations

import os
import threading

from ...core.redact import scrub_url
from ..errors import CacheError, ShardError
from .disk import DiskSpace
from .objects import IOStats
from .pieces import PieceStore, ShardRef
from .prefetch import PrefetchQueue
from .retry import RetryPolicy


class ShardCache:
    """Whole-piece downloads into ``directory``, coordinated across processes
    by file locks, with a per-process prefetch queue.

    prefetch_shards / prefetch_bytes: at most this many pieces (bytes, if
    sizes are known) downloaded or downloading ahead of the consumer, per
    process. threads: parallel background downloads per process. peers: the
    processes sharing ``directory`` (the rank's DataLoader workers); with
    more than one, a reader short of disk space waits up to ``disk.SPACE_WAIT``
    seconds for the others to free some before it raises ``CacheError``.
    """

    def __init__(self, directory: str, storage_options: dict | None = None, *, retry: RetryPolicy | None = None,
                 prefetch_shards: int = 4, prefetch_bytes: int | None = None, threads: int = 2,
                 stats: IOStats | None = None, peers: int = 1):
        self.directory = directory
        self.storage_options = storage_options
        self.retry = retry or RetryPolicy()
        self.stats = stats or IOStats()
        self.space = DiskSpace(directory, peers)
        # one lock for the holds and the queue: release() updates both together
        lock = threading.RLock()
        self.store = PieceStore(directory, storage_options, self.retry, self.stats, self.space, lock)
        self.store.make_room = self._make_room
        self.prefetch = PrefetchQueue(self._background, prefetch_shards, prefetch_bytes, threads, lock)
        self._lock = lock
        self._failed: dict[ShardRef, ShardError] = {}
        self.sidecars: set[ShardRef] = set()  # sidecar copies this process read (released at the epoch's end)

    def key(self, ref: ShardRef) -> str:
        return self.store.key(ref)

    def path(self, ref: ShardRef) -> str:
        return self.store.path(ref)

    def fetch(self, ref: ShardRef, block: bool = True, *, hold: bool = True, background: bool = False) -> str | None:
        """The piece's path once it is in the cache (``PieceStore.fetch``)."""
        return self.store.fetch(ref, block, hold=hold, background=background)

    def schedule(self, refs: list[ShardRef]) -> None:
        """The pieces this process will read next, in need order (``PrefetchQueue.schedule``)."""
        self.prefetch.schedule(refs)

    def _background(self, ref: ShardRef) -> str | Exception | None:
        try:
            # not held: until the reader takes it, another worker short of disk space may delete it
            # (the reader then downloads it again), so prefetch can never wedge a rank's workers
            return self.store.fetch(ref, block=False, hold=False, background=True)
        except (ShardError, CacheError) as exc:
            return exc  # handed to the consumer by get()
        except OSError as exc:  # the cache's own files
            return self.space.error(exc, "prefetch", ref.url, max(ref.nbytes, 0))
        except Exception as exc:  # never let a prefetch thread die silently
            return ShardError(f"prefetching shard {scrub_url(ref.url)} failed: {exc!r}")

    def _make_room(self, want: float, must: int) -> int | None:
        """Delete this process's prefetched pieces the reader has not reached,
        furthest first, until ``want`` bytes are free; then, with peers, wait
        for ``must``. Returns the bytes free."""
        free = self.space.free()
        for r in self.prefetch.victims():
            if free is None or free >= want:
                break
            with self._lock:
                self.prefetch.unqueue(r)
            self.store.discard(r)
            free = self.space.free()
        return self.space.wait_for_room(free, want, must, self.store.sweep)

    def get(self, ref: ShardRef) -> str:
        """Path of the whole piece in the cache (held), waiting for (or
        doing) its download; raises ShardError (again, for every sample of a
        failed piece) or CacheError."""
        if ref in self._failed:
            raise self._failed[ref]
        fut = self.prefetch.take(ref)
        result = fut.result() if fut is not None else None
        try:
            if isinstance(result, Exception):
                raise result
            return self.path(ref) if self.store.held(ref) is not None else self.store.fetch(ref)
        except ShardError as exc:
            self._failed[ref] = exc
            raise

    def open(self, ref: ShardRef) -> int:
        """A read-only descriptor of the piece (``get``), owned by the cache until ``release``."""
        self.get(ref)
        with self._lock:
            return self.store.holds[ref]

    def release(self, ref: ShardRef, tag: str, consumers: int) -> None:
        """This process is done with ``ref`` for the window ``tag``; the last
        of its ``consumers`` deletes the file."""
        with self._lock:
            self.prefetch.forget(ref)
            fd = self.store.holds.pop(ref, None)
        if fd is not None:
            os.close(fd)
        self._failed.pop(ref, None)
        self.store.release(ref, tag, consumers)

    def discard(self, ref: ShardRef, tags: tuple[str, ...] = ()) -> bool:
        """Delete the piece's files unless another process holds it (``PieceStore.discard``)."""
        return self.store.discard(ref, tags)

    def close(self, discard: list[tuple[ShardRef, tuple[str, ...]]] = ()) -> None:
        """Stop prefetching (a download under way stops at its next write)
        and delete what this process fetched and still holds, and the pieces
        ``discard`` names (with their counters' tags), except where another
        process holds them."""
        self.store.closed = True
        prefetched = self.prefetch.stop()
        with self._lock:
            todo = dict.fromkeys([*prefetched, *self.store.holds], ())
            holds, self.store.holds = list(self.store.holds.values()), {}
        for fd in holds:  # first: a lock this process holds would keep its own discard out
            os.close(fd)
        for ref, tags in discard:
            todo[ref] = todo.get(ref, ()) + tuple(tags)
        for ref, tags in todo.items():
            self.discard(ref, tags)
