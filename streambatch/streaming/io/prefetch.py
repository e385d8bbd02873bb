"""The prefetch queue of one process: the pieces it will read next, in need
order, downloaded in background threads at most ``prefetch_shards`` pieces
(``prefetch_bytes`` bytes) ahead of the reader.

The queue is a list with a cursor to the first piece not yet considered, and
the pieces submitted but not yet taken are kept with their bytes as running
counters: a call costs O(pieces it submits), not O(queue) (a window's pieces:
thousands with tiny shards). A prefetch that finds no room on disk is
*deferred* (``pieces.DEFERRED``): it is forgotten, the cursor moves back to
it, and no prefetch starts until the reader takes or releases a piece
(``starved``), so prefetch never competes with the reader for the last bytes.

Stream: background downloads of the pieces a process needs next, handed over by ``take``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from .pieces import DEFERRED, ShardRef


class PrefetchQueue:
    """Background downloads ahead of one reader.

    download(ref) runs in a pool thread and returns the piece's path,
    ``DEFERRED`` (no room), None (another process is downloading it) or the
    exception the reader gets. lock: shared with the piece store (re-entrant:
    a future that is already done runs its callback, which takes the lock,
    inside ``_top_up``, which holds it).
    """

    def __init__(self, download: Callable[[ShardRef], object], prefetch_shards: int, prefetch_bytes: int | None,
                 threads: int, lock: threading.RLock):
        self.prefetch_shards = prefetch_shards
        self.prefetch_bytes = prefetch_bytes
        self._download = download
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="streambatch-prefetch")
        self._lock = lock
        self._queue: list[ShardRef] = []
        self._index: dict[ShardRef, int] = {}
        self._cursor = 0
        self._ahead: dict[ShardRef, int] = {}
        self._ahead_bytes = 0
        self._starved = False  # a prefetch found no room: start none until the reader takes or releases one
        self._futures: dict[ShardRef, Future] = {}
        self._taken: set[ShardRef] = set()
        self._closed = False

    def schedule(self, refs: list[ShardRef]) -> None:
        """The pieces this process will read next, in the order it needs
        them (the rest of this window, then the next). Replaces the previous
        queue and starts background downloads within the prefetch bound."""
        with self._lock:
            self._queue = [r for r in refs if r not in self._taken]
            self._index = {}
            for i, r in enumerate(self._queue):
                self._index.setdefault(r, i)
            self._cursor = 0
            self._top_up()

    def _top_up(self) -> None:
        # caller holds self._lock; the cursor only moves on, except to give back a deferred prefetch
        q = self._queue
        while (not self._closed and not self._starved and len(self._ahead) < self.prefetch_shards
               and self._cursor < len(q)):
            ref = q[self._cursor]
            if ref in self._futures or ref in self._taken:
                self._cursor += 1
                continue
            if self.prefetch_bytes is not None and self._ahead and self._ahead_bytes + ref.nbytes > self.prefetch_bytes:
                break
            self._cursor += 1
            fut = self._pool.submit(self._download, ref)
            self._futures[ref] = fut
            self._ahead[ref] = ref.nbytes
            self._ahead_bytes += ref.nbytes
            fut.add_done_callback(lambda f, r=ref: self._after(r, f))

    def _drop_ahead(self, ref: ShardRef) -> None:
        # caller holds self._lock
        n = self._ahead.pop(ref, None)
        if n is not None:
            self._ahead_bytes -= n

    def unqueue(self, ref: ShardRef) -> None:
        """Forget a prefetch (deferred, or deleted to make room): it is
        prefetched again once there is room. Caller holds the lock."""
        self._futures.pop(ref, None)
        self._drop_ahead(ref)
        i = self._index.get(ref)
        if i is not None and i < self._cursor:
            self._cursor = i
        self._starved = True

    def _after(self, ref: ShardRef, fut: Future) -> None:
        with self._lock:
            if not fut.cancelled() and fut.result() is DEFERRED and self._futures.get(ref) is fut:
                self.unqueue(ref)
            self._top_up()

    def take(self, ref: ShardRef) -> Future | None:
        """The reader needs ``ref`` now: its prefetch (to wait for), or None
        if none was started; the queue moves on by one."""
        with self._lock:
            self._taken.add(ref)
            self._drop_ahead(ref)
            self._starved = False
            fut = self._futures.get(ref)
            self._top_up()
        return fut

    def victims(self) -> list[ShardRef]:
        """Finished prefetches the reader has not taken, furthest in need order first."""
        with self._lock:
            end = len(self._queue)
            return sorted((r for r, f in self._futures.items() if r in self._ahead and f.done()),
                          key=lambda r: self._index.get(r, end), reverse=True)

    def forget(self, ref: ShardRef) -> None:
        """The reader is done with ``ref``: it frees its slot. Caller holds the lock."""
        self._taken.discard(ref)
        self._futures.pop(ref, None)
        self._drop_ahead(ref)
        self._starved = False

    def stop(self) -> list[ShardRef]:
        """Start no more downloads and wait for those under way (each stops
        at its next write once the store is closed); returns every piece
        prefetched and not forgotten."""
        with self._lock:
            self._closed = True
            self._queue, self._index, self._cursor = [], {}, 0
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            refs = list(self._futures)
            self._futures.clear()
            self._ahead.clear()
            self._ahead_bytes = 0
        return refs
